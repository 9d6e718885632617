"""The fixed read-only operations of the document graph.

Every answer is the common envelope (``op``, ``index_rev``, ``capability``, ``provenance``,
``found``, ``collected``, ``reason``, ``error``, ``limits``) plus a payload, and every fact in the
payload carries ``path`` + ``start_line`` + ``end_line``. "Nothing found" (``collected=true,
found=false``) and "not collected" (``collected=false`` + ``reason``) are different answers.

Layer states and what the operations say:

* no revision yet -> ``collected=false``, ``reason="DOCGRAPH_NOT_BUILT"``;
* the LLM pass did not run (not configured / disabled) or failed (``LLM_UNAVAILABLE: ...``) and no
  facts exist -> ``collected=false`` with that reason;
* the same but structural facts exist -> answers from them, ``capability="degraded"`` and a
  reason naming the LLM state;
* a run stopped by its cap or budget -> ``capability="degraded"``, reason says how much is
  pending.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from typing import Any, cast

from ..redact import redact
from ..textlang import REQUEST_WORDS, STOP_WORDS
from .extract import unfence
from .llm import NOT_CONFIGURED_REASON, LLMClient, LLMUnavailable
from .model import norm_name
from .prompts import KEYWORDS_PROMPT_VERSION, keywords_messages
from .store import DocGraphStore

__all__ = ["INVALID_REQUEST", "NOT_BUILT", "OPS", "DocGraphOps"]

OPS = ("themes", "entity_neighbors", "doc_relations", "global_overview", "search_levels")
INVALID_REQUEST = "KNOWLEDGE_INVALID_REQUEST"
NOT_BUILT = "DOCGRAPH_NOT_BUILT: document graph layer not built"
# Classifier values ("Final", "Core") are shared by whole collections: as a "via" they would
# relate every document to every other one, so they never explain a relation.
_WEAK_KINDS = ("status", "doc_type", "category")
_MAX_LIMIT = 200
_WORD = re.compile(r"[\w][\w\-\.]*", re.UNICODE)
# Words that phrase the question rather than name what it is about.
_STOP = STOP_WORDS | REQUEST_WORDS


# The mentions of a set of entities with their chunks' lines (a WHERE clause follows).
_MENTIONS_OF = (
    "SELECT m.entity_id, m.chunk_id, m.path, m.start_line, m.end_line, c.start_line, "
    "c.end_line FROM entity_mention m JOIN doc_chunk c ON c.rev_id=m.rev_id AND "
    "c.chunk_id=m.chunk_id "
)


def _query_words(query: str) -> list[str]:
    """The words of a query that may name something (no stop or request words), without
    the sentence's punctuation at their end ("Explain EIP-2718." asks about "eip-2718")."""
    found = (w.rstrip(".-").lower() for w in _WORD.findall(query))
    return sorted({w for w in found if len(w) >= 3 and w not in _STOP})


def _addr(path: str, start: int, end: int, chunk_id: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"path": path, "start_line": start, "end_line": end}
    if chunk_id is not None:
        out["chunk_id"] = chunk_id
    return out


class DocGraphOps:
    """Read-only operations over the current revision of ``docgraph.sqlite``.

    ``llm`` is only used by :meth:`search_levels` (query keywords); ``None`` means not configured.
    ``workspace`` selects whose layer is read (each workspace has its own revisions).
    """

    def __init__(
        self, store: DocGraphStore, llm: LLMClient | None = None, *, workspace: str = ""
    ) -> None:
        self.store = store
        self.llm = llm
        self.workspace = workspace

    # --- envelope -----------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        rev = self.store.current_rev(self.workspace)
        if rev is None:
            return {"rev": None, "collected": False, "capability": "degraded", "reason": NOT_BUILT}
        st = rev["stats"]
        if st.get("llm_state") == "ok" and st.get("complete"):
            return {"rev": rev, "collected": True, "capability": "full", "reason": None}
        base = st.get("reason") or "incomplete layer"
        if st.get("entities", 0) == 0:
            return {"rev": rev, "collected": False, "capability": "degraded", "reason": base}
        if st.get("llm_entities", 0) == 0:
            base += "; structural facts only"
        return {"rev": rev, "collected": True, "capability": "degraded", "reason": base}

    def _envelope(
        self,
        op: str,
        state: dict[str, Any],
        *,
        requested: int,
        items: int,
        truncated: bool,
        found: bool | None = None,
        error: str | None = None,
        reason: str | None = None,
        capability: str | None = None,
        collected: bool | None = None,
        **payload: Any,
    ) -> dict[str, Any]:
        rev = state["rev"]
        provenance: dict[str, Any] = {"layer": "docgraph", "workspace": self.workspace}
        if rev is not None:
            provenance.update(
                fingerprint=rev["fingerprint"],
                source_index_rev=rev["source_index_rev"],
                model=rev["stats"].get("model"),
                prompt_version=rev["stats"].get("prompt_version"),
                prompt_versions=rev["stats"].get("prompt_versions")
                or rev["stats"].get("inputs", {}).get("prompt_version")
                or [],
                built_at=rev["created_at"],
            )
        is_collected = state["collected"] if collected is None else collected
        return {
            "op": op,
            "index_rev": rev["rev_id"] if rev else None,
            "capability": capability or state["capability"],
            "provenance": provenance,
            "found": bool(items) if found is None else found,
            "collected": is_collected,
            "reason": reason if reason is not None else state["reason"],
            "error": error,
            # For operations with two lists (levels, themes + entities) the limit applies to
            # each list and ``returned`` counts both.
            "limits": {"requested": requested, "returned": items, "truncated": truncated},
            **payload,
        }

    def _refuse(self, op: str, state: dict[str, Any], limit: int, **empty: Any) -> dict[str, Any]:
        return self._envelope(
            op, state, requested=limit, items=0, truncated=False, found=False, **empty
        )

    @staticmethod
    def _limit(limit: int) -> int | None:
        return limit if isinstance(limit, int) and 1 <= limit <= _MAX_LIMIT else None

    # --- lookups ------------------------------------------------------------------------------

    def _first_mention(
        self, rev_id: int, entity_id: str, scope: str | None = None
    ) -> dict[str, Any] | None:
        sql = (
            "SELECT path, start_line, end_line, chunk_id FROM entity_mention "
            "WHERE rev_id=? AND entity_id=?"
        )
        params: list[Any] = [rev_id, entity_id]
        if scope:
            sql += " AND (path=? OR substr(path, 1, length(?))=?)"
            params += [scope, scope + "/", scope + "/"]
        row = self.store.one(
            sql + " ORDER BY path, start_line, chunk_id, char_start LIMIT 1", params
        )
        return _addr(*row) if row else None

    def _entity(self, rev_id: int, entity_id: str) -> dict[str, Any] | None:
        row = self.store.one(
            "SELECT entity_id, name, norm_name, kind, mentions, first_path, built_by FROM entity "
            "WHERE rev_id=? AND entity_id=?",
            (rev_id, entity_id),
        )
        if row is None:
            return None
        return dict(
            zip(
                ("entity_id", "name", "norm_name", "kind", "mentions", "first_path", "built_by"),
                row,
                strict=True,
            )
        )

    def _resolve(self, rev_id: int, entity: str) -> dict[str, Any] | None:
        found = self._entity(rev_id, entity)
        if found:
            return found
        row = self.store.one(
            "SELECT entity_id FROM entity WHERE rev_id=? AND norm_name=? "
            "ORDER BY mentions DESC, entity_id LIMIT 1",
            (rev_id, norm_name(entity)),
        )
        return self._entity(rev_id, row[0]) if row else None

    def _entity_item(
        self, rev_id: int, entity_id: str, scope: str | None = None
    ) -> dict[str, Any] | None:
        ent = self._entity(rev_id, entity_id)
        addr = self._first_mention(rev_id, entity_id, scope)
        if ent is None or addr is None:
            return None  # no mention, no fact
        return {
            "entity_id": ent["entity_id"],
            "name": ent["name"],
            "kind": ent["kind"],
            "mentions": ent["mentions"],
            "built_by": ent["built_by"],
            **addr,
        }

    def _summary(self, rev_id: int, theme_id: str) -> tuple[str | None, list[dict[str, Any]]]:
        row = self.store.one(
            "SELECT text, citations_json FROM theme_summary WHERE rev_id=? AND theme_id=?",
            (rev_id, theme_id),
        )
        if row is None:
            return None, []
        cites = json.loads(row[1])
        if not cites:  # a summary without citations is never returned
            return None, []
        return row[0], cites

    # --- themes -------------------------------------------------------------------------------

    def themes(self, scope: str | None = None, limit: int = 10) -> dict[str, Any]:
        op, state = "themes", self._state()
        lim = self._limit(limit)
        if lim is None:
            return self._refuse(op, state, limit, error=INVALID_REQUEST, themes=[])
        if not state["collected"]:
            return self._refuse(op, state, lim, themes=[])
        rev_id = state["rev"]["rev_id"]
        scope = (scope or "").strip().strip("/")
        scope = None if scope in ("", ".") else scope
        if scope:
            ids = [
                r[0]
                for r in self.store.rows(
                    "SELECT t.theme_id FROM theme t WHERE t.rev_id=? AND EXISTS ("
                    " SELECT 1 FROM theme_member tm JOIN entity_mention m ON m.rev_id=tm.rev_id AND"
                    " m.entity_id=tm.entity_id WHERE tm.rev_id=t.rev_id AND tm.theme_id=t.theme_id"
                    " AND (m.path=? OR substr(m.path, 1, length(?))=?))"
                    " ORDER BY t.size DESC, t.theme_id",
                    (rev_id, scope, scope + "/", scope + "/"),
                )
            ]
        else:
            ids = [
                r[0]
                for r in self.store.rows(
                    "SELECT theme_id FROM theme WHERE rev_id=? ORDER BY size DESC, theme_id",
                    (rev_id,),
                )
            ]
        items = [t for t in (self._theme_item(rev_id, tid, scope) for tid in ids[:lim]) if t]
        no_llm_summary = state["rev"]["stats"].get("llm_state") != "ok"
        reason = state["reason"]
        if no_llm_summary and reason and "summar" not in reason:
            reason = f"{reason}; no summaries"
        return self._envelope(
            op,
            state,
            requested=lim,
            items=len(items),
            truncated=len(ids) > lim,
            reason=reason,
            scope=scope,
            themes=items,
        )

    def _theme_item(
        self, rev_id: int, theme_id: str, scope: str | None, top: int = 5
    ) -> dict[str, Any] | None:
        row = self.store.one(
            "SELECT title, seed_entity_id, size, built_by FROM theme WHERE rev_id=? AND theme_id=?",
            (rev_id, theme_id),
        )
        if row is None:
            return None
        title, seed, size, built_by = row
        members = [
            r[0]
            for r in self.store.rows(
                "SELECT tm.entity_id FROM theme_member tm JOIN entity e ON e.rev_id=tm.rev_id AND "
                "e.entity_id=tm.entity_id WHERE tm.rev_id=? AND tm.theme_id=? "
                "ORDER BY tm.weight DESC, e.norm_name, tm.entity_id",
                (rev_id, theme_id),
            )
        ]
        if not members:
            return None  # a theme without members is not a theme
        top_entities: list[dict[str, Any]] = []
        for eid in members:
            if len(top_entities) >= top:
                break
            item = self._entity_item(rev_id, eid, scope)
            if item:
                top_entities.append(item)
        seed_addr = self._first_mention(rev_id, seed, scope) or (
            top_entities[0] if top_entities else None
        )
        if seed_addr is None:
            return None
        summary, citations = self._summary(rev_id, theme_id)
        if not citations:
            citations = [
                _addr(t["path"], t["start_line"], t["end_line"], t["chunk_id"])
                for t in top_entities[:3]
            ]
        return {
            "theme_id": theme_id,
            "title": title,
            "size": size,
            "seed_entity_id": seed,
            "built_by": built_by,
            "path": seed_addr["path"],
            "start_line": seed_addr["start_line"],
            "end_line": seed_addr["end_line"],
            "top_entities": top_entities,
            "summary": summary,
            "citations": citations,
        }

    # --- entity_neighbors ---------------------------------------------------------------------

    def entity_neighbors(
        self, entity: str, depth: int = 1, kind: str = "entity", limit: int = 20
    ) -> dict[str, Any]:
        op, state = "entity_neighbors", self._state()
        lim = self._limit(limit)
        if (
            lim is None
            or not isinstance(depth, int)
            or not 1 <= depth <= 3
            or kind not in ("entity", "theme")
            or not (entity or "").strip()
        ):
            return self._refuse(
                op,
                state,
                limit if lim is None else lim,
                error=INVALID_REQUEST,
                entity=None,
                neighbors=[],
            )
        if not state["collected"]:
            return self._refuse(op, state, lim, entity=None, neighbors=[])
        rev_id = state["rev"]["rev_id"]
        ent = self._resolve(rev_id, entity.strip())
        if ent is None:
            return self._envelope(
                op,
                state,
                requested=lim,
                items=0,
                truncated=False,
                reason="entity not found",
                entity=None,
                neighbors=[],
            )
        origin = self._entity_item(rev_id, ent["entity_id"])
        # Breadth-first over relations (both directions) and co-mentions.
        found: dict[str, dict[str, Any]] = {}
        frontier = [ent["entity_id"]]
        visited = {ent["entity_id"]}
        for level in range(1, depth + 1):
            nxt: list[str] = []
            for node in frontier:
                for nb in self._entity_edges(rev_id, node):
                    nid = nb["entity_id"]
                    if nid in visited:
                        continue
                    nb.update(depth=level, via_entity_id=node)
                    prev = found.get(nid)
                    if prev is None or (prev["depth"], -prev["weight"]) > (level, -nb["weight"]):
                        found[nid] = nb
            for nid in sorted(k for k, v in found.items() if v["depth"] == level):
                visited.add(nid)
                nxt.append(nid)
            # Bound the fan-out of deeper levels: strongest first, deterministic.
            frontier = sorted(nxt, key=lambda e: (-found[e]["weight"], e))[:50]
        ranked = sorted(
            found.values(), key=lambda n: (n["depth"], -n["weight"], n["name"], n["entity_id"])
        )
        if kind == "theme":
            ranked_themes = self._themes_of(
                rev_id,
                [ent["entity_id"]] + [n["entity_id"] for n in ranked],
                {n["entity_id"]: n["depth"] for n in ranked},
            )
            out = ranked_themes[:lim]
            total = len(ranked_themes)
        else:
            out = ranked[:lim]
            total = len(ranked)
        return self._envelope(
            op,
            state,
            requested=lim,
            items=len(out),
            truncated=total > lim,
            entity=origin,
            neighbors=out,
        )

    def _entity_edges(self, rev_id: int, entity_id: str) -> list[dict[str, Any]]:
        edges: dict[str, dict[str, Any]] = {}
        for src, dst, rkind, weight, chunk_id, path, sl, el in self.store.rows(
            "SELECT src_entity_id, dst_entity_id, kind, weight, chunk_id, path, start_line, "
            "end_line FROM entity_relation WHERE rev_id=? AND (src_entity_id=? OR dst_entity_id=?) "
            "ORDER BY path, start_line, rel_id",
            (rev_id, entity_id, entity_id),
        ):
            other = dst if src == entity_id else src
            cand = {
                "relation": rkind,
                "direction": "out" if src == entity_id else "in",
                "weight": weight,
                **_addr(path, sl, el, chunk_id),
            }
            prev = edges.get(other)
            if prev is None or prev["weight"] < weight:
                edges[other] = cand
        # Co-mentions: the neighbour's mention in a chunk shared with the entity is the quote.
        shared: dict[str, set[str]] = defaultdict(set)
        first: dict[str, dict[str, Any]] = {}
        for other, path, sl, el, chunk_id in self.store.rows(
            "SELECT m2.entity_id, m2.path, m2.start_line, m2.end_line, m2.chunk_id "
            "FROM entity_mention m1 JOIN entity_mention m2 ON m2.rev_id=m1.rev_id AND "
            "m2.chunk_id=m1.chunk_id WHERE m1.rev_id=? AND m1.entity_id=? AND m2.entity_id<>? "
            "ORDER BY m2.path, m2.start_line, m2.chunk_id",
            (rev_id, entity_id, entity_id),
        ):
            shared[other].add(chunk_id)
            first.setdefault(other, _addr(path, sl, el, chunk_id))
        for other, chunk_ids in shared.items():
            if other not in edges:
                edges[other] = {
                    "relation": "co_mention",
                    "direction": "both",
                    "weight": len(chunk_ids),
                    **first[other],
                }
        out = []
        for other, edge in edges.items():
            ent = self._entity(rev_id, other)
            if ent is None:
                continue
            out.append({"entity_id": other, "name": ent["name"], "kind": ent["kind"], **edge})
        return out

    def _themes_of(
        self, rev_id: int, entity_ids: list[str], depth_of: dict[str, int]
    ) -> list[dict[str, Any]]:
        items: dict[str, dict[str, Any]] = {}
        for eid in entity_ids:
            for theme_id, title, weight in self.store.rows(
                "SELECT t.theme_id, t.title, tm.weight FROM theme_member tm JOIN theme t ON "
                "t.rev_id=tm.rev_id AND t.theme_id=tm.theme_id WHERE tm.rev_id=? AND "
                "tm.entity_id=? ORDER BY t.theme_id",
                (rev_id, eid),
            ):
                if theme_id in items:
                    continue
                addr = self._first_mention(rev_id, eid)
                if addr is None:
                    continue
                items[theme_id] = {
                    "theme_id": theme_id,
                    "title": title,
                    "kind": "theme",
                    "weight": weight,
                    "depth": depth_of.get(eid, 0) + 1,
                    "via_entity_id": eid,
                    **addr,
                }
        return sorted(items.values(), key=lambda t: (t["depth"], -t["weight"], t["theme_id"]))

    # --- doc_relations ------------------------------------------------------------------------

    def doc_relations(
        self, doc: str | None = None, entity: str | None = None, limit: int = 20
    ) -> dict[str, Any]:
        op, state = "doc_relations", self._state()
        lim = self._limit(limit)
        if lim is None or bool(doc) == bool(entity):
            return self._refuse(
                op, state, limit if lim is None else lim, error=INVALID_REQUEST, relations=[]
            )
        if not state["collected"]:
            return self._refuse(op, state, lim, relations=[])
        rev_id = state["rev"]["rev_id"]
        weak = ",".join("?" * len(_WEAK_KINDS))
        if doc:
            doc = doc.strip().removeprefix("./")
            rows = self.store.rows(
                "SELECT m2.path, e.entity_id, e.name, e.kind, "  # noqa: S608 - only placeholders are interpolated, values bound
                " min(m1.path || char(0) || printf('%09d', m1.start_line)), "
                " min(printf('%09d', m2.start_line) || char(0) || m2.end_line || char(0) || m2.chunk_id) "
                "FROM entity_mention m1 JOIN entity_mention m2 ON m2.rev_id=m1.rev_id AND "
                " m2.entity_id=m1.entity_id AND m2.path<>m1.path "
                "JOIN entity e ON e.rev_id=m1.rev_id AND e.entity_id=m1.entity_id "
                f"WHERE m1.rev_id=? AND m1.path=? AND e.kind NOT IN ({weak}) "
                "GROUP BY m2.path, e.entity_id ORDER BY m2.path, e.norm_name",
                (rev_id, doc, *_WEAK_KINDS),
            )
            groups: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
            for r in rows:
                groups[r[0]].append(r)
            pairs = []
            for other, grp in groups.items():
                via, cites = [], []
                for _, eid, name, ekind, _m1, m2 in grp:
                    a = self._first_mention(rev_id, eid, doc)
                    sl, el, cid = m2.split("\0")
                    b = _addr(other, int(sl), int(el), cid)
                    if a is None:
                        continue
                    via.append(
                        {
                            "entity_id": eid,
                            "name": name,
                            "kind": ekind,
                            **{k: a[k] for k in ("path", "start_line", "end_line")},
                            "from_address": a,
                            "to_address": b,
                        }
                    )
                    cites += [a, b]
                if via:
                    pairs.append(
                        {
                            "from": doc,
                            "to": other,
                            "weight": len(via),
                            "via_entities": via[:10],
                            "citations": cites[:6],
                            **{k: cites[0][k] for k in ("path", "start_line", "end_line")},
                        }
                    )
            pairs.sort(key=lambda p: (-p["weight"], p["to"]))
            out = pairs[:lim]
            return self._envelope(
                op,
                state,
                requested=lim,
                items=len(out),
                truncated=len(pairs) > lim,
                doc=doc,
                entity=None,
                relations=out,
            )
        ent = self._resolve(rev_id, (entity or "").strip())
        if ent is None:
            return self._envelope(
                op,
                state,
                requested=lim,
                items=0,
                truncated=False,
                reason="entity not found",
                doc=None,
                entity=None,
                relations=[],
            )
        docs = [
            r[0]
            for r in self.store.rows(
                "SELECT DISTINCT path FROM entity_mention WHERE rev_id=? AND entity_id=? ORDER BY path",
                (rev_id, ent["entity_id"]),
            )
        ]
        pairs = []
        total = len(docs) * (len(docs) - 1) // 2
        for i, a in enumerate(docs):
            for b in docs[i + 1 :]:
                if len(pairs) >= lim:
                    break
                fa = self._first_mention(rev_id, ent["entity_id"], a)
                fb = self._first_mention(rev_id, ent["entity_id"], b)
                if fa is None or fb is None:
                    continue
                via = [
                    {
                        "entity_id": ent["entity_id"],
                        "name": ent["name"],
                        "kind": ent["kind"],
                        **{k: fa[k] for k in ("path", "start_line", "end_line")},
                        "from_address": fa,
                        "to_address": fb,
                    }
                ]
                pairs.append(
                    {
                        "from": a,
                        "to": b,
                        "weight": 1,
                        "via_entities": via,
                        "citations": [fa, fb],
                        **{k: fa[k] for k in ("path", "start_line", "end_line")},
                    }
                )
        return self._envelope(
            op,
            state,
            requested=lim,
            items=len(pairs),
            truncated=total > lim,
            doc=None,
            entity=self._entity_item(rev_id, ent["entity_id"]),
            relations=pairs,
        )

    # --- global_overview ----------------------------------------------------------------------

    def global_overview(self, limit: int = 5) -> dict[str, Any]:
        op, state = "global_overview", self._state()
        lim = self._limit(limit)
        empty: dict[str, Any] = {
            "counts": None,
            "top_themes": [],
            "top_entities": [],
            "degraded": True,
        }
        if lim is None:
            return self._refuse(op, state, limit, error=INVALID_REQUEST, **empty)
        if not state["collected"]:
            return self._refuse(op, state, lim, **empty)
        rev_id = state["rev"]["rev_id"]

        def count(sql: str) -> int:
            row = self.store.one(sql, (rev_id,))
            return int(row[0]) if row else 0

        counts = {
            "documents": count("SELECT count(DISTINCT path) FROM doc_chunk WHERE rev_id=?"),
            "chunks": count("SELECT count(*) FROM doc_chunk WHERE rev_id=?"),
            "entities": count("SELECT count(*) FROM entity WHERE rev_id=?"),
            "relations": count("SELECT count(*) FROM entity_relation WHERE rev_id=?"),
            "themes": count("SELECT count(*) FROM theme WHERE rev_id=?"),
            "summaries": count("SELECT count(*) FROM theme_summary WHERE rev_id=?"),
        }
        theme_ids = [
            r[0]
            for r in self.store.rows(
                "SELECT theme_id FROM theme WHERE rev_id=? ORDER BY size DESC, theme_id LIMIT ?",
                (rev_id, lim),
            )
        ]
        top_themes = [
            t for t in (self._theme_item(rev_id, tid, None, top=3) for tid in theme_ids) if t
        ]
        ent_ids = [
            r[0]
            for r in self.store.rows(
                "SELECT entity_id FROM entity WHERE rev_id=? ORDER BY mentions DESC, norm_name, "
                "entity_id LIMIT ?",
                (rev_id, lim),
            )
        ]
        top_entities = [e for e in (self._entity_item(rev_id, eid) for eid in ent_ids) if e]
        return self._envelope(
            op,
            state,
            requested=lim,
            items=len(top_themes) + len(top_entities),
            truncated=counts["themes"] > lim,
            counts=counts,
            top_themes=top_themes,
            top_entities=top_entities,
            degraded=state["capability"] != "full",
        )

    # --- search_levels ------------------------------------------------------------------------

    def search_levels(self, query: str, limit: int = 10) -> dict[str, Any]:
        """Dual-level search: high-level keywords -> themes, low-level keywords -> entities.

        Without an LLM: lexical match of query words over entity names, ``degraded=true``.
        With an unavailable LLM: ``collected=false`` and the driver code; never lexical instead.
        """
        op, state = "search_levels", self._state()
        lim = self._limit(limit)
        empty: dict[str, Any] = {
            "keywords": None,
            "high_level": [],
            "low_level": [],
            "degraded": True,
        }
        if lim is None or not (query or "").strip() or len(query) > 2000:
            return self._refuse(
                op, state, limit if lim is None else lim, error=INVALID_REQUEST, **empty
            )
        if not state["collected"]:
            return self._refuse(op, state, lim, **empty)
        rev_id = state["rev"]["rev_id"]
        if self.llm is None:
            words = _query_words(query)
            items = self._chunks_for_entities(
                rev_id, self._entities_matching(rev_id, words), "lexical", lim
            )
            truncated, items = len(items) > lim, items[:lim]
            reason = f"{NOT_CONFIGURED_REASON}: lexical match over entity names, no dual-level"
            return self._envelope(
                op,
                state,
                requested=lim,
                items=len(items),
                truncated=truncated,
                capability="degraded",
                reason=reason,
                keywords={"high_level": None, "low_level": words},
                high_level=[],
                low_level=items,
                degraded=True,
            )
        try:
            keywords = self._keywords(self.llm, query)
        except LLMUnavailable as exc:
            return self._refuse(
                op, state, lim, collected=False, reason=exc.reason, capability="degraded", **empty
            )
        if keywords is None:
            return self._refuse(
                op,
                state,
                lim,
                collected=False,
                capability="degraded",
                reason="LLM_BAD_ANSWER: keywords were not valid JSON",
                **empty,
            )
        low_ids = self._entities_matching(rev_id, [norm_name(k) for k in keywords["low_level"]])
        low = self._chunks_for_entities(rev_id, low_ids, "entity", lim)
        high = self._chunks_for_themes(rev_id, [norm_name(k) for k in keywords["high_level"]], lim)
        degraded = state["capability"] != "full"
        truncated = len(low) > lim or len(high) > lim
        low, high = low[:lim], high[:lim]
        return self._envelope(
            op,
            state,
            requested=lim,
            items=len(low) + len(high),
            truncated=truncated,
            keywords=keywords,
            high_level=high,
            low_level=low,
            degraded=degraded,
        )

    def _match_chunks(
        self, query: str, level: str, limit: int, until: float | None = None
    ) -> dict[str, Any]:
        """Chunks a query reaches through the graph, for ``Search mode=docs|themes``.

        Keywords: the LLM's two levels when one is configured (cached); otherwise the query's
        words (without stop words) serve as both levels: matching names against a built graph
        needs no model. ``level="docs"``: entity-level hits, then theme-level ones;
        ``level="themes"``: theme-level hits only. Answers ``{"collected", "reason", "items"}``;
        ``reason`` is set when the answer is degraded (layer incomplete, LLM unavailable).
        """
        state = self._state()
        if not state["collected"]:
            return {"collected": False, "reason": state["reason"], "items": []}
        rev_id = state["rev"]["rev_id"]
        words = _query_words(query)
        keywords = {"high_level": words, "low_level": words}
        reason = None
        if state["rev"]["stats"].get("stopped_by"):
            reason = state["reason"]
        if self.llm is not None:
            try:
                answer = self._keywords(self.llm, query, until)
            except LLMUnavailable as exc:
                answer, reason = None, f"{exc.reason}; query words used as keywords"
            if answer is not None:
                keywords = {
                    "high_level": [norm_name(k) for k in answer["high_level"]] or words,
                    "low_level": [norm_name(k) for k in answer["low_level"]] or words,
                }
        high = self._chunks_for_themes(rev_id, keywords["high_level"], limit)[:limit]
        if level == "themes":
            return {"collected": True, "reason": reason, "items": high}
        low_ids = self._entities_matching(rev_id, keywords["low_level"])
        low = self._chunks_for_entities(rev_id, low_ids, "entity", limit)[:limit]
        seen = {c["chunk_id"] for c in low}
        items = low + [c for c in high if c["chunk_id"] not in seen]
        return {"collected": True, "reason": reason, "items": items}

    def _keywords(
        self, llm: LLMClient, query: str, until: float | None = None
    ) -> dict[str, list[str]] | None:
        normq = " ".join(query.lower().split())
        qhash = hashlib.sha256(normq.encode("utf-8")).hexdigest()
        model = llm.settings.identity
        cached = self.store.keywords_get(qhash, model, KEYWORDS_PROMPT_VERSION)
        if cached is not None:
            # What _keywords stored below: validated lists of strings.
            return cast(dict[str, list[str]], json.loads(cached))
        system, user = keywords_messages(redact(query))
        content = llm.chat_json(system, user, until=until)
        try:
            obj = json.loads(unfence(content))
            result = {
                lvl: [k for k in obj.get(lvl, []) if isinstance(k, str) and k.strip()][:20]
                for lvl in ("high_level", "low_level")
            }
        except (ValueError, TypeError, AttributeError):
            return None
        # Keywords must be grounded in the query: invented terms are dropped.
        lowq = query.lower()
        result = {
            lvl: [k for k in kws if all(w in lowq for w in k.lower().split())]
            for lvl, kws in result.items()
        }
        self.store.keywords_put(
            qhash, model, KEYWORDS_PROMPT_VERSION, json.dumps(result, sort_keys=True)
        )
        return result

    def _entities_matching(self, rev_id: int, terms: list[str]) -> dict[str, set[str]]:
        """Entities whose name is, or contains, a term -> the terms each one matched."""
        out: dict[str, set[str]] = {}
        for term in terms:
            if len(term) < 2:
                continue
            for (eid,) in self.store.rows(
                "SELECT entity_id FROM entity WHERE rev_id=? AND (norm_name=? OR "
                "(length(?)>=3 AND instr(norm_name, ?)>0)) ORDER BY norm_name<>?, mentions DESC, "
                "entity_id LIMIT 25",
                (rev_id, term, term, term, term),
            ):
                out.setdefault(eid, set()).add(term)
        return out

    def _chunks_for_entities(
        self,
        rev_id: int,
        entity_terms: dict[str, set[str]],
        match_kind: str,
        lim: int,
        theme_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Chunks mentioning the entities, best first: most distinct query terms covered by the
        entities matched there, then most entities matched, then path and line."""
        chunks: dict[str, dict[str, Any]] = {}
        covered: dict[str, set[str]] = defaultdict(set)
        ids = list(entity_terms)
        ents: dict[str, tuple[str, str]] = {}
        rows: list[tuple[Any, ...]] = []
        for i in range(0, len(ids), 200):  # one query per 200 entities, not one per entity
            part = ids[i : i + 200]
            marks = ",".join("?" * len(part))
            ents.update(
                (r[0], (r[1], r[2]))
                for r in self.store.rows(
                    f"SELECT entity_id, name, kind FROM entity WHERE rev_id=? AND "  # noqa: S608 - placeholders only
                    f"entity_id IN ({marks})",
                    (rev_id, *part),
                )
            )
            where = f"WHERE m.rev_id=? AND m.entity_id IN ({marks})"
            rows += self.store.rows(
                _MENTIONS_OF + where,
                (rev_id, *part),
            )
        order = {eid: i for i, eid in enumerate(ids)}
        rows.sort(key=lambda r: (order[r[0]], r[2], r[3], r[1]))
        for eid, cid, path, sl, el, csl, cel in rows:
            if eid not in ents:
                continue
            name, kind = ents[eid]
            item = chunks.setdefault(
                cid,
                {
                    "chunk_id": cid,
                    "path": path,
                    "start_line": csl,
                    "end_line": cel,
                    "match_kind": match_kind,
                    "matched_entities": [],
                },
            )
            if theme_id:
                item["theme_id"] = theme_id
            covered[cid] |= entity_terms[eid]
            if all(m["entity_id"] != eid for m in item["matched_entities"]):
                item["matched_entities"].append(
                    {"entity_id": eid, "name": name, "kind": kind, **_addr(path, sl, el)}
                )
        for cid, c in chunks.items():
            c["score"] = round(len(covered[cid]) + 0.01 * len(c["matched_entities"]), 4)
        ranked = sorted(
            chunks.values(),
            key=lambda c: (-c["score"], c["path"], c["start_line"], c["chunk_id"]),
        )
        return ranked[: lim + 1]  # one extra tells the caller whether the list was truncated

    def _chunks_for_themes(self, rev_id: int, terms: list[str], lim: int) -> list[dict[str, Any]]:
        """Chunks reached through the themes the terms name, best first: themes covering most
        terms (by title or members), then the largest; in them, chunks covering most terms."""
        coverage: dict[str, set[str]] = defaultdict(set)
        member_terms: dict[str, dict[str, set[str]]] = defaultdict(dict)
        size: dict[str, int] = {}
        for term in terms:
            if len(term) < 3:
                continue
            for tid, tsize, eid, member_hit in self.store.rows(
                "SELECT t.theme_id, t.size, e.entity_id, instr(e.norm_name, ?)>0 FROM theme t "
                "JOIN theme_member tm ON tm.rev_id=t.rev_id AND tm.theme_id=t.theme_id "
                "JOIN entity e ON e.rev_id=tm.rev_id AND e.entity_id=tm.entity_id "
                "WHERE t.rev_id=? AND (instr(t.title, ?)>0 OR instr(e.norm_name, ?)>0) "
                "ORDER BY t.size DESC, t.theme_id, e.entity_id LIMIT 200",
                (term, rev_id, term, term),
            ):
                coverage[tid].add(term)
                size[tid] = int(tsize)
                if member_hit:
                    member_terms[tid].setdefault(eid, set()).add(term)
        ranked = sorted(coverage, key=lambda t: (-len(coverage[t]), -size[t], t))[:5]
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for rank, tid in enumerate(ranked):
            members = {
                r[0]: member_terms[tid].get(r[0], set())
                for r in self.store.rows(
                    "SELECT entity_id FROM theme_member WHERE rev_id=? AND theme_id=? "
                    "ORDER BY weight DESC, entity_id",
                    (rev_id, tid),
                )
            }
            for item in self._chunks_for_entities(rev_id, members, "theme", lim, theme_id=tid):
                if item["chunk_id"] not in seen:
                    seen.add(item["chunk_id"])
                    item["_rank"] = rank
                    out.append(item)
        out.sort(key=lambda c: (-c["score"], c.pop("_rank"), c["path"], c["start_line"]))
        return out[: lim + 1]
