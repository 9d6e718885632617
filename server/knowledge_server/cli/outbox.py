"""`knowledge outbox ...`: the recorded hand-off packages (`knowledge.handoff/v1`).

Reads ``DATA_DIR/outbox`` directly (no running service needed). Packages are never
executed by the service; a lead harness runs them after explicit confirmation.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
from google.protobuf import json_format

from knowledge_server.cli.common import code_refs_text, data_dir, emit_json, fail
from knowledge_server.dispatch import outbox as ob
from knowledge_server.plain import printable


def _say(text: str) -> None:
    """A line of the listing: a package holds text from logs and tasks, shown escaped
    (``printable``), never run by the terminal."""
    click.echo(printable(text))


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ") if ts else "-"


@click.group()
def outbox() -> None:
    """Hand-off packages recorded by `knowledge dispatch --commit` (never executed here)."""


@outbox.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.pass_context
def list_packages(ctx: click.Context, as_json: bool) -> None:
    """List the packages in the outbox, oldest first."""
    directory = ob.outbox_dir(data_dir(ctx))
    entries = ob.list_entries(directory)
    if as_json:
        emit_json([e.summary() for e in entries])
        return
    if not entries:
        _say(f"the outbox {directory} is empty")
        return
    _say(
        f"outbox {directory}: {len(entries)} package{'' if len(entries) == 1 else 's'} (never executed here)"
    )
    for e in entries:
        s = e.summary()
        task = s["task"] if len(s["task"]) <= 60 else s["task"][:59] + "…"
        _say(
            f"{e.assignment_id}  {_when(e.modified)}  {s['actor_name'] or s['actor_id'] or '-'}  "
            f"{s['mode'] or 'none'}  calls={s['tool_calls']}  {e.problem or task}"
        )


@outbox.command("show")
@click.argument("assignment_id")
@click.option("--json", "as_json", is_flag=True, help="Print the package as JSON.")
@click.pass_context
def show(ctx: click.Context, assignment_id: str, as_json: bool) -> None:
    """Show one package: target, task, context references and the tool calls it proposes."""
    directory = ob.outbox_dir(data_dir(ctx))
    entry = ob.find_entry(directory, assignment_id)
    if entry is None:
        fail(f"no package {assignment_id!r} in {directory}")
        return
    if entry.package is None:
        fail(f"{entry.path}: {entry.problem}")
        return
    p = entry.package
    if as_json:
        emit_json(json_format.MessageToDict(p, preserving_proto_field_name=True))
        return
    _say(f"{p.schema}  {p.assignment_id}  ({entry.path})")
    _say(f"execution: {p.execution}  requires: {p.requires}")
    d = p.target.dispatch
    _say(
        f"target: {p.target.name or '-'} ({p.target.actor_id or 'none'}) via {d.mode or 'none'}"
        f" - {'available' if d.available else 'not available'}{': ' + d.reason if d.reason else ''}"
    )
    _say(f"task: {p.task.text}")
    for a in p.task.acceptance:
        _say(f"  acceptance: {a}")
    for c in p.task.constraints:
        _say(f"  constraint: {c}")
    cp = p.context_pack
    for ep in cp.prior_episodes:
        _say(f"  episode {ep.id}" + (f": {ep.snippet}" if ep.snippet else ""))
    for line in code_refs_text(cp.code_refs):
        _say(f"  {line}")
    for sk in cp.skills:
        _say(f"  skill {sk.name} ({sk.uses} uses)")
    for risk in cp.risks:
        _say(f"  risk: {risk}")
    if not p.tool_calls:
        _say("tool calls: none (package only)")
    for i, call in enumerate(p.tool_calls, 1):
        _say(f"tool call {i}: {call.tool}")
        text = json.dumps(dict(sorted(call.arguments.items())), ensure_ascii=False, indent=2)
        for line in text.splitlines():
            _say(f"  {line}")
