"""The document graph (Enterprise) behind DocGraphService and IndexService.BuildDocGraph.

Input chunks come from the code lane, which owns ``code.sqlite`` (``CodeLane.document_chunks``:
the current revision of each workspace, document chunks only); the layer lives in
``docgraph.sqlite`` (owned by :mod:`knowledge_server.docgraph`). The edition gate is the
transport's job.

Workspaces: each workspace has its own layer. An operation queries every workspace in the
caller's scope that has a layer, in root order, and answers from the first one with a result
(``found``); failing that, the first one whose layer is collected; failing that, the first one.
Every address carries its workspace, so the caller can tell where an answer came from.
A workspace is in scope only when it lies at or under one of the caller's roots.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from knowledge_server._gen.knowledge.v1 import docgraph_pb2, errors_pb2, index_service_pb2
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
from knowledge_server.errors import FailedPrecondition, InvalidRequest, PermissionDenied
from knowledge_server.lanes.common import Pool, ProgressFn, WriterLock, bound_reader
from knowledge_server.lanes.contract import DocumentSource
from knowledge_server.workspaces import is_under

PROVENANCE = "stated"
# Languages the code lane gives document files (the graph never reads code chunks).
DOC_LANGUAGES = ("markdown", "md", "text", "txt", "rst", "asciidoc", "org")
NOT_BUILT_REASON = "DOCGRAPH_NOT_BUILT: document graph layer not built"

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
                answers.append((ws, d, ops))
                if d.get("found"):
                    break
            ws, d, ops = next(
                (a for a in answers if a[1].get("found")),
                next((a for a in answers if a[1].get("collected")), answers[0]),
            )
            return to_proto(op, d, ws, ops)

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
