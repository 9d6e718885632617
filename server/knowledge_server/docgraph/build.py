"""Building a document graph revision: LLM pass (cached), structural pass, themes, summaries.

A revision is rebuilt only when its fingerprint (chunk addresses and hashes, model, prompt
versions, temperature, settings, structural extractor version) changes; a changed fingerprint
writes a ``drift`` entry. A run stopped by its chunk cap, its time budget or an unavailable LLM
writes an *incomplete* revision that says why; the next run resumes from the cache.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ..redact import redact
from .extract import (
    ChunkResult,
    ExtractionSettings,
    MentionFact,
    RelationFact,
    extract_chunk,
    extraction_cache_key,
    unfence,
)
from .llm import NOT_CONFIGURED_REASON, LLMClient, LLMUnavailable
from .model import (
    DocChunk,
    entity_id_for,
    is_doc_chunk,
    line_span,
    norm_name,
    quote_hash,
    rel_id_for,
)
from .prompts import (
    KEYWORDS_PROMPT_VERSION,
    PROMPT_VERSION,
    SUMMARY_PROMPT_VERSION,
    summary_messages,
)
from .store import DocGraphStore
from .structural import STRUCTURAL_VERSION, extract_structural
from .themes import Theme, ThemeEntity, ThemeSettings, build_themes

__all__ = ["BuildReport", "BuildSettings", "DocGraphBuilder", "Estimate"]


@dataclass(frozen=True, slots=True)
class BuildSettings:
    use_llm: bool = True
    structural: bool = True
    summaries: bool = True
    extraction: ExtractionSettings = field(default_factory=ExtractionSettings)
    themes: ThemeSettings = field(default_factory=ThemeSettings)
    max_chunks: int | None = None  # LLM-processed (uncached) chunks per run
    budget_seconds: float | None = None  # wall time for the LLM pass of one run


class Estimate(NamedTuple):
    chunks_to_process: int  # non-code chunks the layer covers
    expected_calls: int  # LLM calls this run would make (after cache and cap)
    cached: int  # chunks already answered by the cache


@dataclass(slots=True)
class BuildReport:
    rev_id: int | None
    noop: bool
    fingerprint: str
    complete: bool
    stopped_by: str | None  # None | "budget" | "max_chunks" | "llm_unavailable"
    llm_state: str  # "ok" | "not_configured" | "unavailable" | "disabled"
    reason: str | None
    documents: int = 0
    chunks: int = 0
    entities: int = 0
    relations: int = 0
    themes: int = 0
    summaries: int = 0
    llm_calls: int = 0
    cached_chunks: int = 0
    processed_chunks: int = 0
    pending_chunks: int = 0
    drift: bool = False
    counters: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _h(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


class DocGraphBuilder:
    def __init__(
        self,
        store: DocGraphStore,
        llm: LLMClient | None,
        settings: BuildSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.llm = llm
        self.settings = settings or BuildSettings()
        self._clock = clock
        self._now = now or (lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    # --- inputs -------------------------------------------------------------------------------

    @property
    def _llm_active(self) -> bool:
        return self.llm is not None and self.settings.use_llm

    @property
    def model_identity(self) -> str:
        return self.llm.settings.identity if self._llm_active else "none"  # type: ignore[union-attr]

    @property
    def temperature(self) -> float:
        return self.llm.settings.temperature if self._llm_active else 0.0  # type: ignore[union-attr]

    @staticmethod
    def doc_chunks(chunks: list[DocChunk]) -> list[DocChunk]:
        unique = {c.chunk_id: c for c in chunks if is_doc_chunk(c)}
        return sorted(unique.values(), key=lambda c: (c.path, c.start_line, c.chunk_id))

    def fingerprint_inputs(self, chunks: list[DocChunk]) -> dict[str, Any]:
        s = self.settings
        return {
            "chunks": _h(
                [[c.chunk_id, c.path, c.start_line, c.end_line, c.content_hash] for c in chunks]
            ),
            "model": self.model_identity,
            "prompt_version": [PROMPT_VERSION, SUMMARY_PROMPT_VERSION, KEYWORDS_PROMPT_VERSION],
            "temperature": self.temperature,
            "settings": _h(
                [s.use_llm, s.structural, s.summaries, asdict(s.extraction), asdict(s.themes)]
            ),
            "structural_version": STRUCTURAL_VERSION if s.structural else "off",
        }

    def _key(self, chunk: DocChunk) -> str:
        return extraction_cache_key(
            chunk, self.model_identity, self.temperature, self.settings.extraction
        )

    def estimate(self, chunks: list[DocChunk]) -> Estimate:
        """How much work a run would be, before spending anything.

        ``expected_calls`` counts extraction calls: chunks with identical content share one call.
        Theme summaries add at most ``themes.max_summaries`` calls on top.
        """
        docs = self.doc_chunks(chunks)
        if not self._llm_active:
            return Estimate(len(docs), 0, 0)
        keys = [self._key(c) for c in docs]
        found = self.store.cache_has_many(keys)
        cached = sum(1 for k in keys if k in found)
        todo = len({k for k in keys if k not in found})
        if self.settings.max_chunks is not None:
            todo = min(todo, self.settings.max_chunks)
        return Estimate(len(docs), todo, cached)

    # --- the run ------------------------------------------------------------------------------

    def build(
        self,
        chunks: list[DocChunk],
        *,
        workspace: str = "",
        source_index_rev: str = "",
        force: bool = False,
    ) -> BuildReport:
        """Build the layer of one workspace (its chunks only) into a new revision, if needed."""
        s = self.settings
        docs = self.doc_chunks(chunks)
        inputs = self.fingerprint_inputs(docs)
        fp = _h(inputs)
        prev = self.store.current_rev(workspace)
        if prev and prev["fingerprint"] == fp and prev["stats"].get("complete") and not force:
            st = prev["stats"]
            return BuildReport(
                rev_id=prev["rev_id"],
                noop=True,
                fingerprint=fp,
                complete=True,
                stopped_by=None,
                llm_state=st["llm_state"],
                reason=st.get("reason"),
                documents=st["documents"],
                chunks=st["chunks"],
                entities=st["entities"],
                relations=st["relations"],
                themes=st["themes"],
                summaries=st["summaries"],
                counters=st.get("counters", {}),
            )

        counters: Counter[str] = Counter()
        mentions: list[MentionFact] = []
        relations: list[RelationFact] = []
        stopped_by: str | None = None
        reason: str | None = None
        cached = processed = pending = 0
        calls_before = self.llm.calls if self.llm else 0
        if self.llm is None:
            llm_state, reason = "not_configured", NOT_CONFIGURED_REASON
        elif not s.use_llm:
            llm_state, reason = "disabled", "LLM pass disabled by settings"
        else:
            llm_state = "ok"
            t0 = self._clock()
            for chunk in docs:
                key = self._key(chunk)
                hit = self.store.cache_get(key)
                if hit is not None:
                    res = ChunkResult.from_cache_json(chunk, hit)
                    cached += 1
                elif stopped_by is not None:
                    pending += 1
                    continue
                elif s.max_chunks is not None and processed >= s.max_chunks:
                    stopped_by, pending = "max_chunks", pending + 1
                    continue
                elif s.budget_seconds is not None and self._clock() - t0 >= s.budget_seconds:
                    stopped_by, pending = "budget", pending + 1
                    continue
                else:
                    try:
                        res = extract_chunk(self.llm, chunk, s.extraction)
                    except LLMUnavailable as exc:
                        stopped_by, llm_state, reason = "llm_unavailable", "unavailable", exc.reason
                        pending += 1
                        continue
                    self.store.cache_put(key, res.to_cache_json())  # durable: a rerun resumes
                    processed += 1
                mentions.extend(res.mentions)
                relations.extend(res.relations)
                counters.update(res.counters)
            if stopped_by in ("budget", "max_chunks"):
                reason = (
                    f"extraction stopped by {stopped_by}: {pending} of {len(docs)} chunks pending"
                )
        if s.structural:
            st_res = extract_structural(docs)
            mentions.extend(st_res.mentions)
            relations.extend(st_res.relations)
            counters.update(st_res.counters)

        by_id = {c.chunk_id: c for c in docs}
        tables, entity_meta, chunk_entities = _aggregate(by_id, mentions, relations)
        themes = build_themes(
            entity_meta, chunk_entities, s.themes, documents=len({c.path for c in docs})
        )
        summaries: list[tuple[Any, ...]] = []
        if llm_state == "ok" and s.summaries and self.llm is not None:
            summaries, s_state, s_reason = self._summaries(
                self.llm, themes, entity_meta, chunk_entities, by_id, counters
            )
            if s_state != "ok":
                llm_state, reason = s_state, s_reason
                stopped_by = stopped_by or "llm_unavailable"
        tables["theme"] = [
            (t.theme_id, t.title, t.seed_entity_id, t.size, "cooccurrence") for t in themes
        ]
        tables["theme_member"] = [(t.theme_id, e, w) for t in themes for e, w in t.members]
        tables["theme_summary"] = summaries
        tables["doc_chunk"] = [
            (c.chunk_id, c.path, c.start_line, c.end_line, c.content_hash) for c in docs
        ]

        complete = stopped_by is None
        stats = {
            "complete": complete,
            "stopped_by": stopped_by,
            "llm_state": llm_state,
            "reason": reason,
            "model": self.model_identity,
            "prompt_version": PROMPT_VERSION,
            "prompt_versions": inputs["prompt_version"]
            + ([STRUCTURAL_VERSION] if s.structural else []),
            "inputs": inputs,
            "documents": len({c.path for c in docs}),
            "chunks": len(docs),
            "entities": len(tables["entity"]),
            "llm_entities": sum(1 for r in tables["entity"] if "llm" in r[6]),
            "relations": len(tables["entity_relation"]),
            "themes": len(themes),
            "summaries": len(summaries),
            "pending_chunks": pending,
            "counters": dict(sorted(counters.items())),
        }
        drift = None
        if prev is not None and prev["fingerprint"] != fp:
            old = prev["stats"].get("inputs", {})
            drift = {"changed": sorted(k for k in inputs if old.get(k) != inputs[k])}
        rev_id = self.store.write_revision(
            workspace=workspace,
            source_index_rev=source_index_rev,
            fingerprint=fp,
            created_at=self._now(),
            stats=stats,
            tables=tables,
            drift_changes=drift,
        )
        return BuildReport(
            rev_id=rev_id,
            noop=False,
            fingerprint=fp,
            complete=complete,
            stopped_by=stopped_by,
            llm_state=llm_state,
            reason=reason,
            documents=stats["documents"],
            chunks=len(docs),
            entities=stats["entities"],
            relations=stats["relations"],
            themes=len(themes),
            summaries=len(summaries),
            llm_calls=(self.llm.calls - calls_before) if self.llm else 0,
            cached_chunks=cached,
            processed_chunks=processed,
            pending_chunks=pending,
            drift=drift is not None,
            counters=stats["counters"],
        )

    def _summaries(
        self,
        llm: LLMClient,
        themes: list[Theme],
        entity_meta: dict[str, ThemeEntity],
        chunk_entities: dict[str, set[str]],
        by_id: dict[str, DocChunk],
        counters: Counter[str],
    ) -> tuple[list[tuple[Any, ...]], str, str | None]:
        """LLM summaries with citations; a summary whose citations fail validation is dropped."""
        s = self.settings.themes
        out: list[tuple[Any, ...]] = []
        for theme in themes[: s.max_summaries]:
            members = {e for e, _ in theme.members}
            ranked = sorted(
                (
                    (len(members & ents), cid)
                    for cid, ents in chunk_entities.items()
                    if len(members & ents) >= 1
                ),
                key=lambda x: (-x[0], by_id[x[1]].path, by_id[x[1]].start_line, x[1]),
            )[: s.max_citable_chunks]
            citable = [
                (
                    cid,
                    f"{by_id[cid].path}:{by_id[cid].start_line}-{by_id[cid].end_line}",
                    _quote(by_id[cid].text, s.max_quote_chars),
                )
                for _, cid in ranked
            ]
            names = [entity_meta[e].norm_name for e, _ in theme.members]
            # The answer cites the chunks by the ids and addresses offered: a renamed file,
            # or the same documents in another workspace, offers others (the key holds them).
            key = "summary:" + _h(
                [
                    theme.theme_id,
                    [(by_id[c].content_hash, c, where) for c, where, _ in citable],
                    s.max_quote_chars,
                    self.model_identity,
                    SUMMARY_PROMPT_VERSION,
                    self.temperature,
                ]
            )
            content = self.store.cache_get(key)
            cached = content is not None
            if content is None:
                system, user = summary_messages(theme.title, names, citable)
                try:
                    content = llm.chat_json(system, user)
                except LLMUnavailable as exc:
                    return out, "unavailable", exc.reason
            allowed = {cid for cid, _, _ in citable}
            try:
                obj = json.loads(unfence(content))
                text = obj["summary"]
                cites = obj["citations"]
                ok = (
                    isinstance(text, str)
                    and text.strip()
                    and isinstance(cites, list)
                    and cites
                    and all(isinstance(c, str) and c in allowed for c in cites)
                )
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                # Not kept: a rejected answer served from the cache would be rejected on
                # every build, even a forced one, and never asked again.
                counters["summary_rejected"] += 1
                continue
            if not cached:
                self.store.cache_put(key, content)
            citations = [
                {
                    "chunk_id": c,
                    "path": by_id[c].path,
                    "start_line": by_id[c].start_line,
                    "end_line": by_id[c].end_line,
                }
                for c in sorted(set(cites), key=lambda c: (by_id[c].path, by_id[c].start_line, c))
            ]
            out.append(
                (
                    theme.theme_id,
                    self.model_identity,
                    SUMMARY_PROMPT_VERSION,
                    redact(text.strip()),
                    json.dumps(citations, sort_keys=True),
                )
            )
            counters["summary_accepted"] += 1
        return out, "ok", None


def _quote(text: str, limit: int) -> str:
    """The bounded, redacted quote of a chunk a summary may cite (its first ``limit``
    characters, cut at a line end when one is near)."""
    text = redact(text)
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut >= limit // 2 else limit]


def _aggregate(
    by_id: dict[str, DocChunk], mentions: list[MentionFact], relations: list[RelationFact]
) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, ThemeEntity], dict[str, set[str]]]:
    """Merge facts by deterministic ids into table rows (order-independent)."""
    surface: dict[str, Counter[str]] = defaultdict(Counter)
    kinds: dict[str, tuple[str, str]] = {}
    mention_rows: dict[tuple[str, str, int, int], list[Any]] = {}
    for m in mentions:
        chunk = by_id.get(m.chunk_id)
        if chunk is None:
            continue
        norm = norm_name(m.name)
        eid = entity_id_for(norm, m.kind)
        kinds[eid] = (norm, m.kind)
        surface[eid][m.name] += 1
        key = (eid, m.chunk_id, m.char_start, m.char_end)
        if key in mention_rows:
            row = mention_rows[key]
            row[8] = "+".join(sorted(set(row[8].split("+")) | {m.built_by}))
            continue
        sl, el = line_span(chunk, m.char_start, m.char_end)
        qh = quote_hash(chunk.text[m.char_start : m.char_end])
        mention_rows[key] = [
            eid,
            m.chunk_id,
            chunk.path,
            sl,
            el,
            m.char_start,
            m.char_end,
            qh,
            m.built_by,
        ]
    per_entity: dict[str, list[list[Any]]] = defaultdict(list)
    for row in mention_rows.values():
        per_entity[row[0]].append(row)
    entity_rows = []
    meta: dict[str, ThemeEntity] = {}
    chunk_entities: dict[str, set[str]] = defaultdict(set)
    for eid in sorted(per_entity):
        rows = per_entity[eid]
        norm, kind = kinds[eid]
        name = min(surface[eid].items(), key=lambda kv: (-kv[1], kv[0]))[0]
        first = min(rows, key=lambda r: (r[2], r[3], r[1]))
        built = "+".join(sorted({p for r in rows for p in r[8].split("+")}))
        entity_rows.append((eid, name, norm, kind, len(rows), first[2], built))
        meta[eid] = ThemeEntity(eid, norm, kind, len(rows), len({r[2] for r in rows}))
        for r in rows:
            chunk_entities[r[1]].add(eid)

    rel_groups: dict[tuple[str, str, str], dict[tuple[str, int, int], RelationFact]] = defaultdict(
        dict
    )
    for fact in relations:
        src = entity_id_for(norm_name(fact.src_name), fact.src_kind)
        dst = entity_id_for(norm_name(fact.dst_name), fact.dst_kind)
        # No mention, no fact: both ends must be mentioned entities of this layer.
        if src not in meta or dst not in meta or src == dst or fact.chunk_id not in by_id:
            continue
        rel_groups[(src, fact.kind, dst)][(fact.chunk_id, fact.char_start, fact.char_end)] = fact
    relation_rows = []
    for src, kind, dst in sorted(rel_groups):
        evid = rel_groups[(src, kind, dst)]
        best_key = min(evid, key=lambda k: (by_id[k[0]].path, by_id[k[0]].start_line, k[0], k[1]))
        chunk = by_id[best_key[0]]
        sl, el = line_span(chunk, best_key[1], best_key[2])
        qh = quote_hash(chunk.text[best_key[1] : best_key[2]])
        built = "+".join(sorted({f.built_by for f in evid.values()}))
        relation_rows.append(
            (
                rel_id_for(src, kind, dst),
                src,
                dst,
                kind,
                qh,
                chunk.chunk_id,
                chunk.path,
                sl,
                el,
                len(evid),
                built,
            )
        )
    tables: dict[str, list[tuple[Any, ...]]] = {
        "entity": entity_rows,
        "entity_mention": [
            tuple(r) for r in sorted(mention_rows.values(), key=lambda r: (r[0], r[1], r[5], r[6]))
        ],
        "entity_relation": relation_rows,
    }
    return tables, meta, dict(chunk_entities)
