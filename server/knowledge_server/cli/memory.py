"""`knowledge memory ...`: the fact memory of the caller's workspace (docs/memory.md)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import click

from knowledge_server.cli.common import (
    client,
    emit_json,
    fail,
    handle_errors,
    out_console,
)
from knowledge_server.memory.policy import STORES, PolicyError, PolicyOutOfRange, load_policy
from knowledge_server.plain import printable

_STORE = click.Choice(STORES)


def _say(text: str) -> None:
    # Memory values are data written by agents: never rendered as markup, nor run by the
    # terminal (control characters escaped).
    out_console.print(printable(text), markup=False, highlight=False)


def _cut(t: Any) -> None:
    if t is not None and t.omitted:
        more = f": {', '.join(t.omitted_ids)}" if t.omitted_ids else ""
        _say(f"({t.omitted} of {t.total} cut by {t.limit_name}={t.limit}{more})")


def _entry(e: Any) -> str:
    state = "current" if e.current else "superseded"
    return (
        f"{e.id}  [{e.category}] {e.key} = {e.value}  (confidence {e.confidence:.2f},"
        f" {e.confirmations}x, {state})"
    )


_workspace = click.option(
    "--workspace", default="", help="Workspace whose memory to use (default: the token's only one)."
)
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group("memory")
def memory() -> None:
    """Project memory: facts, patterns, history, procedures and relations of a workspace."""


@memory.command("remember")
@click.argument("category")
@click.argument("key")
@click.argument("value")
@click.option("--store", type=_STORE, default="facts", show_default=True)
@click.option("--confidence", type=float, default=0.0, help="0..1 (default 0.7).")
@_workspace
@_json
@click.pass_context
@handle_errors
def remember(
    ctx: click.Context,
    category: str,
    key: str,
    value: str,
    store: str,
    confidence: float,
    workspace: str,
    as_json: bool,
) -> None:
    """Write VALUE under CATEGORY / KEY (relations: KIND SOURCE TARGET)."""
    with client(ctx) as kc:
        resp = kc.remember(
            category, key, value, store=store, confidence=confidence, workspace=workspace
        )
    if as_json:
        emit_json(resp)
        return
    _say(f"{resp.outcome}: {_entry(resp.entry)}")
    contradiction = resp.contradiction
    if contradiction is not None and contradiction.severity and contradiction.previous:
        prev = contradiction.previous
        _say(f"contradiction ({contradiction.severity}) with {prev.id}: {prev.value}")
    if resp.reclaimed:
        _say(f"the store was full: {resp.reclaimed} entries moved to the archive")


@memory.command("recall")
@click.argument("query", default="")
@click.option("--store", type=_STORE, default="facts", show_default=True)
@click.option("--category", default="", help="Only this category.")
@click.option("--limit", default=0, help="Entries (0 = recall_facts_limit).")
@_workspace
@_json
@click.pass_context
@handle_errors
def recall(
    ctx: click.Context,
    query: str,
    store: str,
    category: str,
    limit: int,
    workspace: str,
    as_json: bool,
) -> None:
    """Current entries matching QUERY (all when empty)."""
    with client(ctx) as kc:
        resp = kc.recall(query, store=store, category=category, limit=limit, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    for e in resp.entries:
        _say(_entry(e))
    if not resp.entries:
        _say("nothing recalled")
    _cut(resp.truncation)


@memory.command("timeline")
@click.argument("category")
@click.argument("key")
@click.option("--store", type=_STORE, default="facts", show_default=True)
@click.option("--limit", default=0, help="Versions (0 = timeline_limit).")
@_workspace
@_json
@click.pass_context
@handle_errors
def timeline(
    ctx: click.Context,
    category: str,
    key: str,
    store: str,
    limit: int,
    workspace: str,
    as_json: bool,
) -> None:
    """Every version of CATEGORY / KEY, oldest first."""
    with client(ctx) as kc:
        resp = kc.timeline(category, key, store=store, limit=limit, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    for e in resp.versions:
        _say(_entry(e))
    _cut(resp.truncation)
    if resp.archived_versions:
        _say(f"{resp.archived_versions} more in the archive (knowledge memory restore)")


@memory.command("rooms")
@click.option("--store", type=_STORE, default="facts", show_default=True)
@click.option("--limit", default=0, help="Rooms (0 = rooms_limit).")
@_workspace
@_json
@click.pass_context
@handle_errors
def rooms(ctx: click.Context, store: str, limit: int, workspace: str, as_json: bool) -> None:
    """Categories with their number of current entries."""
    with client(ctx) as kc:
        resp = kc.rooms(store=store, limit=limit, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    for r in resp.rooms:
        _say(f"{r.category}: {r.entries}")
    _cut(resp.truncation)


@memory.command("relations")
@click.argument("ref", default="")
@click.option("--limit", default=0, help="Edges (0 = relations_limit).")
@_workspace
@_json
@click.pass_context
@handle_errors
def relations(ctx: click.Context, ref: str, limit: int, workspace: str, as_json: bool) -> None:
    """Relation edges from or to REF (all when empty)."""
    with client(ctx) as kc:
        resp = kc.relations(ref, limit=limit, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    for e in resp.edges:
        _say(f"{e.id}  {e.source} --{e.kind}--> {e.target}")
    _cut(resp.truncation)


@memory.command("policy")
@click.argument("value", type=click.Choice(["show", "validate"]), default="show")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the policy from this configuration file instead of asking the server.",
)
@_json
@click.pass_context
@handle_errors
def policy(ctx: click.Context, value: str, config_file: Path | None, as_json: bool) -> None:
    """Show the memory policy in force, or validate its ranges (exit 1 when invalid; exit 2
    when the --config file is no policy: unreadable, not TOML, an unknown key, a wrong
    type)."""
    if config_file is not None:
        try:
            raw = tomllib.loads(config_file.read_text(encoding="utf-8"))
            found = load_policy(raw.get("memory"), os.environ, f"config file {config_file}")
        except PolicyOutOfRange as exc:
            # A policy that reads but is not valid: the verdict the command exists for.
            fail(f"invalid: {exc}")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, PolicyError) as exc:
            # Input that is no policy at all (exit code 2, as for any bad input).
            fail(f"invalid: {exc}", 2)
        data: dict[str, Any] = {"valid": True, "policy": found.as_tables(), "problems": []}
        if as_json:
            emit_json(data)
        else:
            for table, values in found.as_tables().items():
                for k, v in values.items():
                    _say(f"memory.{table}.{k} = {v}")
            _say("valid")
        return
    with client(ctx) as kc:
        resp = kc.memory_policy(value)
    if as_json:
        emit_json(resp)
    else:
        p = resp.policy
        if p is not None:
            for k, v in p.to_dict(include_default_values=True).items():
                _say(f"{k} = {v}")
        _say("valid" if resp.valid else "invalid: " + "; ".join(resp.problems))
    if not resp.valid:
        fail("the memory policy is not valid")


@memory.command("consolidate")
@click.option("--all", "all_stores", is_flag=True, help="Every store, not only facts.")
@click.option("--dry-run", is_flag=True, help="Compute on a copy and report; write nothing.")
@_workspace
@_json
@click.pass_context
@handle_errors
def consolidate(
    ctx: click.Context, all_stores: bool, dry_run: bool, workspace: str, as_json: bool
) -> None:
    """Decay confidence, merge near-duplicates and compact (all archived, restorable)."""
    with client(ctx) as kc:
        resp = kc.consolidate(all=all_stores, dry_run=dry_run, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    verb = "would" if resp.dry_run else "did"
    _say(
        f"{', '.join(resp.stores)}: {verb} decay {resp.decayed}, merge {resp.merged},"
        f" compact {resp.compacted}"
    )
    if resp.archived_ids:
        _say(f"archived: {', '.join(resp.archived_ids)}")


@memory.command("restore")
@click.option("--store", type=_STORE, default="facts", show_default=True)
@click.option("--query", default="", help="Words every restored entry contains.")
@click.option("--limit", default=10, show_default=True, help="Most entries to restore.")
@_workspace
@_json
@click.pass_context
@handle_errors
def restore(
    ctx: click.Context, store: str, query: str, limit: int, workspace: str, as_json: bool
) -> None:
    """Bring archived entries back (never a duplicate, never over a live value)."""
    with client(ctx) as kc:
        resp = kc.restore(store=store, query=query, limit=limit, workspace=workspace)
    if as_json:
        emit_json(resp)
        return
    for e in resp.restored:
        _say(f"restored {_entry(e)}")
    _say(
        f"{len(resp.restored)} restored ({resp.as_history} as superseded versions),"
        f" {resp.already_live} already live"
    )
