"""`knowledge kb ...`: ask the knowledge base (`retrieve`, `answer`: its published, citable
evidence) and manage it (topics, revisions, sources, review, processing, releases, tags,
templates, feedback, policy) on a running service.

Every write names the version it expects (`--expected-version`, shown by the `show` and
`list` commands) and publish, rollback and offline the release they replace
(`--expected-release`); a stale one is refused and nothing changes. The organisation is
the token's. Retrieve and answer need `kb.read` (docs/kb-retrieve.md), the management
commands another `kb.*` capability (docs/kb.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import betterproto2
import click
from knowledge_sdk import types as v1
from knowledge_sdk import upload_file
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from knowledge_server.cli.common import (
    client,
    emit_json,
    err_console,
    fail,
    handle_errors,
)
from knowledge_server.plain import printable

EXPECTED = click.option(
    "--expected-version",
    type=int,
    required=True,
    help="The version you read (optimistic locking: a stale one is refused, nothing changes).",
)
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _print(msg: betterproto2.Message, as_json: bool, line: str) -> None:
    if as_json:
        emit_json(msg)
    else:
        # Titles, labels and answers are the knowledge base's text: escapes are shown.
        click.echo(printable(line, lines=True))


def _rev_line(r: v1.KbRevision | None) -> str:
    if r is None:
        return "-"
    tags = ",".join(r.tags) or "-"
    extra = f" returned: {r.return_reason}" if r.return_reason else ""
    extra += f" failure: {r.failure}" if r.failure else ""
    return (
        f"{r.id}  {r.state:<11} v{r.version}  label={r.version_label}  tags={tags}"
        f"  chunks={r.chunk_count}{extra}"
    )


def _task_line(t: v1.KbTask | None) -> str:
    if t is None:
        return "-"
    err = f"  error={t.error_category}: {t.error_message}" if t.error_category else ""
    if t.secrets_redacted:
        err = f"  secrets_redacted={t.secrets_redacted}{err}"
    return (
        f"{t.id}  {t.kind} {t.state} v{t.version}  step={t.step} {t.done}/{t.total}"
        f"  chunks={t.chunks}  attempts={t.attempts}{err}"
    )


@click.group()
def kb() -> None:
    """Ask the knowledge base (retrieve, answer: kb.read) and manage it: topics, revisions
    from draft to published, tags, templates, feedback (kb.edit, kb.review, kb.publish or
    kb.admin).

    \b
    Ask:               kb retrieve "how long do refunds take?" --any-tag refund
                       kb answer "how long do refunds take?" --template CUSTOMER_SERVICE
    A revision's way:  revision create -> source upload / faq put -> revision submit
                       -> revision approve -> revision process (progress bar)
                       -> revision publish; later topic rollback / topic offline.
    """


# -- asking: retrieve and answer -------------------------------------------------------------

NO_EVIDENCE = "NO_EVIDENCE"


def _ask_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The request fields Retrieve and Answer share, plus the trace id and --json."""
    for option in reversed(
        (
            click.argument("query"),
            click.option(
                "--all-tag",
                "all_tags",
                multiple=True,
                help="Tag code every source must carry (repeatable; active tags only).",
            ),
            click.option(
                "--any-tag",
                "any_tags",
                multiple=True,
                help="Tag code of which a source must carry one (repeatable; AND with --all-tag).",
            ),
            click.option(
                "--top-k",
                type=click.IntRange(0),
                default=0,
                help="Sources wanted (0 = the service's default; above its maximum is refused).",
            ),
            click.option(
                "--trace-id",
                default="",
                help="Trace id sent as x-trace-id (default: the service makes one up).",
            ),
            JSON,
        )
    ):
        fn = option(fn)
    return fn


def _quoted(text: str, indent: str = "    ") -> list[str]:
    """Published or generated text, quoted line by line: data, never instructions."""
    return [f"{indent}> {printable(line)}".rstrip() for line in (text.splitlines() or [""])]


def _source_lines(n: int, ev: v1.KbEvidence) -> list[str]:
    return [
        f"[{n}] {printable(' '.join(ev.citation.split()))}  score={ev.score:.3f}",
        f"    knowledge={ev.knowledge_id}  revision={ev.revision_id}  chunk={ev.chunk_id}",
        *_quoted(ev.content),
    ]


def _trace_line(trace_id: str, t: v1.RetrievalTrace | None) -> str:
    if t is None:
        return f"trace {trace_id}"
    return (
        f"trace {trace_id}: score {t.score_kind or '-'} (minimum {t.min_score:g}),"
        f" {t.candidates} candidates, {t.below_min_score} below the minimum; dropped"
        f" {t.dropped_old_revision} old revision, {t.dropped_other_organisation} other"
        f" organisation, {t.dropped_uncitable} uncitable"
    )


@kb.command("retrieve")
@_ask_options
@click.pass_context
@handle_errors
def retrieve(
    ctx: click.Context,
    query: str,
    all_tags: tuple[str, ...],
    any_tags: tuple[str, ...],
    top_k: int,
    trace_id: str,
    as_json: bool,
) -> None:
    """The published, citable evidence for QUERY in your organisation (kb.read).

    Each source shows its citation, score and ids, then its text quoted. No evidence
    is an answer (NO_EVIDENCE, exit code 0); a dependency of the service that is down
    or too slow is exit code 4 with the trace id."""
    with client(ctx) as kc:
        resp = kc.kb_retrieve(
            query,
            all_tag_codes=list(all_tags),
            any_tag_codes=list(any_tags),
            top_k=top_k,
            trace_id=trace_id,
        )
    if resp.answerable:
        lines = [f"{len(resp.sources)} source(s); quoted text is published data:"]
        for n, ev in enumerate(resp.sources, 1):
            lines += _source_lines(n, ev)
    else:
        lines = [f"{resp.reason_code or NO_EVIDENCE}: no published evidence passed the checks"]
    lines.append(_trace_line(resp.trace_id, resp.trace))
    _print(resp, as_json, "\n".join(lines))


@kb.command("answer")
@_ask_options
@click.option(
    "--template",
    "template_code",
    default="",
    help="Code of an ACTIVE answer template of your organisation (default: DEFAULT).",
)
@click.pass_context
@handle_errors
def answer(
    ctx: click.Context,
    query: str,
    all_tags: tuple[str, ...],
    any_tags: tuple[str, ...],
    top_k: int,
    trace_id: str,
    as_json: bool,
    template_code: str,
) -> None:
    """An answer to QUERY written by the service's chat model from the published
    evidence, with the sources its [n] markers cite (kb.read).

    The answer and each source's text are shown quoted. Without evidence the model is
    not called: NO_EVIDENCE and the configured reply (exit code 0). A dependency that
    is down or too slow is exit code 4 with the trace id."""
    with client(ctx) as kc:
        resp = kc.kb_answer(
            query,
            all_tag_codes=list(all_tags),
            any_tag_codes=list(any_tags),
            top_k=top_k,
            template_code=template_code,
            trace_id=trace_id,
        )
    if resp.answerable:
        check = resp.citation_check
        status = check.status if check else "-"
        cited = ", ".join(f"[{n}]" for n in check.cited) if check else ""
        removed = ", ".join(f"[{n}]" for n in check.removed) if check else ""
        lines = ["answer (model output, quoted):", *_quoted(resp.answer, "  ")]
        lines.append(
            f"citation check: {status}"
            + (f"; cites {cited}" if cited else "")
            + (f"; removed {removed}" if removed else "")
        )
        lines.append(f"template {resp.template_code}  model {resp.model_ms} ms")
        lines.append(f"{len(resp.sources)} source(s); quoted text is published data:")
        for n, ev in enumerate(resp.sources, 1):
            lines += _source_lines(n, ev)
    else:
        lines = [
            f"{resp.reason_code or NO_EVIDENCE}: no published evidence passed the checks;"
            " the model was not called. Reply:",
            *_quoted(resp.answer, "  "),
        ]
    lines.append(_trace_line(resp.trace_id, resp.trace))
    _print(resp, as_json, "\n".join(lines))


# -- topics ------------------------------------------------------------------------------


@kb.group()
def topic() -> None:
    """Knowledge topics (`knowledge_key` unique in the organisation) and their releases."""


@topic.command("create")
@click.argument("knowledge_key")
@click.option("--title", required=True, help="Title of the topic (the chunks' title).")
@JSON
@click.pass_context
@handle_errors
def topic_create(ctx: click.Context, knowledge_key: str, title: str, as_json: bool) -> None:
    """Create a topic with KNOWLEDGE_KEY."""
    with client(ctx) as kc:
        resp = kc.kb_create_topic(knowledge_key, title)
    t = resp.topic
    _print(resp, as_json, f"{t.id}  {t.knowledge_key}  v{t.version}" if t else "-")


@topic.command("list")
@click.option("--after", default="", help="Start after this knowledge_key (paging).")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, help="Most topics.")
@JSON
@click.pass_context
@handle_errors
def topic_list(ctx: click.Context, after: str, limit: int, as_json: bool) -> None:
    """List the organisation's topics with their current release."""
    with client(ctx) as kc:
        resp = kc.kb_list_topics(after=after, limit=limit)
    lines = [
        f"{t.id}  {t.knowledge_key}  release={t.release_revision_id or '-'}  {t.title}"
        for t in resp.topics
    ]
    _print(resp, as_json, "\n".join(lines) or "no topics")


@topic.command("show")
@click.argument("topic_id")
@JSON
@click.pass_context
@handle_errors
def topic_show(ctx: click.Context, topic_id: str, as_json: bool) -> None:
    """Show a topic, its revisions and its release history."""
    with client(ctx) as kc:
        resp = kc.kb_get_topic(topic_id)
    t = resp.topic
    lines = [f"{t.id}  {t.knowledge_key}  release={t.release_revision_id or '-'}"] if t else []
    lines += ["  " + _rev_line(r) for r in resp.revisions]
    lines += [
        f"  {h.at}  {h.action}  {h.previous_revision_id or '-'} -> {h.revision_id or '-'}  by {h.principal}"
        for h in resp.history
    ]
    _print(resp, as_json, "\n".join(lines))


@topic.command("rollback")
@click.argument("topic_id")
@click.option(
    "--expected-release", required=True, help="The topic's current release (revision id)."
)
@JSON
@click.pass_context
@handle_errors
def topic_rollback(ctx: click.Context, topic_id: str, expected_release: str, as_json: bool) -> None:
    """Restore the release the current one replaced (kb.publish)."""
    with client(ctx) as kc:
        resp = kc.kb_rollback(topic_id, expected_release)
    r = resp.release
    _print(resp, as_json, f"{r.previous_revision_id} -> {r.revision_id}" if r else "-")


@topic.command("offline")
@click.argument("topic_id")
@click.option(
    "--expected-release", required=True, help="The topic's current release (revision id)."
)
@JSON
@click.pass_context
@handle_errors
def topic_offline(ctx: click.Context, topic_id: str, expected_release: str, as_json: bool) -> None:
    """Take the topic's release offline: nothing of it is visible (kb.publish)."""
    with client(ctx) as kc:
        resp = kc.kb_offline(topic_id, expected_release)
    r = resp.release
    _print(resp, as_json, f"{r.previous_revision_id} -> offline" if r else "-")


# -- revisions -----------------------------------------------------------------------------


@kb.group()
def revision() -> None:
    """Revisions: DRAFT -> REVIEWING -> APPROVED -> PROCESSING -> PROCESSED -> PUBLISHED."""


@revision.command("create")
@click.argument("topic_id")
@click.option("--label", "version_label", required=True, help="Version label, e.g. 3.0.")
@click.option("--based-on", default="", help="Copy this revision's sources and tags.")
@JSON
@click.pass_context
@handle_errors
def revision_create(
    ctx: click.Context, topic_id: str, version_label: str, based_on: str, as_json: bool
) -> None:
    """Create a DRAFT revision of TOPIC_ID."""
    with client(ctx) as kc:
        resp = kc.kb_create_revision(topic_id, version_label, based_on=based_on)
    _print(resp, as_json, _rev_line(resp.revision))


@revision.command("show")
@click.argument("revision_id")
@JSON
@click.pass_context
@handle_errors
def revision_show(ctx: click.Context, revision_id: str, as_json: bool) -> None:
    """Show a revision with its sources and tasks."""
    with client(ctx) as kc:
        resp = kc.kb_get_revision(revision_id)
    lines = [_rev_line(resp.revision)]
    for s in resp.sources:
        what = f"{s.file_name} ({s.size} bytes)" if s.kind == "file" else f"FAQ: {s.question[:60]}"
        lines.append(f"  source {s.id}  #{s.ordinal}  {what}")
    lines += ["  task " + _task_line(t) for t in resp.tasks]
    _print(resp, as_json, "\n".join(lines))


@revision.command("update")
@click.argument("revision_id")
@EXPECTED
@click.option("--label", "version_label", default=None, help="New version label.")
@click.option("--tag", "tags", multiple=True, help="Tag code (repeatable): replaces the tags.")
@click.option("--clear-tags", is_flag=True, help="Remove every tag.")
@JSON
@click.pass_context
@handle_errors
def revision_update(
    ctx: click.Context,
    revision_id: str,
    expected_version: int,
    version_label: str | None,
    tags: tuple[str, ...],
    clear_tags: bool,
    as_json: bool,
) -> None:
    """Change a DRAFT's label or tags (tag codes of active tags)."""
    new_tags = list(tags) if tags or clear_tags else None
    with client(ctx) as kc:
        resp = kc.kb_update_revision(
            revision_id, expected_version, version_label=version_label, tags=new_tags
        )
    _print(resp, as_json, _rev_line(resp.revision))


def _review(name: str, call: Callable[..., Any], help_text: str) -> Callable[..., None]:
    @revision.command(name, help=help_text)
    @click.argument("revision_id")
    @EXPECTED
    @JSON
    @click.pass_context
    @handle_errors
    def command(ctx: click.Context, revision_id: str, expected_version: int, as_json: bool) -> None:
        with client(ctx) as kc:
            resp = call(kc, revision_id, expected_version)
        _print(resp, as_json, _rev_line(resp.revision))

    return command


_review(
    "submit",
    lambda kc, r, v: kc.kb_submit(r, v),
    "Submit a DRAFT with a source for review (kb.edit).",
)
_review(
    "approve",
    lambda kc, r, v: kc.kb_approve(r, v),
    "Approve a revision under review (kb.review; not the submitter, unless the policy allows).",
)


@revision.command("return")
@click.argument("revision_id")
@EXPECTED
@click.option("--reason", required=True, help="Why it goes back to DRAFT (recorded).")
@JSON
@click.pass_context
@handle_errors
def revision_return(
    ctx: click.Context, revision_id: str, expected_version: int, reason: str, as_json: bool
) -> None:
    """Return a revision under review to DRAFT with a reason (kb.review)."""
    with client(ctx) as kc:
        resp = kc.kb_return(revision_id, expected_version, reason)
    _print(resp, as_json, _rev_line(resp.revision))


def _watch(kc: Any, task_id: str, as_json: bool) -> v1.KbTask | None:
    """Follow a task with a progress bar (stderr) until it ends; returns its last state."""
    last: v1.KbTask | None = None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[extra]}"),
        console=err_console,
        disable=as_json or not err_console.is_terminal,
    ) as bar:
        shown = bar.add_task("queued", total=None, extra="")
        events: Iterable[v1.WatchTaskResponse] = kc.kb_watch_task(task_id)
        for ev in events:
            t = ev.task
            if t is None:
                continue
            last = t
            bar.update(
                shown,
                description=f"{t.state.lower()}: {t.step or '-'}",
                completed=t.done,
                total=t.total or None,
                extra=f"chunks={t.chunks}",
            )
    return last


@revision.command("process")
@click.argument("revision_id")
@EXPECTED
@click.option(
    "--key", "idempotency_key", default="", help="Idempotency key (default: revision and version)."
)
@click.option("--no-watch", is_flag=True, help="Queue the task and return at once.")
@JSON
@click.pass_context
@handle_errors
def revision_process(
    ctx: click.Context,
    revision_id: str,
    expected_version: int,
    idempotency_key: str,
    no_watch: bool,
    as_json: bool,
) -> None:
    """Queue PROCESS for an APPROVED revision and follow it with a progress bar (kb.publish).

    Exit code 1 when the task fails (its error category is printed)."""
    with client(ctx) as kc:
        resp = kc.kb_process(revision_id, expected_version, idempotency_key=idempotency_key)
        task = resp.task
        if task is None:
            fail("the service answered without a task")
            return
        if not as_json and not resp.created:
            err_console.print(f"task {task.id} was queued before with this key; following it")
        if no_watch:
            _print(resp, as_json, _task_line(task))
            return
        last = _watch(kc, task.id, as_json)
    if as_json:
        emit_json(last or task)
    else:
        click.echo(printable(_task_line(last or task)))
    if last is not None and last.state != "SUCCEEDED":
        raise SystemExit(1)


@revision.command("publish")
@click.argument("revision_id")
@EXPECTED
@click.option(
    "--expected-release", default="", help="The topic's current release (empty: none yet)."
)
@JSON
@click.pass_context
@handle_errors
def revision_publish(
    ctx: click.Context,
    revision_id: str,
    expected_version: int,
    expected_release: str,
    as_json: bool,
) -> None:
    """Make a PROCESSED revision its topic's visible release (kb.publish)."""
    with client(ctx) as kc:
        resp = kc.kb_publish(revision_id, expected_version, expected_release=expected_release)
    r = resp.release
    _print(resp, as_json, f"{r.previous_revision_id or '-'} -> {r.revision_id}" if r else "-")


# -- sources -------------------------------------------------------------------------------------


@kb.group()
def source() -> None:
    """Source files of a DRAFT (Markdown, plain text)."""


@source.command("upload")
@click.argument("revision_id")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@EXPECTED
@click.option("--media-type", default="", help="Media type (default: from the file name).")
@JSON
@click.pass_context
@handle_errors
def source_upload(
    ctx: click.Context,
    revision_id: str,
    path: Path,
    expected_version: int,
    media_type: str,
    as_json: bool,
) -> None:
    """Upload the file PATH as a source of the DRAFT REVISION_ID (in 1 MiB pieces)."""
    with client(ctx) as kc:
        resp = upload_file(kc, revision_id, expected_version, path, media_type=media_type)
    s = resp.source
    _print(resp, as_json, f"{s.id}  #{s.ordinal}  {s.file_name}  {s.sha256[:12]}" if s else "-")


@source.command("remove")
@click.argument("revision_id")
@click.argument("source_id")
@EXPECTED
@JSON
@click.pass_context
@handle_errors
def source_remove(
    ctx: click.Context, revision_id: str, source_id: str, expected_version: int, as_json: bool
) -> None:
    """Remove a source (file or FAQ entry) from a DRAFT."""
    with client(ctx) as kc:
        resp = kc.kb_remove_source(revision_id, expected_version, source_id)
    _print(resp, as_json, _rev_line(resp.revision))


@kb.group()
def faq() -> None:
    """FAQ entries of a DRAFT (question and answer stay one chunk)."""


@faq.command("put")
@click.argument("revision_id")
@EXPECTED
@click.option("--question", required=True, help="The question.")
@click.option("--answer", required=True, help="The answer.")
@click.option("--replace", "source_id", default="", help="The FAQ entry to replace (source id).")
@JSON
@click.pass_context
@handle_errors
def faq_put(
    ctx: click.Context,
    revision_id: str,
    expected_version: int,
    question: str,
    answer: str,
    source_id: str,
    as_json: bool,
) -> None:
    """Add an FAQ entry to a DRAFT, or replace one."""
    with client(ctx) as kc:
        resp = kc.kb_put_faq(revision_id, expected_version, question, answer, source_id=source_id)
    _print(resp, as_json, _rev_line(resp.revision))


# -- tasks ---------------------------------------------------------------------------------------


@kb.group()
def task() -> None:
    """PROCESS tasks: follow, retry a failed one, cancel one not started (kb.publish)."""


@task.command("watch")
@click.argument("task_id")
@JSON
@click.pass_context
@handle_errors
def task_watch(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Follow a task with a progress bar until it ends (exit code 1 unless it succeeded)."""
    with client(ctx) as kc:
        last = _watch(kc, task_id, as_json)
    if last is None:
        fail("the task stream ended without the task")
        return
    _print(last, as_json, _task_line(last))
    if last.state != "SUCCEEDED":
        raise SystemExit(1)


@task.command("retry")
@click.argument("task_id")
@EXPECTED
@JSON
@click.pass_context
@handle_errors
def task_retry(ctx: click.Context, task_id: str, expected_version: int, as_json: bool) -> None:
    """Queue a FAILED task again."""
    with client(ctx) as kc:
        resp = kc.kb_retry_task(task_id, expected_version)
    _print(resp, as_json, _task_line(resp.task))


@task.command("cancel")
@click.argument("task_id")
@EXPECTED
@JSON
@click.pass_context
@handle_errors
def task_cancel(ctx: click.Context, task_id: str, expected_version: int, as_json: bool) -> None:
    """Cancel a task that has not started."""
    with client(ctx) as kc:
        resp = kc.kb_cancel_task(task_id, expected_version)
    _print(resp, as_json, _task_line(resp.task))


@kb.command("reconcile")
@JSON
@click.pass_context
@handle_errors
def reconcile(ctx: click.Context, as_json: bool) -> None:
    """Compare the metadata with the retrieval index and repair the drift (kb.publish or
    kb.admin): drops chunks nobody needs, queues missing ones again, says what it fixed."""
    with client(ctx) as kc:
        resp = kc.kb_reconcile()
    lines = [f"checked {resp.checked} revisions"]
    lines += [f"  dropped {n} chunks of {rev}" for rev, n in sorted(resp.dropped.items())]
    lines += [f"  queued {t} to stage {rev} again" for rev, t in sorted(resp.requeued.items())]
    lines += [f"  {rev}: already queued" for rev in resp.already_queued]
    if len(lines) == 1:
        lines.append("  nothing to repair")
    _print(resp, as_json, "\n".join(lines))


# -- tags, templates, feedback, policy -------------------------------------------------------------


@kb.group()
def tag() -> None:
    """The organisation's tag dictionary (codes frozen at creation; kb.admin)."""


@tag.command("create")
@click.argument("tag_code")
@click.option("--name", "display_name", required=True, help="Display name.")
@click.option("--order", "sort_order", type=int, default=0, help="Order in lists.")
@JSON
@click.pass_context
@handle_errors
def tag_create(
    ctx: click.Context, tag_code: str, display_name: str, sort_order: int, as_json: bool
) -> None:
    """Create the tag TAG_CODE (a-z, 0-9, '_', '.', '-')."""
    with client(ctx) as kc:
        resp = kc.kb_create_tag(tag_code, display_name, sort_order=sort_order)
    t = resp.tag
    _print(resp, as_json, f"{t.tag_code}  v{t.version}  {t.display_name}" if t else "-")


@tag.command("update")
@click.argument("tag_code")
@EXPECTED
@click.option("--name", "display_name", default=None, help="New display name.")
@click.option("--order", "sort_order", type=int, default=None, help="New order.")
@click.option("--active/--inactive", default=None, help="(De)activate the tag.")
@JSON
@click.pass_context
@handle_errors
def tag_update(
    ctx: click.Context,
    tag_code: str,
    expected_version: int,
    display_name: str | None,
    sort_order: int | None,
    active: bool | None,
    as_json: bool,
) -> None:
    """Rename, reorder or (de)activate a tag; revisions keep the codes they recorded."""
    with client(ctx) as kc:
        resp = kc.kb_update_tag(
            tag_code,
            expected_version,
            display_name=display_name,
            sort_order=sort_order,
            active=active,
        )
    t = resp.tag
    _print(
        resp,
        as_json,
        f"{t.tag_code}  v{t.version}  {t.display_name}  active={t.active}" if t else "-",
    )


@tag.command("list")
@click.option("--all", "include_inactive", is_flag=True, help="Include deactivated tags.")
@JSON
@click.pass_context
@handle_errors
def tag_list(ctx: click.Context, include_inactive: bool, as_json: bool) -> None:
    """List the tag dictionary by order."""
    with client(ctx) as kc:
        resp = kc.kb_list_tags(include_inactive=include_inactive)
    lines = [
        f"{t.tag_code}  v{t.version}  order={t.sort_order}  {'active' if t.active else 'inactive'}  {t.display_name}"
        for t in resp.tags
    ]
    _print(resp, as_json, "\n".join(lines) or "no tags")


@kb.group()
def template() -> None:
    """Answer templates (DEFAULT plus named ones, ACTIVE or INACTIVE; kb.admin)."""


@template.command("put")
@click.argument("template_code")
@click.option("--body", required=True, help="Template text.")
@click.option(
    "--status", type=click.Choice(["ACTIVE", "INACTIVE"]), default="ACTIVE", help="Status."
)
@click.option("--expected-version", type=int, default=0, help="Its current version; 0 creates it.")
@JSON
@click.pass_context
@handle_errors
def template_put(
    ctx: click.Context,
    template_code: str,
    body: str,
    status: str,
    expected_version: int,
    as_json: bool,
) -> None:
    """Create or change the template TEMPLATE_CODE (A-Z, 0-9, '_')."""
    with client(ctx) as kc:
        resp = kc.kb_put_template(
            template_code, body, status=status, expected_version=expected_version
        )
    t = resp.template
    _print(resp, as_json, f"{t.template_code}  v{t.version}  {t.status}" if t else "-")


@template.command("list")
@JSON
@click.pass_context
@handle_errors
def template_list(ctx: click.Context, as_json: bool) -> None:
    """List the answer templates."""
    with client(ctx) as kc:
        resp = kc.kb_list_templates()
    lines = [f"{t.template_code}  v{t.version}  {t.status}" for t in resp.templates]
    _print(resp, as_json, "\n".join(lines) or "no templates")


@kb.group()
def feedback() -> None:
    """Feedback on topics; a feedback item can become a new draft (kb.edit)."""


@feedback.command("create")
@click.argument("topic_id")
@click.option("--body", required=True, help="What was reported.")
@click.option("--revision", "revision_id", default="", help="The revision it is about.")
@JSON
@click.pass_context
@handle_errors
def feedback_create(
    ctx: click.Context, topic_id: str, body: str, revision_id: str, as_json: bool
) -> None:
    """Record feedback on TOPIC_ID."""
    with client(ctx) as kc:
        resp = kc.kb_create_feedback(topic_id, body, revision_id=revision_id)
    f = resp.feedback
    _print(resp, as_json, f"{f.id}  {f.status}  v{f.version}" if f else "-")


@feedback.command("list")
@click.option(
    "--status",
    type=click.Choice(["OPEN", "RESOLVED", "DRAFTED"]),
    default=None,
    help="Only this status.",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=100, help="Most items.")
@JSON
@click.pass_context
@handle_errors
def feedback_list(ctx: click.Context, status: str | None, limit: int, as_json: bool) -> None:
    """List feedback items, newest first."""
    with client(ctx) as kc:
        resp = kc.kb_list_feedback(status=status or "", limit=limit)
    lines = [f"{f.id}  {f.status}  v{f.version}  topic={f.topic_id}" for f in resp.feedback]
    _print(resp, as_json, "\n".join(lines) or "no feedback")


@feedback.command("resolve")
@click.argument("feedback_id")
@EXPECTED
@click.option(
    "--draft", "create_draft", is_flag=True, help="Make a new DRAFT from the topic's release."
)
@click.option("--label", "version_label", default="", help="Version label of the draft.")
@JSON
@click.pass_context
@handle_errors
def feedback_resolve(
    ctx: click.Context,
    feedback_id: str,
    expected_version: int,
    create_draft: bool,
    version_label: str,
    as_json: bool,
) -> None:
    """Close a feedback item, optionally as a new draft."""
    with client(ctx) as kc:
        resp = kc.kb_resolve_feedback(
            feedback_id, expected_version, create_draft=create_draft, version_label=version_label
        )
    f = resp.feedback
    line = f"{f.id}  {f.status}" if f else "-"
    if resp.draft is not None and resp.draft.id:
        line += "\n" + _rev_line(resp.draft)
    _print(resp, as_json, line)


@kb.group()
def policy() -> None:
    """The organisation's knowledge-base policy (four-eyes review)."""


@policy.command("show")
@JSON
@click.pass_context
@handle_errors
def policy_show(ctx: click.Context, as_json: bool) -> None:
    """Show the policy."""
    with client(ctx) as kc:
        resp = kc.kb_get_policy()
    p = resp.policy
    _print(
        resp, as_json, f"allow_self_approval={p.allow_self_approval}  v{p.version}" if p else "-"
    )


@policy.command("set")
@click.option(
    "--allow-self-approval/--four-eyes",
    required=True,
    help="May a submitter approve their own revision.",
)
@click.option(
    "--expected-version", type=int, required=True, help="The policy's version (0 = never set)."
)
@JSON
@click.pass_context
@handle_errors
def policy_set(
    ctx: click.Context, allow_self_approval: bool, expected_version: int, as_json: bool
) -> None:
    """Change the policy (kb.admin)."""
    with client(ctx) as kc:
        resp = kc.kb_set_policy(allow_self_approval, expected_version)
    p = resp.policy
    _print(
        resp, as_json, f"allow_self_approval={p.allow_self_approval}  v{p.version}" if p else "-"
    )
