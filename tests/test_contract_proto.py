"""Contract tests for the knowledge.v1 protos against the seed's JSON (DESIGN §4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    docgraph_pb2,
    errors_pb2,
    knowledge_service_pb2,
    options_pb2,
    search_pb2,
)
from knowledge_server.search.validate import validate_search

from tests.conftest import SEED_DIR

FIXTURES = Path(__file__).parent / "fixtures" / "seed"


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def test_fixtures_are_the_seed_examples_verbatim() -> None:
    """The JSON fixtures are the code blocks of seed 000 (§3, §4, §14, §14.1), unchanged."""
    seed = SEED_DIR / "000-knowledge-search-contract.ru.md"
    if not seed.exists():
        pytest.skip(f"seed {seed} is absent")
    text = seed.read_text(encoding="utf-8")
    for name in (
        "search_request",
        "search_response",
        "dispatch_request",
        "dispatch_response",
        "handoff",
    ):
        assert (FIXTURES / f"{name}.json").read_text(encoding="utf-8") in text


def test_seed_search_request_parses_without_unknown_fields() -> None:
    """DESIGN §4.3: the seed's example request parses into SearchRequest (no unknown fields)."""
    req = json_format.ParseDict(_load("search_request.json"), search_pb2.SearchRequest())
    assert req.schema == "knowledge.search/v1"
    assert list(req.include) == ["episodes", "code", "skills"]
    assert req.budget.max_tokens == 4000 and req.budget.snippet_chars == 240
    assert req.filters.since.ToJsonString() == "2026-08-31T21:00:00Z"
    assert not req.filters.HasField("until")
    valid = validate_search(req)
    assert valid.mode == "auto" and valid.provenance == "strict" and valid.outcome == "any"


def test_seed_search_response_fields_all_exist_in_the_proto() -> None:
    """Every field of the seed's response example exists with the seed's name (parse is strict)."""
    resp = json_format.ParseDict(_load("search_response.json"), search_pb2.SearchResponse())
    assert resp.lanes.episodes.items[0].session_id == "session-abc"
    assert resp.lanes.code.items[0].path == "src/Config.php"
    assert resp.actors[0].evidence[0].lane == "episodes"
    assert resp.fusion.k == 60


def test_response_json_uses_the_seed_field_names() -> None:
    """The JSON form (proto field names) round-trips to the seed's names."""
    seed = _load("search_response.json")
    resp = json_format.ParseDict(seed, search_pb2.SearchResponse())
    out = json_format.MessageToDict(resp, preserving_proto_field_name=True)

    def keys(d: object, prefix: str = "") -> set[str]:
        found: set[str] = set()
        if isinstance(d, dict):
            for k, v in d.items():
                if prefix.endswith("weights"):
                    continue
                found.add(f"{prefix}.{k}")
                found |= keys(v, f"{prefix}.{k}")
        elif isinstance(d, list):
            for v in d:
                found |= keys(v, prefix)
        return found

    # Every key the service emits for this content is a seed key (no renamed fields).
    assert keys(out) <= keys(seed)


def test_lane_items_cannot_mix_addresses() -> None:
    """KC-6 by construction: an episode item has no path, a code item has no session id."""
    ep_fields = {f.name for f in search_pb2.EpisodeItem.DESCRIPTOR.fields}
    code_fields = {f.name for f in search_pb2.CodeItem.DESCRIPTOR.fields}
    assert (
        {"session_id", "seq"} <= ep_fields
        and "path" not in ep_fields
        and "start_line" not in ep_fields
    )
    assert {"path", "start_line"} <= code_fields and "session_id" not in code_fields
    for lane in (search_pb2.EpisodesLane, search_pb2.CodeLane, search_pb2.SkillsLane):
        names = {f.name for f in lane.DESCRIPTOR.fields}
        assert {"source", "index_rev", "degraded", "degradation_reason"} <= names
    assert "index_rev" not in {f.name for f in search_pb2.SearchResponse.DESCRIPTOR.fields}


def test_seed_dispatch_and_handoff_parse() -> None:
    req = json_format.ParseDict(_load("dispatch_request.json"), dispatch_pb2.DispatchRequest())
    assert req.dry_run is True and req.HasField("dry_run")
    json_format.ParseDict(_load("dispatch_response.json"), dispatch_pb2.DispatchResponse())
    pkg = json_format.ParseDict(_load("handoff.json"), dispatch_pb2.HandoffPackage())
    assert pkg.execution == "not_executed" and len(pkg.tool_calls) == 3


def test_docgraph_responses_carry_the_common_envelope() -> None:
    """Seed 003 §3.6: op, index_rev, capability, provenance, found, error, limits on every op."""
    envelope = {
        "op",
        "index_rev",
        "capability",
        "provenance",
        "found",
        "collected",
        "reason",
        "error",
        "limits",
    }
    for cls in (
        docgraph_pb2.ThemesResponse,
        docgraph_pb2.EntityNeighborsResponse,
        docgraph_pb2.DocRelationsResponse,
        docgraph_pb2.GlobalOverviewResponse,
        docgraph_pb2.SearchLevelsResponse,
    ):
        assert envelope <= {f.name for f in cls.DESCRIPTOR.fields}, cls.__name__
    rel = {f.name for f in docgraph_pb2.DocRelation.DESCRIPTOR.fields}
    assert {"from", "to", "via_entities", "citations"} <= rel


def test_every_rpc_declares_a_policy_and_docgraph_needs_enterprise() -> None:
    for module in (knowledge_service_pb2, docgraph_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                assert m.GetOptions().HasExtension(options_pb2.policy), m.full_name
    for m in docgraph_pb2.DESCRIPTOR.services_by_name["DocGraphService"].methods:
        p = m.GetOptions().Extensions[options_pb2.policy]
        assert p.feature == "doc-graph" and p.edition == options_pb2.EDITION_ENTERPRISE


def test_reason_codes_cover_the_seed_codes() -> None:
    seed_codes = {
        "KNOWLEDGE_INVALID_REQUEST",
        "KNOWLEDGE_NO_SOURCE",
        "KNOWLEDGE_LANE_DEGRADED",
        "KNOWLEDGE_INDEX_NOT_READY",
        "KNOWLEDGE_STALE_INDEX",
        "KNOWLEDGE_SOURCE_UNAVAILABLE",
        "KNOWLEDGE_BUDGET_EXCEEDED",
        "KNOWLEDGE_INTERNAL",
        "SESSION_QUERY_SEARCH_DISABLED",
        "SESSION_QUERY_INDEX_FAILED",
        "SESSION_QUERY_STALE_CURSOR",
        "SESSION_QUERY_SESSION_NOT_FOUND",
    }
    names = {v.name.removeprefix("ERROR_REASON_") for v in errors_pb2.ErrorReason.DESCRIPTOR.values}
    assert seed_codes <= names
