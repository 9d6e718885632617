"""The document graph (Enterprise) behind DocGraphService and IndexService.BuildDocGraph.

Input chunks come from the code lane, which owns ``code.sqlite`` (``CodeLane.document_chunks``:
the current revision of each workspace, document chunks only); the layer lives in
``docgraph.sqlite`` (owned by :mod:`knowledge_server.docgraph`). The edition gate is the
transport's job.

Workspaces: each workspace has its own layer. An operation asks every workspace in the
caller's scope that has a layer and merges the collected answers deterministically
(``merge_answers``: each operation's order, then the workspace, cut to the limit per list);
every address carries its workspace, so each fact names where it comes from. A workspace is in
scope only when it lies at or under one of the caller's roots.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, cast

from knowledge_server import deadline
from knowledge_server._gen.knowledge.v1 import (
    docgraph_pb2,
    errors_pb2,
    index_service_pb2,
    search_pb2,
)
from knowledge_server.docgraph import (
    BuildSettings,
    DocChunk,
    DocGraphBuilder,
    DocGraphOps,
    DocGraphStore,
    LLMClient,
    LLMSettings,
    make_client,
)
from knowledge_server.errors import FailedPrecondition, InvalidRequest, NotFound, PermissionDenied
from knowledge_server.lanes import contract
from knowledge_server.lanes.code import DOCS_PLAIN_MESSAGE, DOCS_PLAIN_REASON
from knowledge_server.lanes.common import Pool, ProgressFn, WriterLock, bound_reader
from knowledge_server.lanes.contract import DocumentSource
from knowledge_server.search.lanes import LANE_DEADLINE, LaneQuery, LaneResult
from knowledge_server.workspaces import is_under

PROVENANCE = "stated"
# Languages the code lane gives document files (the graph never reads code chunks).
DOC_LANGUAGES = ("markdown", "md", "text", "txt", "rst", "asciidoc", "org")
NOT_BUILT_REASON = "DOCGRAPH_NOT_BUILT: document graph layer not built"
# Weight of the graph's ranking against the text match's (1.0) in Search mode=docs. Measured
# on the 30 fixed questions per corpus (bench/bench_docgraph_depth.py, expected document in
# the first 5): EIPs 30/30 with text match alone; with the graph at 1.0 / 0.5 / 0.25 / 0.15 /
# 0.1: 20 / 21 / 27 / 29 / 30 (Starlette 29 / 29 / 30 / 30 / 30). The graph's own ranking is
# weaker than the text match's, so it reorders near-ties only; its chunks come after them.
GRAPH_WEIGHT = 0.1

# (default, max) of ``limit`` per operation; 0 in a request means "default".
_LIMITS = {
    "themes": (10, 100),
    "entity_neighbors": (25, 200),
    "doc_relations": (25, 200),
    "global_overview": (10, 50),
    "search_levels": (10, 50),
}
_RESPONSES = {
    "themes": docgraph_pb2.ThemesResponse,
    "entity_neighbors": docgraph_pb2.EntityNeighborsResponse,
    "doc_relations": docgraph_pb2.DocRelationsResponse,
    "global_overview": docgraph_pb2.GlobalOverviewResponse,
    "search_levels": docgraph_pb2.SearchLevelsResponse,
}


def llm_settings_from_config(config: Any) -> LLMSettings | None:
    """The LLM named in the server config, or None when url or model is empty."""
    if not (config.llm_url and config.llm_model):
        return None
    return LLMSettings(
        base_url=config.llm_url,
        model=config.llm_model,
        api_key_env=config.llm_key_env or None,
        api_key_file=str(config.llm_key_file) if config.llm_key_file else None,
        provider=config.llm_provider,
        model_version=config.llm_model_version,
        timeout_seconds=config.llm_timeout_seconds,
        max_retries=config.llm_max_retries,
    )


def _bound(store: DocGraphStore) -> DocGraphStore:
    bound_reader(store.conn, busy_ms=5000)
    return store


def _in_scope(workspace: str, scope: tuple[str, ...] | None) -> bool:
    return scope is None or any(is_under(workspace, r) for r in scope)


def layer_rev(rev_id: int | None) -> str:
    return f"docgraph:{rev_id}" if rev_id is not None else ""


# -- dict -> proto ---------------------------------------------------------------------------


def _address(d: dict[str, Any] | None, workspace: str) -> docgraph_pb2.Address | None:
    if not d or not d.get("path"):
        return None
    return docgraph_pb2.Address(
        chunk_id=d.get("chunk_id") or "",
        path=d["path"],
        start_line=int(d["start_line"]),
        end_line=int(d["end_line"]),
        workspace=workspace,
    )


def _entity_ref(
    d: dict[str, Any], workspace: str, *addresses: dict[str, Any] | None
) -> docgraph_pb2.EntityRef:
    ref = docgraph_pb2.EntityRef(
        entity_id=d.get("entity_id", ""),
        name=d.get("name", ""),
        kind=d.get("kind", ""),
        mentions=int(d.get("mentions") or 0),
        built_by=d.get("built_by") or "",
    )
    for a in addresses or (d,):
        pb = _address(a, workspace)
        if pb is not None:
            ref.addresses.append(pb)
    return ref


def _theme(d: dict[str, Any], workspace: str) -> docgraph_pb2.Theme:
    t = docgraph_pb2.Theme(
        theme_id=d["theme_id"],
        title=d.get("title", ""),
        size=int(d.get("size") or 0),
        seed_entity_id=d.get("seed_entity_id", ""),
    )
    if d.get("summary"):
        t.summary = d["summary"]
    addr = _address(d, workspace)
    if addr is not None:
        t.address.CopyFrom(addr)
    t.top_entities.extend(_entity_ref(e, workspace) for e in d.get("top_entities", []))
    t.citations.extend(
        a for a in (_address(c, workspace) for c in d.get("citations", [])) if a is not None
    )
    return t


def _envelope(resp: Any, d: dict[str, Any], workspace: str) -> None:
    resp.op = d["op"]
    resp.index_rev = layer_rev(d.get("index_rev"))
    resp.capability = d.get("capability") or ""
    resp.provenance = PROVENANCE
    resp.found = bool(d.get("found"))
    resp.collected = bool(d.get("collected"))
    resp.reason = d.get("reason") or ""
    if d.get("error"):
        resp.error.CopyFrom(
            errors_pb2.Notice(code=d["error"], lane="docgraph", message="invalid request")
        )
    prov = d.get("provenance") or {}
    if prov.get("fingerprint"):
        resp.layer_provenance.append(
            docgraph_pb2.LayerProvenance(
                workspace=workspace,
                model=str(prov.get("model") or ""),
                prompt_versions=[str(v) for v in prov.get("prompt_versions") or []],
                fingerprint=str(prov["fingerprint"]),
                built_at=str(prov.get("built_at") or ""),
                source_index_rev=str(prov.get("source_index_rev") or ""),
            )
        )
    lim = d.get("limits") or {}
    resp.limits.requested = int(lim.get("requested") or 0)
    resp.limits.returned = int(lim.get("returned") or 0)
    resp.limits.truncated = bool(lim.get("truncated"))


def to_proto(op: str, d: dict[str, Any], workspace: str, ops: DocGraphOps | None = None) -> Any:  # noqa: C901 - one branch per document-graph operation's answer shape
    """Convert a DocGraphOps answer into its response message; every fact keeps its address."""
    resp = _RESPONSES[op]()
    _envelope(resp, d, workspace)
    if op == "themes":
        resp.themes.extend(_theme(t, workspace) for t in d.get("themes", []))
    elif op == "entity_neighbors":
        if d.get("entity"):
            resp.entity.CopyFrom(_entity_ref(d["entity"], workspace))
        for n in d.get("neighbors", []):
            nb = docgraph_pb2.Neighbor(
                id=n.get("entity_id") or n.get("theme_id") or "",
                name=n.get("name") or n.get("title") or "",
                kind=n.get("kind", ""),
                weight=float(n.get("weight") or 0),
                depth=int(n.get("depth") or 0),
                relation=n.get("relation") or ("theme_member" if n.get("kind") == "theme" else ""),
                direction=n.get("direction") or "",
                via_id=n.get("via_entity_id") or "",
            )
            addr = _address(n, workspace)
            if addr is not None:
                nb.address.CopyFrom(addr)
            resp.neighbors.append(nb)
    elif op == "doc_relations":
        for r in d.get("relations", []):
            rel = docgraph_pb2.DocRelation(
                to=r["to"],
                kind="shares_entities",
                weight=float(r.get("weight") or 0),
            )
            setattr(rel, "from", r["from"])
            rel.via_entities.extend(
                _entity_ref(v, workspace, v.get("from_address"), v.get("to_address"))
                for v in r.get("via_entities", [])
            )
            rel.citations.extend(
                a for a in (_address(c, workspace) for c in r.get("citations", [])) if a is not None
            )
            resp.relations.append(rel)
    elif op == "global_overview":
        counts = d.get("counts") or {}
        for key in ("documents", "chunks", "entities", "relations", "themes", "summaries"):
            setattr(resp, key, int(counts.get(key) or 0))
        resp.top_themes.extend(_theme(t, workspace) for t in d.get("top_themes", []))
        resp.top_entities.extend(_entity_ref(e, workspace) for e in d.get("top_entities", []))
        resp.degraded = bool(d.get("degraded"))
        if resp.degraded:
            resp.degradation_reason = d.get("reason") or "layer incomplete"
    elif op == "search_levels":
        kw = d.get("keywords") or {}
        resp.high_level.extend(kw.get("high_level") or [])
        resp.low_level.extend(kw.get("low_level") or [])
        theme_ids: list[str] = []
        # High-level hits (reached through a theme) first, then low-level ones (entities).
        for h in [*d.get("high_level", []), *d.get("low_level", [])]:
            hit = docgraph_pb2.DocHit(
                match_kind=h.get("match_kind", ""),
                score=float(h.get("score") or 0),
                theme_id=h.get("theme_id") or "",
            )
            addr = _address(h, workspace)
            if addr is not None:
                hit.address.CopyFrom(addr)
            hit.matched_entities.extend(
                _entity_ref(e, workspace) for e in h.get("matched_entities", [])
            )
            resp.items.append(hit)
            if hit.theme_id and hit.theme_id not in theme_ids:
                theme_ids.append(hit.theme_id)
        if ops is not None and theme_ids and d.get("index_rev") is not None:
            for tid in theme_ids:
                item = ops._theme_item(int(d["index_rev"]), tid, None, top=3)
                if item:
                    resp.themes.append(_theme(item, workspace))
        resp.degraded = bool(d.get("degraded"))
        if resp.degraded:
            resp.degradation_reason = d.get("reason") or "layer incomplete"
    return resp


# -- every workspace answers ------------------------------------------------------------------


def _ws_of(addr: Any) -> str:
    return str(addr.workspace) if addr is not None else ""


def _first_ws(addrs: Any) -> str:
    return next((str(a.workspace) for a in addrs), "")


def merge_answers(op: str, answers: list[tuple[str, Any]], limit: int) -> Any:  # noqa: C901 - one merge order per operation's lists
    """One response from every workspace's answer (``answers`` in root order).

    Collected answers are merged: their lists are concatenated, ordered by the operation's own
    order with the workspace as tie-break, and cut to ``limit`` (per list); counts are summed.
    Every fact keeps its address, whose ``workspace`` names where it comes from. No collected
    answer: the first one is returned as it is (it says why).
    """
    collected = [(ws, r) for ws, r in answers if r.collected]
    if not collected:
        return answers[0][1]
    if len(collected) == 1 and len(answers) == 1:
        return collected[0][1]
    out = _RESPONSES[op]()
    first = collected[0][1]
    out.op = first.op
    out.provenance = first.provenance
    out.collected = True
    out.found = any(r.found for _, r in collected)
    out.index_rev = ";".join(f"{ws}={r.index_rev}" for ws, r in collected)
    out.capability = "full" if all(r.capability == "full" for _, r in collected) else "degraded"
    reasons = [f"{ws}: {r.reason}" for ws, r in answers if r.reason]
    out.reason = "; ".join(reasons)[:2000]
    errs = [r.error for _, r in collected if r.HasField("error")]
    if errs:
        out.error.CopyFrom(errs[0])
    truncated = any(r.limits.truncated for _, r in collected)
    out.layer_provenance.extend(p for _, r in answers for p in r.layer_provenance)

    def cut(items: list[Any], key: Any) -> list[Any]:
        nonlocal truncated
        items.sort(key=key)
        truncated = truncated or len(items) > limit
        return items[:limit]

    returned = 0
    if op == "themes":
        themes = cut(
            [t for _, r in collected for t in r.themes],
            lambda t: (-t.size, _ws_of(t.address), t.theme_id),
        )
        out.themes.extend(themes)
        returned = len(themes)
    elif op == "entity_neighbors":
        origin = next(
            (r for _, r in collected if r.HasField("entity") and r.entity.entity_id), None
        )
        if origin is not None:
            out.entity.CopyFrom(origin.entity)
            # The same entity in other workspaces: its addresses there too.
            for _, r in collected:
                if r is not origin and r.entity.entity_id == origin.entity.entity_id:
                    out.entity.addresses.extend(r.entity.addresses)
        nbs = cut(
            [n for _, r in collected for n in r.neighbors],
            lambda n: (n.depth, -n.weight, n.name, _ws_of(n.address), n.id),
        )
        out.neighbors.extend(nbs)
        returned = len(nbs)
    elif op == "doc_relations":
        rels = cut(
            [x for _, r in collected for x in r.relations],
            lambda x: (-x.weight, _first_ws(x.citations), getattr(x, "from"), x.to),
        )
        out.relations.extend(rels)
        returned = len(rels)
    elif op == "global_overview":
        for key in ("documents", "chunks", "entities", "relations", "themes", "summaries"):
            setattr(out, key, sum(int(getattr(r, key)) for _, r in collected))
        themes = cut(
            [t for _, r in collected for t in r.top_themes],
            lambda t: (-t.size, _ws_of(t.address), t.theme_id),
        )
        ents = cut(
            [e for _, r in collected for e in r.top_entities],
            lambda e: (-e.mentions, e.name, _first_ws(e.addresses), e.entity_id),
        )
        out.top_themes.extend(themes)
        out.top_entities.extend(ents)
        returned = len(themes) + len(ents)
    elif op == "search_levels":
        out.high_level.extend(first.high_level)
        out.low_level.extend(first.low_level)
        hits = [h for _, r in collected for h in r.items]
        high = cut(
            [h for h in hits if h.match_kind == "theme"],
            lambda h: (-h.score, _ws_of(h.address), h.address.path, h.address.start_line),
        )
        low = cut(
            [h for h in hits if h.match_kind != "theme"],
            lambda h: (-h.score, _ws_of(h.address), h.address.path, h.address.start_line),
        )
        out.items.extend(high + low)
        wanted = {h.theme_id for h in high}
        out.themes.extend(t for _, r in collected for t in r.themes if t.theme_id in wanted)
        returned = len(high) + len(low)
    if op in ("global_overview", "search_levels"):
        out.degraded = any(r.degraded for _, r in collected)
        if out.degraded:
            out.degradation_reason = "; ".join(
                f"{ws}: {r.degradation_reason}" for ws, r in collected if r.degraded
            )[:2000]
    out.found = returned > 0 if op != "global_overview" else out.found
    out.limits.requested = limit
    out.limits.returned = returned
    out.limits.truncated = truncated
    return out


# -- request validation ----------------------------------------------------------------------


def _limit(op: str, value: int) -> int:
    default, high = _LIMITS[op]
    if value == 0:
        return default
    if not 1 <= value <= high:
        raise InvalidRequest(
            f"limit: must be between 1 and {high} (0 = default {default})",
            metadata={"field": "limit"},
        )
    return value


def validate(op: str, req: Any) -> dict[str, Any]:
    """Request message -> DocGraphOps keyword arguments; out-of-range input names its field."""
    if op not in _RESPONSES:
        raise InvalidRequest(
            f"op: unknown document graph operation {op!r}", metadata={"field": "op"}
        )
    limit = _limit(op, int(req.limit))
    if op == "themes":
        if len(req.scope) > 4096 or "\x00" in req.scope:
            raise InvalidRequest("scope: expected a path prefix", metadata={"field": "scope"})
        return {"scope": req.scope, "limit": limit}
    if op == "entity_neighbors":
        entity = req.entity.strip()
        if not entity or len(entity) > 500:
            raise InvalidRequest(
                "entity: a name or id (1..500 characters) is required", metadata={"field": "entity"}
            )
        depth = int(req.depth) or 1
        if not 1 <= depth <= 3:
            raise InvalidRequest("depth: must be between 1 and 3", metadata={"field": "depth"})
        kind = req.kind or "entity"
        if kind not in ("entity", "theme"):
            raise InvalidRequest("kind: must be 'entity' or 'theme'", metadata={"field": "kind"})
        return {"entity": entity, "depth": depth, "kind": kind, "limit": limit}
    if op == "doc_relations":
        doc, entity = req.doc.strip(), req.entity.strip()
        if bool(doc) == bool(entity):
            raise InvalidRequest(
                "doc: give exactly one of doc or entity", metadata={"field": "doc"}
            )
        if len(doc) > 4096 or len(entity) > 500:
            raise InvalidRequest(
                "entity: too long" if entity else "doc: too long",
                metadata={"field": "entity" if entity else "doc"},
            )
        return {"doc": doc or None, "entity": entity or None, "limit": limit}
    if op == "global_overview":
        return {"limit": limit}
    query = req.query.strip()
    if not query or len(req.query) > 2000:
        raise InvalidRequest("query: 1..2000 characters required", metadata={"field": "query"})
    return {"query": query, "limit": limit}


# -- the adapter -----------------------------------------------------------------------------


class DocGraphLane:
    name = "docgraph"

    def __init__(
        self,
        data_dir: Path,
        llm_settings: LLMSettings | None = None,
        *,
        code: DocumentSource,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.code = code
        self.llm_settings = (
            llm_settings if llm_settings is not None and llm_settings.configured else None
        )
        self._writer = DocGraphStore(self.data_dir)
        self._write_lock = WriterLock(data_dir, "docgraph")
        # Readers stop a query at the caller's deadline (operations run in deadline.off_loop).
        self._readers: Pool[DocGraphStore] = Pool(lambda: _bound(DocGraphStore(self.data_dir)))
        self._llm: LLMClient | None = make_client(self.llm_settings)

    def close(self) -> None:
        self._readers.close_all(lambda s: s.close())
        self._writer.close()
        if self._llm is not None:
            self._llm.close()

    # -- inputs ------------------------------------------------------------------------------

    def _read_chunks(self, root: str) -> tuple[str, list[DocChunk]]:
        """The current code revision of ``root`` and its document chunks, from the code lane."""
        rev, records = self.code.document_chunks(root, DOC_LANGUAGES)
        return rev, [
            DocChunk(
                chunk_id=c.chunk_id,
                path=c.path,
                start_line=c.start_line,
                end_line=c.end_line,
                text=c.text,
                language=c.language,
                source_kind=c.source_kind,
                content_hash=c.content_hash,
            )
            for c in records
        ]

    # -- BuildDocGraph -----------------------------------------------------------------------

    def build_sync(  # noqa: C901 - estimate and build share the scope and lock; the counters are flat
        self,
        root: str | None,
        estimate: bool,
        max_chunks: int,
        budget_seconds: float,
        structural_only: bool,
        progress: ProgressFn,
        scope: tuple[str, ...] | None = None,
    ) -> index_service_pb2.OperationSummary:
        started = time.perf_counter()
        if max_chunks < 0:
            raise InvalidRequest(
                "max_chunks: must be >= 0 (0 = no cap)", metadata={"field": "max_chunks"}
            )
        if budget_seconds < 0:
            raise InvalidRequest(
                "budget_seconds: must be >= 0 (0 = no budget)", metadata={"field": "budget_seconds"}
            )
        if root is not None and not _in_scope(root, scope):
            raise PermissionDenied("root: outside the workspaces this principal may manage")
        indexed = self.code.indexed_roots()
        if root is not None:
            if root not in indexed:
                raise FailedPrecondition(
                    f"root: {root} has not been indexed; run IndexWorkspace first"
                )
            roots = [root]
        else:
            roots = [r for r in indexed if _in_scope(r, scope)]
            if not roots:
                raise FailedPrecondition(
                    "no workspace in scope has been indexed yet; run IndexWorkspace first"
                )
        inputs = []
        for i, r in enumerate(roots):
            progress("read", i, len(roots), r)
            inputs.append((r, *self._read_chunks(r)))

        use_llm = not structural_only and self._llm is not None
        settings = BuildSettings(
            use_llm=use_llm,
            summaries=use_llm,
            max_chunks=max_chunks or None,
            budget_seconds=float(budget_seconds) or None,
        )
        llm = None if structural_only else self._llm
        summary = index_service_pb2.OperationSummary()
        revs: list[str] = []
        with self._write_lock:
            builder = DocGraphBuilder(self._writer, llm, settings)
            if estimate:
                for key in ("chunks_to_process", "expected_calls", "cached"):
                    summary.counters[key] = 0
                for r, _src, chunks in inputs:
                    est = builder.estimate(chunks)
                    summary.counters["chunks_to_process"] += est.chunks_to_process
                    summary.counters["expected_calls"] += est.expected_calls
                    summary.counters["cached"] += est.cached
                    cur = self._writer.current_rev(r)
                    revs.append(layer_rev(cur["rev_id"] if cur else None))
                summary.counters["workspaces"] = len(inputs)
            else:
                keys = (
                    "documents",
                    "chunks",
                    "entities",
                    "relations",
                    "themes",
                    "summaries",
                    "llm_calls",
                    "cached_chunks",
                    "processed_chunks",
                    "pending_chunks",
                )
                for key in keys:
                    summary.counters[key] = 0
                for i, (r, src, chunks) in enumerate(inputs):
                    progress("build", i, len(inputs), r)
                    report = builder.build(chunks, workspace=r, source_index_rev=src)
                    for key in keys:
                        summary.counters[key] += int(getattr(report, key))
                    summary.changed = summary.changed or not report.noop
                    revs.append(layer_rev(report.rev_id))
                    if report.stopped_by and not summary.stopped_by:
                        summary.stopped_by = report.stopped_by
                    if report.reason:
                        code = (
                            report.reason.split(":", 1)[0]
                            if report.reason.startswith("LLM_")
                            else "DOCGRAPH_DEGRADED"
                        )
                        summary.problems.add(
                            code=code, lane=self.name, message=f"{r}: {report.reason}"
                        )
                    for key, n in sorted(report.counters.items()):
                        summary.counters[f"extract_{key}"] += int(n)
                summary.counters["workspaces"] = len(inputs)
                progress("build", len(inputs), len(inputs), "")
        summary.index_rev = (
            revs[0]
            if len(revs) == 1
            else ";".join(f"{r}={rev}" for (r, _s, _c), rev in zip(inputs, revs, strict=True))
        )
        summary.ms = round((time.perf_counter() - started) * 1000, 1)
        return summary

    # -- DocGraphService ---------------------------------------------------------------------

    def _workspaces(self, store: DocGraphStore, scope: tuple[str, ...] | None) -> list[str]:
        return [
            r[0]
            for r in store.rows("SELECT DISTINCT workspace FROM layer_rev ORDER BY workspace")
            if _in_scope(r[0], scope)
        ]

    def op_sync(self, op: str, req: Any, scope: tuple[str, ...] | None) -> Any:
        kwargs = validate(op, req)
        with self._readers.get() as store:
            workspaces = self._workspaces(store, scope)
            if op == "themes" and kwargs["scope"].startswith("/"):
                # An absolute scope picks its workspace and becomes a prefix inside it.
                wanted = os.path.normpath(kwargs["scope"])
                workspaces = [w for w in workspaces if is_under(wanted, w)][-1:]
                if workspaces:
                    kwargs["scope"] = (
                        os.path.relpath(wanted, workspaces[0]) if wanted != workspaces[0] else ""
                    )
            if not workspaces:
                resp = _RESPONSES[op](
                    op=op,
                    capability="degraded",
                    provenance=PROVENANCE,
                    collected=False,
                    reason=NOT_BUILT_REASON,
                )
                resp.limits.requested = kwargs["limit"]
                return resp
            answers = []
            for ws in workspaces:
                ops = DocGraphOps(store, self._llm, workspace=ws)
                d = getattr(ops, op)(**kwargs)
                answers.append((ws, to_proto(op, d, ws, ops)))
            return merge_answers(op, answers, kwargs["limit"])

    # -- Search mode=docs|themes ---------------------------------------------------------------

    def layer_revisions(self) -> tuple[tuple[str, int], ...]:
        """Every workspace's current layer revision: part of Search's cache key."""
        with self._readers.get() as store:
            return tuple(
                (str(r[0]), int(r[1]))
                for r in store.rows(
                    "SELECT workspace, max(rev_id) FROM layer_rev GROUP BY workspace "
                    "ORDER BY workspace"
                )
            )

    def match_sync(
        self,
        query: str,
        level: str,
        scope: tuple[str, ...] | None,
        limit: int,
        until: float | None = None,
    ) -> dict[str, Any]:
        """Chunks every layer in scope reaches for ``query`` (``DocGraphOps._match_chunks``),
        merged by score, then workspace, path and line; ``built`` is false when no layer in
        scope is collected. ``until`` bounds the model's keyword call (``time.monotonic()``):
        a search that stopped waiting does not hold a thread of the graph's pool for the
        endpoint's minutes."""
        items: list[dict[str, Any]] = []
        reasons: list[str] = []
        built = False
        with self._readers.get() as store:
            for ws in self._workspaces(store, scope):
                ans = DocGraphOps(store, self._llm, workspace=ws)._match_chunks(
                    query, level, limit, until
                )
                if not ans["collected"]:
                    continue
                built = True
                if ans["reason"]:
                    reasons.append(f"{ws}: {ans['reason']}")
                for it in ans["items"]:
                    items.append({**it, "workspace": ws})
        items.sort(key=_hit_key)
        return {"built": built, "reason": "; ".join(reasons) or None, "items": items[:limit]}

    # -- GetStatus ---------------------------------------------------------------------------

    def status(self, scope: tuple[str, ...] | None) -> index_service_pb2.LaneStatus:
        st = index_service_pb2.LaneStatus(lane=self.name, capability="full")
        with self._readers.get() as store:
            workspaces = self._workspaces(store, scope)
            revs, reasons = [], []
            totals = dict.fromkeys(
                ("documents", "chunks", "entities", "relations", "themes", "summaries"), 0
            )
            for ws in workspaces:
                cur = store.current_rev(ws)
                if cur is None:
                    continue
                rev = layer_rev(cur["rev_id"])
                revs.append(rev if len(workspaces) == 1 else f"{ws}={rev}")
                stats = cur["stats"]
                for key in totals:
                    totals[key] += int(stats.get(key) or 0)
                if not (stats.get("complete") and stats.get("llm_state") == "ok"):
                    reasons.append(f"{ws}: {stats.get('reason') or 'incomplete layer'}")
        st.index_rev = ";".join(revs)
        st.counts["workspaces"] = len(revs)
        for key, n in totals.items():
            st.counts[key] = n
        if not revs:
            reasons.append("the document graph has not been built yet")
        if reasons:
            st.degraded = True
            st.capability = "degraded"
            st.reason = "; ".join(reasons)[:1000]
        return st


# -- Search mode=docs|themes through the graph -----------------------------------------------


def _hit_key(item: dict[str, Any]) -> tuple[Any, ...]:
    return (-float(item.get("score") or 0), item["workspace"], item["path"], item["start_line"])


class GraphDocsLane:
    """The code lane as Search sees it, with ``mode=docs|themes`` answered through the graph.

    Other modes go to the code lane unchanged. In ``mode=docs`` the code lane's document
    chunks (lexical and vector match) and the chunks the graph reaches (entities named by the
    query, then its themes) are fused by reciprocal rank; in ``mode=themes`` the chunks reached
    through themes come first, each with ``theme_id``. Every item says how it was reached
    (``match_kind``: ``entity``, ``theme`` or ``lexical``) and which entities it matched, each
    with the address of its mention. Every workspace in the caller's scope with a layer
    answers; hits are merged by score, then workspace, path and line.

    Degraded (the code lane's "plain retrieval" reason) only when no layer in scope is built or
    the licence lacks the document graph; also degraded, with the reason, when a layer is
    incomplete or a configured LLM could not split the query into keywords.
    """

    name = "code"

    def __init__(
        self, code: contract.CodeLane, graph: contract.DocGraphLane, allowed: Callable[[], bool]
    ) -> None:
        self.code = code
        self.graph = graph
        self._allowed = allowed  # () -> bool: the licence has the document graph
        # Graph matches that ran out of time: part of the revision, so an answer made without
        # the graph is not served from the cache once the graph may answer again.
        self._timeouts = 0

    def revision(self) -> Hashable | None:
        base = self.code.revision()
        if base is None:
            return None
        return base, bool(self._allowed()), self.graph.layer_revisions(), self._timeouts

    async def search(self, q: LaneQuery) -> LaneResult:
        if not q.docs_only or not q.docs_mode or not self._allowed():
            return await self.code.search(q)
        # The text match first, undisturbed (run side by side, the graph's Python work slowed
        # it past the lane's timeout on a loaded machine, losing the whole lane).
        result = await self.code.search(q)
        # The graph match gets what is left of the lane's time but a margin for merging;
        # past it the lane answers the text matches, degraded, and says why.
        lane_deadline = LANE_DEADLINE.get()
        wait = None if lane_deadline is None else (lane_deadline - time.monotonic()) * 0.6
        try:
            if wait is not None and wait <= 0.005:
                raise TimeoutError
            task = asyncio.ensure_future(
                deadline.off_loop(
                    self.graph.match_sync,
                    q.query,
                    q.docs_mode,
                    q.workspaces,
                    q.top_k,
                    None if wait is None else time.monotonic() + wait,
                    pool="docgraph",
                )
            )
            done, _ = await asyncio.wait({task}, timeout=wait)
            if not done:
                # Left to finish (its reads stop at the deadline); its outcome is not used.
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
                raise TimeoutError
            match = task.result()
        except TimeoutError:
            self._timeouts += 1
            result.warnings.append(
                errors_pb2.Notice(
                    code="KNOWLEDGE_LANE_DEGRADED",
                    lane="code",
                    message="document graph match did not finish within the lane's time",
                )
            )
            result.lane.degradation_reason += "; DOCGRAPH_TIMEOUT: graph match not in time"
            return result
        if not match["built"]:
            return result
        return self._merge(result, match, q)

    def _graph_only_item(self, gi: dict[str, Any], q: LaneQuery) -> search_pb2.CodeItem | None:
        try:
            chunk = self.code.get_chunk_sync(gi["chunk_id"], (gi["workspace"],)).chunk
        except NotFound:
            return None
        item = search_pb2.CodeItem(
            id=chunk.id,
            chunk_id=chunk.chunk_id,
            path=chunk.path,
            start_line=chunk.start_line,
            end_line=chunk.end_line,
            source_kind=chunk.source_kind,
            provenance="stated",
            language=chunk.language,
            workspace=chunk.workspace,
            why=[f"graph: {m['name']}" for m in gi["matched_entities"][:3]],
        )
        if q.with_text:
            item.snippet = chunk.text[: q.snippet_chars]
        return item

    def _merge(self, result: LaneResult, match: dict[str, Any], q: LaneQuery) -> LaneResult:
        lane = cast(search_pb2.CodeLane, result.lane)  # the documents lane is a code lane
        lexical = list(lane.items)
        # ``filters.paths`` holds for what the graph brings as it does for the text match
        # (a path starting with one of the prefixes, as the code lane reads them).
        graph_items: list[dict[str, Any]] = [
            gi
            for gi in match["items"]
            if not q.paths or any(str(gi["path"]).startswith(p) for p in q.paths)
        ]
        by_chunk = {(i["workspace"], i["chunk_id"]): i for i in graph_items}
        rrf: dict[tuple[str, str], float] = {}
        for rank, it in enumerate(lexical, 1):
            key = (it.workspace, it.chunk_id)
            rrf[key] = rrf.get(key, 0.0) + 1.0 / (60 + rank)
        # mode=docs: the graph's ranking counts a tenth of the text match's (it confirms and
        # annotates text matches, breaks near-ties, and adds the chunks the words alone miss
        # after them); mode=themes: theme evidence leads, the text matches follow it.
        weight, boost = (1.0, 1.0) if q.docs_mode == "themes" else (GRAPH_WEIGHT, 0.0)
        for rank, gi in enumerate(graph_items, 1):
            key = (gi["workspace"], gi["chunk_id"])
            rrf[key] = rrf.get(key, 0.0) + weight / (60 + rank) + boost
        items: dict[tuple[str, str], search_pb2.CodeItem] = {}
        for it in lexical:
            items.setdefault((it.workspace, it.chunk_id), it)
        order = sorted(
            rrf,
            key=lambda k: (
                -rrf[k],
                k[0],
                items[k].path if k in items else by_chunk[k]["path"],
                k[1],
            ),
        )
        ranked: list[tuple[str, str]] = []
        for key in order:
            if len(ranked) >= q.top_k:
                break
            if key not in items:  # reached through the graph only: read the chunk (kept ones)
                item = self._graph_only_item(by_chunk[key], q)
                if item is None:
                    continue  # the code index moved on since the layer was built
                items[key] = item
            ranked.append(key)
        del lane.items[:]
        for key in ranked:
            it = items[key]
            found = by_chunk.get(key)
            it.score = round(rrf.get(key, 0.0), 6)
            if found is None:
                it.match_kind = "lexical"
            else:
                it.match_kind = found["match_kind"]
                it.theme_id = found.get("theme_id") or ""
                for m in found["matched_entities"]:
                    address = _address(m, found["workspace"])
                    it.matched_entities.append(
                        docgraph_pb2.EntityRef(
                            entity_id=m["entity_id"],
                            name=m["name"],
                            kind=m["kind"],
                            addresses=[address] if address else [],
                        )
                    )
            lane.items.append(it)
        # The graph answered: the lane is no longer plain retrieval.
        rest = lane.degradation_reason.replace(DOCS_PLAIN_REASON, "").strip("; ")
        parts = [rest] if rest else []
        if match["reason"]:
            parts.append(f"DOCGRAPH_DEGRADED: {match['reason']}")
        lane.degradation_reason = "; ".join(parts)
        lane.degraded = bool(parts)
        keep = [w for w in result.warnings if w.message != DOCS_PLAIN_MESSAGE]
        del result.warnings[:]
        result.warnings.extend(keep)
        if match["reason"]:
            result.warnings.append(
                errors_pb2.Notice(
                    code="KNOWLEDGE_LANE_DEGRADED", lane="code", message=match["reason"][:300]
                )
            )
        if lane.items:
            lane.empty_reason = ""
        return result
