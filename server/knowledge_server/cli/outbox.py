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
        click.echo(f"the outbox {directory} is empty")
        return
    click.echo(
        f"outbox {directory}: {len(entries)} package{'' if len(entries) == 1 else 's'} (never executed here)"
    )
    for e in entries:
        s = e.summary()
        task = s["task"] if len(s["task"]) <= 60 else s["task"][:59] + "…"
        click.echo(
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
    click.echo(f"{p.schema}  {p.assignment_id}  ({entry.path})")
    click.echo(f"execution: {p.execution}  requires: {p.requires}")
    d = p.target.dispatch
    click.echo(
        f"target: {p.target.name or '-'} ({p.target.actor_id or 'none'}) via {d.mode or 'none'}"
        f" - {'available' if d.available else 'not available'}{': ' + d.reason if d.reason else ''}"
    )
    click.echo(f"task: {p.task.text}")
    for a in p.task.acceptance:
        click.echo(f"  acceptance: {a}")
    for c in p.task.constraints:
        click.echo(f"  constraint: {c}")
    cp = p.context_pack
    for ep in cp.prior_episodes:
        click.echo(f"  episode {ep.id}" + (f": {ep.snippet}" if ep.snippet else ""))
    for line in code_refs_text(cp.code_refs):
        click.echo(f"  {line}")
    for sk in cp.skills:
        click.echo(f"  skill {sk.name} ({sk.uses} uses)")
    for risk in cp.risks:
        click.echo(f"  risk: {risk}")
    if not p.tool_calls:
        click.echo("tool calls: none (package only)")
    for i, call in enumerate(p.tool_calls, 1):
        click.echo(f"tool call {i}: {call.tool}")
        click.echo(
            "  "
            + json.dumps(
                dict(sorted(call.arguments.items())), ensure_ascii=False, indent=2
            ).replace("\n", "\n  ")
        )
