"""`knowledge docgraph ...`: the document graph operations (Enterprise feature doc-graph)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from knowledge_sdk import types as v1

from knowledge_server.cli.common import client, emit_json, handle_errors, run_stream
from knowledge_server.plain import printable


def _echo(line: str, err: bool = False) -> None:
    """One line of output: what the graph holds is document text (titles, entity names,
    summaries), so a control character in it is written as its escape (``printable``),
    never sent to the terminal."""
    click.echo(printable(line), err=err)


def _addr(a: Any) -> str:
    return f"{a.path}:{a.start_line}" if a is not None else "-"


def _envelope(resp: Any) -> None:
    if not resp.collected:
        _echo(f"not collected: {resp.reason}")
    elif not resp.found:
        _echo(f"nothing found{': ' + resp.reason if resp.reason else ''}")
    _echo(f"op={resp.op} rev={resp.index_rev or '-'} capability={resp.capability}", err=True)
    for p in resp.layer_provenance or []:
        # Which build answered: model, prompt versions, fingerprint, time (for an auditor).
        _echo(
            f"layer {p.workspace}: model={p.model} prompts={','.join(p.prompt_versions)} "
            f"fingerprint={p.fingerprint[:12]} built_at={p.built_at}",
            err=True,
        )


@click.group()
def docgraph() -> None:
    """Document graph: themes, entity neighbours, document relations, overview, dual-level search.

    An Enterprise feature (doc-graph): a Community server refuses these with a one-line
    explanation naming the edition needed.
    """


@docgraph.command()
@click.option("--scope", default="", help="Path prefix to restrict to.")
@click.option("--limit", default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def themes(ctx: click.Context, scope: str, limit: int, as_json: bool) -> None:
    """List themes with their top entities and addresses."""
    with client(ctx) as kc:
        resp = kc.themes(scope=scope, limit=limit)
    if as_json:
        return emit_json(resp)
    _envelope(resp)
    for t in resp.themes:
        ents = ", ".join(
            f"{e.name} ({_addr(e.addresses[0]) if e.addresses else '-'})"
            for e in t.top_entities[:5]
        )
        _echo(f"{t.theme_id[:12]}  {t.title}  size={t.size}  {ents}")
        if t.summary:
            _echo(f"    {t.summary}")


@docgraph.command()
@click.argument("entity")
@click.option("--depth", default=1, show_default=True, help="1..3")
@click.option("--kind", default="entity", show_default=True, help="entity or theme")
@click.option("--limit", default=25, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def neighbors(
    ctx: click.Context, entity: str, depth: int, kind: str, limit: int, as_json: bool
) -> None:
    """Neighbours of an entity, each with the path:line of a quote."""
    with client(ctx) as kc:
        resp = kc.entity_neighbors(entity, depth=depth, kind=kind, limit=limit)
    if as_json:
        return emit_json(resp)
    _envelope(resp)
    for n in resp.neighbors:
        _echo(
            f"{'  ' * (n.depth - 1)}{n.name} [{n.kind}] {n.relation} w={n.weight:g} {_addr(n.address)}"
        )


@docgraph.command()
@click.option("--doc", default="", help="Document path.")
@click.option("--entity", default="", help="Entity name or id.")
@click.option("--limit", default=25, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def relations(ctx: click.Context, doc: str, entity: str, limit: int, as_json: bool) -> None:
    """Relations between documents through shared entities."""
    if not doc and not entity:
        raise click.UsageError("give --doc or --entity")
    with client(ctx) as kc:
        resp = kc.doc_relations(doc=doc, entity=entity, limit=limit)
    if as_json:
        return emit_json(resp)
    _envelope(resp)
    for r in resp.relations:
        via = ", ".join(e.name for e in r.via_entities[:5])
        cites = ", ".join(_addr(c) for c in r.citations[:3])
        _echo(f"{r.from_} -> {r.to} [{r.kind}] via {via}  {cites}")


@docgraph.command()
@click.option("--limit", default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def overview(ctx: click.Context, limit: int, as_json: bool) -> None:
    """A map of the corpus: counts and top themes."""
    with client(ctx) as kc:
        resp = kc.global_overview(limit=limit)
    if as_json:
        return emit_json(resp)
    _envelope(resp)
    _echo(
        f"documents={resp.documents} chunks={resp.chunks} entities={resp.entities} relations={resp.relations} "
        f"themes={resp.themes} summaries={resp.summaries}"
    )
    if resp.degraded:
        _echo(f"degraded: {resp.degradation_reason}")
    for t in resp.top_themes:
        _echo(f"  theme {t.title} (size {t.size})  {_addr(t.address)}")
    for e in resp.top_entities:
        _echo(
            f"  entity {e.name} [{e.kind}] mentions={e.mentions}  {_addr(e.addresses[0]) if e.addresses else '-'}"
        )


@docgraph.command("search-levels")
@click.argument("query")
@click.option("--limit", default=10, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@handle_errors
def search_levels(ctx: click.Context, query: str, limit: int, as_json: bool) -> None:
    """Dual-level search: themes (high level) and entities (low level) in one answer."""
    with client(ctx) as kc:
        resp = kc.search_levels(query, limit=limit)
    if as_json:
        return emit_json(resp)
    _envelope(resp)
    _echo(
        f"high: {', '.join(resp.high_level)} | low: {', '.join(resp.low_level)}"
        + (f"  (degraded: {resp.degradation_reason})" if resp.degraded else "")
    )
    for h in resp.items:
        ents = ", ".join(e.name for e in h.matched_entities[:5])
        _echo(f"  {_addr(h.address)} [{h.match_kind}] {h.score:.3f}  {ents}")


@docgraph.command()
@click.option(
    "--root",
    default="",
    help="Workspace root, a path on this machine as `knowledge index` takes it (default: every "
    "indexed workspace).",
)
@click.option(
    "--estimate", is_flag=True, help="Only estimate chunks and LLM calls; change nothing."
)
@click.option("--max-chunks", default=0, help="Cap on chunks sent to the LLM in this run.")
@click.option("--budget-seconds", default=0, help="Time budget in seconds for this run.")
@click.option("--structural-only", is_flag=True, help="Use only the structural extractor (no LLM).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
@handle_errors
def build(
    ctx: click.Context,
    root: str,
    estimate: bool,
    max_chunks: int,
    budget_seconds: int,
    structural_only: bool,
    as_json: bool,
) -> None:
    """Build (or resume building) the document graph layer."""
    req = v1.BuildDocGraphRequest(
        # Resolved here, as `knowledge index` does: "." is this shell's folder, not the server's.
        root=str(Path(root).resolve()) if root else "",
        estimate=estimate,
        max_chunks=max_chunks,
        budget_seconds=budget_seconds,
        structural_only=structural_only,
    )
    with client(ctx) as kc:
        run_stream(kc.build_doc_graph(req, timeout=None), as_json, "docgraph")
