"""Validation of a SearchRequest (seed 000 §3). Unknown enum-like values are refused,
never silently defaulted. Returns a normalised, defaulted copy."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from google.protobuf import timestamp_pb2

from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.errors import InvalidRequest

SCHEMA = "knowledge.search/v1"
MODES = ("auto", "find_agent", "find_skill", "find_code", "find_knowledge", "docs", "themes")
LANES = ("episodes", "code", "skills")
OUTCOMES = ("success", "failure", "any")
PROVENANCE = ("strict", "locator")
MAX_QUERY = 2000


@dataclass(frozen=True)
class ValidSearch:
    query: str
    mode: str
    include: tuple[str, ...]
    limit: int
    max_tokens: int
    snippet_chars: int
    provenance: str
    trace: bool
    request_id: str
    workspaces: tuple[str, ...]
    session_ids: tuple[str, ...]
    actor_ids: tuple[str, ...]
    skills: tuple[str, ...]
    paths: tuple[str, ...]
    since: datetime | None
    until: datetime | None
    outcome: str


# The range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
MIN_SECONDS = -62_135_596_800
MAX_SECONDS = 253_402_300_799


def _ts(msg: search_pb2.SearchFilters, name: Literal["since", "until"]) -> datetime | None:
    if not msg.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = msg.since if name == "since" else msg.until
    if not MIN_SECONDS <= stamp.seconds <= MAX_SECONDS or not 0 <= stamp.nanos <= 999_999_999:
        raise _bad(f"filters.{name}", "must be within 0001-01-01 and 9999-12-31 (UTC)")
    return stamp.ToDatetime(tzinfo=UTC)


def _bad(field: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {why}", metadata={"field": field})


def validate_search(req: search_pb2.SearchRequest) -> ValidSearch:  # noqa: C901 - one check per request field, each with its own error
    if req.schema != SCHEMA:
        raise _bad("schema", f"must be exactly {SCHEMA!r}")
    query = req.query
    if "\x00" in query:
        raise _bad("query", "contains a NUL character")
    if not query.strip():
        raise _bad("query", "is empty")
    if len(query) > MAX_QUERY:
        raise _bad("query", f"is longer than {MAX_QUERY} characters")
    mode = req.mode or "auto"
    if mode not in MODES:
        raise _bad("mode", f"unknown value; expected one of {', '.join(MODES)}")
    include = tuple(req.include) or LANES
    for lane in include:
        if lane not in LANES:
            raise _bad("include", f"unknown lane; expected some of {', '.join(LANES)}")
    include = tuple(dict.fromkeys(include))
    limit = req.limit or 10
    if not 1 <= limit <= 50:
        raise _bad("limit", "must be within 1..50")
    max_tokens = req.budget.max_tokens or 4000
    if not 500 <= max_tokens <= 20000:
        raise _bad("budget.max_tokens", "must be within 500..20000")
    snippet_chars = req.budget.snippet_chars or 240
    if not 80 <= snippet_chars <= 1000:
        raise _bad("budget.snippet_chars", "must be within 80..1000")
    provenance = req.provenance or "strict"
    if provenance not in PROVENANCE:
        raise _bad("provenance", "expected 'strict' or 'locator'")
    f = req.filters
    outcome = f.outcome or "any"
    if outcome not in OUTCOMES:
        raise _bad("filters.outcome", "expected 'success', 'failure' or 'any'")
    since, until = _ts(f, "since"), _ts(f, "until")
    if since and until and since > until:
        raise _bad("filters.since", "is after filters.until")
    for name in ("workspaces", "session_ids", "actor_ids", "skills", "paths"):
        for value in getattr(f, name):
            if not value or "\x00" in value or len(value) > 4096:
                raise _bad(f"filters.{name}", "contains an empty, oversized or NUL value")
    if len(req.request_id) > 128:
        raise _bad("request_id", "is longer than 128 characters")
    return ValidSearch(
        query=query.strip(),
        mode=mode,
        include=include,
        limit=limit,
        max_tokens=max_tokens,
        snippet_chars=snippet_chars,
        provenance=provenance,
        trace=req.trace,
        request_id=req.request_id,
        workspaces=tuple(f.workspaces),
        session_ids=tuple(f.session_ids),
        actor_ids=tuple(f.actor_ids),
        skills=tuple(f.skills),
        paths=tuple(f.paths),
        since=since,
        until=until,
        outcome=outcome,
    )
