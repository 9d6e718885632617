"""`knowledge`: the command line for people and scripts.

Human tables by default, one JSON document on stdout with `--json`; logs and
progress go to stderr. Client commands talk to a running service (the address
`knowledge serve` recorded in the data directory, or --address / KNOWLEDGE_ADDRESS).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import math
import os
import stat
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from knowledge_licensing.cli import license_group
from knowledge_sdk.recorded import SERVE_LOCK, SERVER_FILE, recorded_address
from rich.markup import escape as markup_escape
from rich.table import Table
from rich.text import Text

from knowledge_server import __version__
from knowledge_server.auth import tokens_group
from knowledge_server.cli.audit import audit
from knowledge_server.cli.common import (
    clear_address,
    client,
    code_refs_text,
    emit_json,
    err_console,
    fail,
    handle_errors,
    out_console,
    record_address,
    run_stream,
)
from knowledge_server.cli.docgraph import docgraph
from knowledge_server.cli.kb import kb
from knowledge_server.cli.licence import install_command
from knowledge_server.cli.mcp import mcp_command
from knowledge_server.cli.memory import memory
from knowledge_server.cli.outbox import outbox
from knowledge_server.plain import printable


def _existing_paths(values: tuple[str, ...], option: str) -> tuple[str, ...]:
    """Paths that must exist, ``~`` expanded first (a shell leaves ``--sessions=~/logs``
    as written, and so do unit files and quoted paths)."""
    out = []
    for value in values:
        path = os.path.expanduser(value)
        if not os.path.exists(path):
            raise click.BadParameter(f"Path {value!r} does not exist.", param_hint=f"'{option}'")
        out.append(path)
    return tuple(out)


def _finite(value: float | None) -> float | None:
    """``--timeout``: NaN passes a range check (no comparison holds for it)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter("must be a number of seconds", param_hint="'--timeout'")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="KNOWLEDGE_DATA_DIR",
    help="Data directory (databases, tokens, licence). Env: KNOWLEDGE_DATA_DIR. "
    "Default: the user's data dir, e.g. ~/.local/share/knowledge-service.",
)
@click.option(
    "--address",
    envvar="KNOWLEDGE_ADDRESS",
    help="Service address HOST:PORT for client commands. "
    "Env: KNOWLEDGE_ADDRESS. Default: the address `knowledge serve` recorded, else 127.0.0.1:50151.",
)
@click.option(
    "--token",
    envvar="KNOWLEDGE_TOKEN",
    help="Bearer token for client commands. Env: KNOWLEDGE_TOKEN.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True, max=86_400),
    default=None,
    callback=lambda _ctx, _param, value: _finite(value),
    help="Deadline in seconds for client calls that are not streams (default 30; streams"
    " such as index and ingest run until they end).",
)
@click.pass_context
def main(
    ctx: click.Context,
    data_dir: Path | None,
    address: str | None,
    token: str | None,
    timeout: float | None,
) -> None:
    """Knowledge Service: evidence-first search over agent sessions, code and skills.

    \b
    Start the service:      knowledge serve
    Ask a question:         knowledge search "who fixed the MySQL access?"
    See what is indexed:    knowledge status
    """
    ctx.ensure_object(dict)
    ctx.obj.update(data_dir=data_dir, address=address, token=token, timeout=timeout)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def version(as_json: bool) -> None:
    """Print the version of the CLI, server and SDK."""
    import knowledge_sdk

    if as_json:
        emit_json({"knowledge_server": __version__, "knowledge_sdk": knowledge_sdk.__version__})
    else:
        click.echo(f"knowledge {__version__} (sdk {knowledge_sdk.__version__})")


@main.command()
@click.option(
    "--listen", help="HOST:PORT to listen on (port 0 picks a free port). Default 127.0.0.1:50151."
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KNOWLEDGE_CONFIG",
    help="TOML configuration file (see docs/configuration.md). Env: KNOWLEDGE_CONFIG.",
)
@click.option(
    "--workspace",
    "workspaces",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Workspace root to index for the code lane (repeatable; must be an existing directory). "
    "Default: the service's own source tree.",
)
@click.option(
    "--sessions",
    "session_paths",
    multiple=True,
    type=click.Path(),
    callback=lambda _ctx, _param, values: _existing_paths(values, "--sessions"),
    help="Session log file or folder to ingest (repeatable; must exist). Default: the standard "
    "harness locations, else the bundled example log.",
)
@click.option("--no-bootstrap", is_flag=True, help="Do not index or ingest at start.")
@click.option(
    "--licence",
    "licence_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Licence file (default: DATA_DIR/licence.json). Re-read on SIGHUP and when it changes.",
)
@click.option(
    "--auth",
    type=click.Choice(["auto", "on", "off"]),
    default=None,
    help="Bearer-token authentication: auto = off on loopback, required elsewhere.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Serving processes sharing the port, to use more cores (default 1). Env: KNOWLEDGE_WORKERS.",
)
@click.option(
    "--metrics-listen",
    default=None,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: on 127.0.0.1). "
    "Off by default. Env: KNOWLEDGE_METRICS_LISTEN.",
)
@click.option(
    "--retrieve-http-listen",
    default=None,
    help="Serve Retrieve / Answer as JSON over HTTP at http://HOST:PORT/knowledge/retrieve "
    "and /knowledge/answer (PORT alone: on 127.0.0.1). Off by default. "
    "Env: KNOWLEDGE_RETRIEVE_HTTP_LISTEN.",
)
@click.option(
    "--tracing-otlp-endpoint",
    default=None,
    help="Export OpenTelemetry traces by OTLP/gRPC to this collector URL "
    "(e.g. http://127.0.0.1:4317). Off by default. Env: KNOWLEDGE_TRACING_OTLP_ENDPOINT.",
)
@click.pass_context
def serve(
    ctx: click.Context,
    listen: str | None,
    config_file: Path | None,
    workspaces: tuple[str, ...],
    session_paths: tuple[str, ...],
    no_bootstrap: bool,
    licence_file: Path | None,
    auth: str | None,
    workers: int | None,
    metrics_listen: str | None,
    retrieve_http_listen: str | None,
    tracing_otlp_endpoint: str | None,
) -> None:
    """Run the gRPC service until SIGTERM/SIGINT.

    Prints one line `listening on HOST:PORT` once it accepts calls (with no reader on
    standard output, it serves on and logs server.listening_line_lost). On first start it
    indexes the workspaces and ingests session logs in the background; lanes report
    KNOWLEDGE_INDEX_NOT_READY until their index exists.

    The address is recorded in DATA_DIR/server.json for the other commands, which
    follow it while this server runs (a file a killed one left is not followed). A
    port another process listens on already, or a data directory another `knowledge
    serve` has, is refused with one line and exit code 2, leaving that server and its
    server.json alone.
    """
    _fill_closed_standard_fds()
    # The server's runtime (stores, tree-sitter, numpy) is imported by `serve` alone, so
    # the client commands (search, status, ...) start without loading it.
    from knowledge_server.config import (
        ConfigError,
        check_data_dir,
        check_workspaces,
        load_config,
    )
    from knowledge_server.logs import configure_logging, get_logger
    from knowledge_server.runtime import (
        build_app,
        build_authenticator,
        own_source_tree,
        start_background,
    )
    from knowledge_server.server import check_port_free
    from knowledge_server.server import serve as run_server
    from knowledge_server.worker_main import run_worker

    overrides: dict[str, Any] = {
        "listen": listen,
        "data_dir": ctx.obj.get("data_dir"),
        "workspaces": list(workspaces) or None,
        "session_paths": list(session_paths) or None,
        "licence_file": licence_file,
        "auth": auth,
        "bootstrap": False if no_bootstrap else None,
        "workers": workers,
        "metrics_listen": metrics_listen,
        "retrieve_http_listen": retrieve_http_listen,
        "tracing_otlp_endpoint": tracing_otlp_endpoint,
    }
    try:
        cfg = load_config(config_file, overrides=overrides)
    except ConfigError as exc:
        fail(f"configuration: {exc}", 2)
        return
    configure_logging(cfg.log_format, cfg.log_level)
    if not cfg.workspaces:
        cfg = dataclasses.replace(cfg, workspaces=(own_source_tree(),))
    try:
        # Before anything is opened: a missing workspace or a busy port stops here (and
        # the server listening there keeps its stores and its DATA_DIR/server.json).
        check_workspaces(cfg)
        check_port_free(cfg.listen)  # first: a refused start creates no data directory
        check_data_dir(cfg)
        try:
            held = _hold_data_dir(cfg.data_dir)  # noqa: F841 - held until the process ends
        except DataDirTaken as exc:
            fail(f"configuration: {exc}", 2)
        app = build_app(cfg)
        authenticate = build_authenticator(cfg)
    except ConfigError as exc:
        fail(f"configuration: {exc}", 2)
        return

    class _Out:
        def write(self, text: str) -> int:
            if text.startswith("listening on "):
                try:  # first: standard output may be gone
                    record_address(cfg.data_dir, text.split()[-1])
                except OSError as exc:  # a full disk: clients need --address, the line still goes
                    get_logger("knowledge.server").error(
                        "server.address_not_recorded", error_type=type(exc).__name__
                    )
            if sys.stdout is None:  # started with standard output closed (`>&-`)
                return len(text)
            try:
                sys.stdout.write(text)
            except OSError:
                _stdout_gone()
                raise
            return len(text)

        def flush(self) -> None:
            if sys.stdout is None:
                return
            try:
                sys.stdout.flush()
            except OSError:
                _stdout_gone()
                raise

    try:
        asyncio.run(
            run_server(
                cfg,
                app=app,
                authenticate=authenticate,
                out=_Out(),
                on_started=start_background,
                worker_main=run_worker,
                # Not followed once the port is given up: work that runs on past the
                # stop (a document graph build) may keep this process alive a while.
                on_stopping=lambda: clear_address(cfg.data_dir),
            )
        )
    except ConfigError as exc:
        fail(f"configuration: {exc}", 2)
    except KeyboardInterrupt:
        pass
    finally:
        clear_address(cfg.data_dir)


def _fill_closed_standard_fds() -> None:
    """Standard input, output or error closed at start (`>&-`): the null device in its
    place, before anything is opened, or the first file opened (the serve lock, a store)
    became descriptor 1 and whatever writes there wrote into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _null_onto(fd)


def _stdout_gone() -> None:
    """Standard output's reader went away: later writes (and the flush at exit, which
    would print a traceback) go to the null device instead."""
    _null_onto(sys.stdout.fileno())


def _null_onto(fd: int) -> None:
    """The null device as descriptor ``fd`` (closed or not)."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:  # else it took the closed descriptor's number already
        os.dup2(null, fd)
        os.close(null)


# How long a starting server waits for the serve lock before it takes the directory for
# another server's: longer than any client's probe of it (knowledge_sdk.recorded).
SERVE_LOCK_PROBE_S = 1.0


def _hold_data_dir(data_dir: Path) -> int:
    """Take the data directory for this serving process (its workers share it), or raise
    DataDirTaken naming the one that has it: two servers on one data directory each ran a
    bootstrap, a task worker and a log watcher of their own, and the second one's exit
    removed the first one's server.json. A lock the kernel drops when its holder dies, so
    a killed server never leaves the directory taken."""
    path = data_dir.joinpath(*SERVE_LOCK)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Clients trust the lock only in a folder no other user may write: one an earlier
    # version made under a umask of 002 (a shared group's write bit) is made so.
    folder = path.parent.stat()
    if folder.st_uid == os.getuid() and folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        path.parent.chmod(stat.S_IMODE(folder.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # A client finding the recorded address probes the lock with a shared one, held for
    # a moment: waited out, never taken for another server.
    give_up = time.monotonic() + SERVE_LOCK_PROBE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() < give_up:
                time.sleep(0.02)
                continue
        else:
            # A server.json here now is a dead server's (its lock is this one's): removed
            # at once, or clients would follow it, with their token, to a port anyone may
            # hold, until this server records its own.
            with contextlib.suppress(FileNotFoundError):
                (data_dir / SERVER_FILE).unlink()
            return fd
        os.close(fd)
        recorded = recorded_address(data_dir.resolve())
        where = f" at {recorded}" if recorded else ""
        raise DataDirTaken(
            f"data_dir: {data_dir} is in use by another `knowledge serve`{where};"
            " stop it, or give this one another --data-dir"
        ) from None


class DataDirTaken(Exception):
    """Another serving process has the data directory."""


def _shown(text: str) -> str:
    """Text the service answered, inside rich markup: its markup escaped, and its
    unprintable characters written as escapes (``printable``)."""
    return markup_escape(printable(text))


def _one_line(text: str, width: int) -> str:
    text = printable(" ".join((text or "").split()))
    return text if len(text) <= width else text[: width - 1] + "…"


# What an empty lane's ``empty_reason`` means, per lane (docs/search.md, "Empty lanes").
_EMPTY_REASONS = {
    "no_match": "nothing matched",
    "not_requested": "not requested (--include)",
    "unavailable": "the source did not answer (see the errors)",
    "budget": "its items were removed to fit --max-tokens",
}
_EMPTY_BY_LANE = {
    ("episodes", "index_empty"): "no session logs have been ingested",
    ("episodes", "not_indexed"): "no sessions ingested in your workspaces",
    ("code", "index_empty"): "nothing indexed (no workspace, or no file gave a chunk)",
    ("code", "not_indexed"): "none of your workspaces is indexed",
    ("skills", "index_empty"): "no skills (the derived layer is not built, or no SKILL.md)",
    ("skills", "not_indexed"): "no skills in your workspaces",
}


def _empty_text(name: str, reason: str) -> str:
    said = _EMPTY_BY_LANE.get((name, reason)) or _EMPTY_REASONS.get(reason)
    return f"{reason}: {said}" if said else (reason or "no reason given")


def _lane_header(name: str, lane: Any, extra: str = "") -> None:
    """A lane's first line: revision, state and, when it is empty, why."""
    if lane.empty_reason == "not_requested":
        out_console.print(f"\n[bold]{name}[/]  not requested", highlight=False)
        return
    state = f"[yellow]degraded[/]: {_shown(lane.degradation_reason)}" if lane.degraded else "ok"
    if not lane.items:
        state += f"  [yellow]empty[/]: {_shown(_empty_text(name, lane.empty_reason))}"
    out_console.print(
        f"\n[bold]{name}[/]  rev={_shown(lane.index_rev or '-')}  {extra}{state}", highlight=False
    )


def _lanes_table(resp: Any) -> None:
    """Human rendering: one block per lane, one line per item with its address; an empty
    lane says why."""
    width = max(60, min(out_console.width, 160))
    r = resp.routing
    out_console.print(
        f"[bold]intent[/] {_shown(r.intent)} ({_shown(r.confidence_level)}) - {_shown(r.reason)}",
        highlight=False,
    )
    header = _lane_header

    ep = resp.lanes.episodes
    counts = (
        f"{ep.counts.sessions} sessions, {ep.counts.indexed_docs} events  " if ep.counts else ""
    )
    header("episodes", ep, counts)
    for it in ep.items:
        when = it.time.strftime("%Y-%m-%d %H:%M") if it.time else ""
        out_console.print(
            f"  [cyan]{_shown(it.id)}[/]  {_shown(it.event_type)}  {when}", highlight=False
        )
        if it.snippet:
            out_console.print(
                "    " + _one_line(it.snippet, width - 4), markup=False, highlight=False
            )
    code = resp.lanes.code
    fresh = "[yellow]STALE[/]  " if code.freshness and code.freshness.stale else ""
    header("code", code, f"capability={code.capability}  {fresh}")
    # Items of several workspaces may share a path: each then names its workspace.
    several = len({it.workspace for it in code.items}) > 1
    for it in code.items:
        sym = f"  in {it.workspace}" if several else ""
        sym += f"  {it.symbol}" if it.symbol else ""
        if it.match_kind:  # mode=docs|themes: how the document graph reached the chunk
            names = ", ".join(e.name for e in it.matched_entities[:3])
            sym += f"  {it.match_kind}" + (f": {names}" if names else "")
        why = _shown("[" + ", ".join(it.why) + "]")
        out_console.print(
            f"  [cyan]{_shown(it.path)}:{it.start_line}-{it.end_line}[/]{_shown(sym)}  {why}",
            highlight=False,
        )
        if it.snippet:
            out_console.print(
                "    " + _one_line(it.snippet, width - 4), markup=False, highlight=False
            )
    sk = resp.lanes.skills
    if sk is not None and (sk.items or sk.degraded or sk.index_rev or sk.empty_reason):
        header("skills", sk)
        for it in sk.items:
            out_console.print(
                f"  [cyan]{_shown(it.name)}[/]  uses={it.uses}"
                f"  {_shown(_one_line(it.description, width - 30))}",
                highlight=False,
            )
    if resp.actors:
        out_console.print("\n[bold]actors[/]")
        for a in resp.actors:
            d = a.dispatch
            avail = f"{d.mode}, {'available' if d.available else 'not available'}" if d else "none"
            out_console.print(
                f"  [cyan]{_shown(a.actor_id)}[/]  {_shown(a.kind)}  score={a.score:.4f}"
                f"  evidence={len(a.evidence)}  ({_shown(avail)})",
                highlight=False,
            )
            if a.why:
                out_console.print(
                    "    " + printable("; ".join(a.why)), markup=False, highlight=False
                )
    for w in resp.warnings:
        err_console.print(
            f"[yellow]warning[/] {_shown(f'{w.code} {w.lane}: {w.message}')}", highlight=False
        )
    for e in resp.errors:
        err_console.print(
            f"[red]error[/] {_shown(f'{e.code} {e.lane}: {e.message}')}", highlight=False
        )
    lim = resp.limits
    out_console.print(
        f"\n{lim.returned} items, {lim.budget.used_tokens}/{lim.budget.max_tokens} tokens"
        + (" (truncated)" if lim.truncated else "")
        + ("" if resp.found else ", found=false"),
        highlight=False,
    )


def _when(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    """``--since``/``--until``: an RFC 3339 time or a date; without a zone, UTC."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a time; use RFC 3339 (2026-03-01T09:00:00Z) or a date (2026-03-01)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@main.command()
@click.argument("query")
@click.option(
    "--mode",
    default="auto",
    show_default=True,
    help="auto, find_agent, find_skill, find_code, find_knowledge, docs or themes.",
)
@click.option(
    "--include",
    multiple=True,
    help="Lane to query: episodes, code, skills (repeatable; default all).",
)
@click.option("--limit", default=10, show_default=True, help="Items per lane, 1..50.")
@click.option(
    "--workspace", "workspaces", multiple=True, help="Restrict to this workspace root (repeatable)."
)
@click.option(
    "--session",
    "session_ids",
    multiple=True,
    help="Restrict episodes to this session id (repeatable).",
)
@click.option(
    "--path", "paths", multiple=True, help="Restrict code to this path prefix (repeatable)."
)
@click.option(
    "--actor", "actor_ids", multiple=True, help="Restrict actors to this actor id (repeatable)."
)
@click.option(
    "--skill", "skills", multiple=True, help="Restrict the skills lane to this name (repeatable)."
)
@click.option("--outcome", default="any", show_default=True, help="success, failure or any.")
@click.option(
    "--since",
    callback=_when,
    help="Episodes from this time on: RFC 3339 (2026-03-01T09:00:00Z) or a date (UTC).",
)
@click.option("--until", callback=_when, help="Episodes up to this time (same forms as --since).")
@click.option("--max-tokens", default=4000, show_default=True, help="Response budget, 500..20000.")
@click.option("--snippet-chars", default=240, show_default=True, help="Snippet length, 80..1000.")
@click.option("--locator", is_flag=True, help="Addresses only, no snippets (provenance=locator).")
@click.option("--trace", is_flag=True, help="Add per-lane timings.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the knowledge.search/v1 response as JSON."
)
@click.pass_context
@handle_errors
def search(
    ctx: click.Context,
    query: str,
    mode: str,
    include: tuple[str, ...],
    limit: int,
    workspaces: tuple[str, ...],
    session_ids: tuple[str, ...],
    paths: tuple[str, ...],
    actor_ids: tuple[str, ...],
    skills: tuple[str, ...],
    outcome: str,
    since: datetime | None,
    until: datetime | None,
    max_tokens: int,
    snippet_chars: int,
    locator: bool,
    trace: bool,
    as_json: bool,
) -> None:
    """Ask one question; get separate lanes of evidence (episodes, code, skills) and actors.

    An empty lane says why: nothing matched, nothing indexed yet, nothing indexed in your
    workspaces, not requested, its source failed (the errors name the cause) or the budget
    took its items (the lane's empty_reason in --json). A code item names its workspace
    ("in /path") when the items come from more than one."""
    with client(ctx) as kc:
        resp = kc.search(
            query,
            mode=mode,
            include=list(include) or None,
            limit=limit,
            workspaces=workspaces,
            session_ids=session_ids,
            paths=paths,
            actor_ids=actor_ids,
            skills=skills,
            outcome=outcome,
            since=since,
            until=until,
            max_tokens=max_tokens,
            snippet_chars=snippet_chars,
            provenance="locator" if locator else "strict",
            trace=trace,
        )
    if as_json:
        emit_json(resp)
    else:
        _lanes_table(resp)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """Edition, licence state and per-lane status of the running service."""
    with client(ctx) as kc:
        resp = kc.get_status()
    if as_json:
        emit_json(resp)
        return
    e = resp.edition
    if e is not None:
        out_console.print(
            f"knowledge {_shown(resp.version)}  edition [bold]{_shown(e.edition)}[/]"
            f" (licence {_shown(e.licence_state)}: {_shown(e.reason)})"
        )
    p = resp.principal
    if p is not None:
        out_console.print(
            f"principal {p.id} ({p.role}, org {p.organisation})", markup=False, highlight=False
        )
    t = Table()
    for col in ("lane", "index_rev", "capability", "counts", "notes"):
        t.add_column(col, overflow="fold")
    for lane in resp.lanes:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(lane.counts.items()))
        notes = lane.reason
        if lane.stale_workspaces:
            notes += f" stale: {', '.join(lane.stale_workspaces)}"
        # Cells as text: the notes name workspaces, which may hold "[" and "]".
        t.add_row(
            *(Text(x) for x in (lane.lane, lane.index_rev or "-", lane.capability, counts, notes))
        )
    out_console.print(t)


@main.command("get-episode")
@click.argument("episode_id")
@click.option(
    "--neighbours", default=0, show_default=True, help="Events before and after to include (0..20)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def get_episode(ctx: click.Context, episode_id: str, neighbours: int, as_json: bool) -> None:
    """Print the full text of one episode (ep:<session_id>:<seq>)."""
    with client(ctx) as kc:
        resp = kc.get_episode(episode_id, neighbours=neighbours)
    if as_json:
        emit_json(resp)
        return
    episode = resp.episode
    if episode is None:
        fail("the service answered without the episode")
        return
    for ev in [*resp.before, episode, *resp.after]:
        marker = ">>" if ev.id == episode.id else "  "
        when = ev.time.isoformat() if ev.time else ""
        out_console.print(f"{marker} [bold]{_shown(ev.id)}[/] {_shown(ev.event_type)} {when}")
        out_console.print(printable(ev.text, lines=True), markup=False, highlight=False)


@main.command("get-chunk")
@click.argument("chunk_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def get_chunk(ctx: click.Context, chunk_id: str, as_json: bool) -> None:
    """Print one code/document chunk with its path:line address."""
    with client(ctx) as kc:
        resp = kc.get_chunk(chunk_id)
    if as_json:
        emit_json(resp)
        return
    c = resp.chunk
    if c is None:
        fail("the service answered without the chunk")
        return
    out_console.print(
        f"[bold]{_shown(c.path)}:{c.start_line}-{c.end_line}[/]"
        f" {_shown(f'{c.symbol} ({c.language}, {c.source_kind}) rev={resp.index_rev}')}"
    )
    out_console.print(printable(c.text, lines=True), markup=False, highlight=False)


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--full", is_flag=True, help="Re-read every file, even unchanged ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
@handle_errors
def index(ctx: click.Context, path: str, full: bool, as_json: bool) -> None:
    """Index a workspace for the code lane (progress bar, then a summary)."""
    with client(ctx) as kc:
        run_stream(
            kc.index_workspace(str(Path(path).resolve()), full=full, timeout=None), as_json, "index"
        )


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True))
@click.option(
    "--watch", is_flag=True, help="Keep ingesting as live sessions grow (Ctrl-C to stop)."
)
@click.option(
    "--interval", default=2.0, show_default=True, help="Seconds between checks with --watch."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as JSON (with --watch: one summary per line, JSON Lines).",
)
@click.pass_context
@handle_errors
def ingest(
    ctx: click.Context, paths: tuple[str, ...], watch: bool, interval: float, as_json: bool
) -> None:
    """Ingest agent session logs (default: the server's configured or standard log folders;
    for an operator scoped to workspaces, only those lying in them)."""
    import time

    resolved = [str(Path(p).resolve()) for p in paths]
    rounds = 0
    with client(ctx) as kc:
        try:
            while True:
                run_stream(
                    kc.ingest_sessions(resolved, timeout=None), as_json, "ingest", lines=watch
                )
                rounds += 1
                if not watch:
                    break
                time.sleep(interval)
        except KeyboardInterrupt:
            if not watch or not rounds:
                # Stopped before a single round ended: nothing was ingested to report.
                raise
            # Ctrl-C is how --watch is stopped after its rounds: an ending, not a failure.


@main.command()
@click.option("--full", is_flag=True, help="Rebuild from scratch.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
@handle_errors
def rebuild(ctx: click.Context, full: bool, as_json: bool) -> None:
    """Rebuild the derived layer (skills, actors, skill uses)."""
    with client(ctx) as kc:
        run_stream(kc.rebuild_derived(full=full, timeout=None), as_json, "rebuild")


@main.command()
@click.argument("task")
@click.option("--acceptance", multiple=True, help="Acceptance criterion (repeatable).")
@click.option("--constraint", "constraints", multiple=True, help="Constraint (repeatable).")
@click.option("--actor", "actor_id", default="", help="Explicit actor id (must exist).")
@click.option(
    "--workspace",
    "workspaces",
    multiple=True,
    help="Draw evidence from this workspace (repeatable).",
)
@click.option(
    "--commit",
    is_flag=True,
    help="Record the plan (an assignment + outbox package). Default: dry run.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the knowledge.dispatch/v1 response as JSON."
)
@click.pass_context
@handle_errors
def dispatch(
    ctx: click.Context,
    task: str,
    acceptance: tuple[str, ...],
    constraints: tuple[str, ...],
    actor_id: str,
    workspaces: tuple[str, ...],
    commit: bool,
    as_json: bool,
) -> None:
    """Choose the best actor for a task and prepare a hand-off package (never executed)."""
    with client(ctx) as kc:
        resp = kc.dispatch(
            task,
            acceptance=acceptance,
            constraints=constraints,
            actor_id=actor_id,
            target=f"actor:{actor_id}" if actor_id else "auto",
            commit=commit,
            workspaces=workspaces,
        )
    if as_json:
        emit_json(resp)
        return
    t = resp.target

    def say(text: str) -> None:  # data from sessions and code: never markup, never escapes
        out_console.print(printable(text), markup=False, highlight=False)

    if t is None or not t.actor_id:
        say("no actor fits this task")
    else:
        d = t.dispatch
        say(
            f"{t.name} ({t.actor_id}, {t.kind}) via {d.mode if d else 'none'}"
            f" - {'available' if d and d.available else 'not available'}{': ' + d.reason if d and d.reason else ''}"
        )
        for why in t.why:
            say(f"  why: {why}")
    cp = resp.context_pack
    if cp is not None:
        for ep in cp.prior_episodes:
            say(f"  episode {ep.id}: {ep.snippet[:100]}")
        for line in code_refs_text(cp.code_refs):
            say(f"  {line}")
        for sk in cp.skills:
            say(f"  skill {sk.name} ({sk.uses} uses)")
        for risk in cp.risks:
            say(f"  risk: {risk}")
    for w in resp.warnings:
        err_console.print(
            f"warning: {w.code}{' (' + w.lane + ')' if w.lane else ''}: {w.message}",
            markup=False,
            highlight=False,
        )
    h = resp.handoff
    if h is not None and h.schema:
        calls = ", ".join(c.tool for c in h.tool_calls) or "none (package only)"
        say(
            f"hand-off {h.schema}: tool calls {calls}; execution {h.execution} (requires {h.requires})"
        )
    if resp.assignment is not None and resp.assignment.assignment_id:
        a = resp.assignment
        say(
            f"recorded {a.assignment_id} ({a.status}, {'new' if a.created else 'already recorded'}) -> {a.outbox_path}"
        )
    else:
        say(f"mode: {resp.mode} (nothing written; --commit records the plan)")


main.add_command(mcp_command, "mcp")
main.add_command(outbox, "outbox")
license_group.add_command(install_command, "install")
main.add_command(license_group, "license")
main.add_command(tokens_group, "token")
main.add_command(docgraph, "docgraph")
main.add_command(kb, "kb")
main.add_command(memory, "memory")
main.add_command(audit, "audit")


def iter_commands(group: click.Group | None = None, prefix: str = "") -> Iterator[str]:
    """Every command path, e.g. 'search', 'license issue' (for the docs test)."""
    group = group or main
    for name, cmd in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        yield path
        if isinstance(cmd, click.Group):
            yield from iter_commands(cmd, path + " ")
