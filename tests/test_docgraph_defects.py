"""Seed 003 §3.9: each property test of the document graph is shown to fail on the defect it
guards against. Every test here injects one defect (monkeypatching the production code), runs
the property test's own check, and asserts that the check fails; the property tests themselves
run unpatched in their own modules, so a check that passes both ways would show up here."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from knowledge_server.docgraph import build as build_mod
from knowledge_server.docgraph import extract as extract_mod
from knowledge_server.docgraph import themes as themes_mod
from knowledge_server.docgraph.build import DocGraphBuilder
from knowledge_server.docgraph.ops import DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks, write_sample_corpus
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.testing.fake_llm import FakeLLMServer
from knowledge_server.transport import interceptors

from tests import (
    test_docgraph_degradation as degradation,
)
from tests import (
    test_docgraph_editions as editions,
)
from tests import (
    test_docgraph_entities as entities,
)
from tests import (
    test_docgraph_ops as ops_tests,
)
from tests import (
    test_docgraph_themes as theme_tests,
)
from tests import (
    test_mcp_bridge as bridge_tests,
)
from tests.conftest import make_vendor

# What a failing check raises: an assertion, pytest.raises/fail inside it, or Hypothesis
# reporting several distinct failures at once.
FAILED = (AssertionError, pytest.fail.Exception, BaseExceptionGroup)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def _corpus(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    write_sample_corpus(root)
    return root


def _fails(check: Callable[..., Any], *args: Any) -> None:
    with pytest.raises(FAILED):
        check(*args)


# -- test_docgraph_entities.py: fact without mention; nondeterministic entity_id; rebuild
#    without a fingerprint change ---------------------------------------------------------------


def test_entities_checks_catch_a_dropped_mention_check(tmp_path, fake, monkeypatch):
    """Defect: the mention check removed (every mention "found" at offset 0)."""
    real = extract_mod._find
    monkeypatch.setattr(
        extract_mod, "_find", lambda hay, needle: real(hay, needle) or (0, len(needle))
    )
    _fails(entities.test_validation_accepts_only_mentions_found_in_text)
    _fails(
        entities.test_invalid_llm_answers_are_rejected_and_counted,
        tmp_path,
        _corpus(tmp_path),
        "invent_entity",
        "mention_not_found",
    )


def test_entities_checks_catch_nondeterministic_entity_ids(tmp_path, fake, monkeypatch):
    """Defect: entity ids salted per build (as with a clock or a random source)."""
    import hashlib

    builds = itertools.count()
    salt = [0]
    real_aggregate = build_mod._aggregate

    def salted(norm: str, kind: str) -> str:
        text = f"{salt[0]}|{norm}|{kind}"
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def aggregate(*args: Any) -> Any:
        salt[0] = next(builds)
        return real_aggregate(*args)

    monkeypatch.setattr(build_mod, "entity_id_for", salted)
    monkeypatch.setattr(build_mod, "_aggregate", aggregate)
    _fails(
        entities.test_ids_and_layer_do_not_depend_on_input_order, tmp_path, _corpus(tmp_path), fake
    )


def test_entities_checks_catch_a_rebuild_without_fingerprint_change(tmp_path, fake, monkeypatch):
    """Defect: the fingerprint changes on every run (a rebuild with unchanged input)."""
    real = DocGraphBuilder.fingerprint_inputs
    runs = itertools.count()

    def unstable(self: DocGraphBuilder, chunks: list[Any]) -> dict[str, Any]:
        return {**real(self, chunks), "run": next(runs)}

    monkeypatch.setattr(DocGraphBuilder, "fingerprint_inputs", unstable)
    _fails(
        entities.test_rebuild_without_fingerprint_change_is_a_noop_and_a_change_is_drift,
        tmp_path,
        _corpus(tmp_path),
        fake,
    )


# -- test_docgraph_degradation.py: an empty list instead of collected=false; lexical
#    substitution without the flag -----------------------------------------------------------------


def test_degradation_checks_catch_return_empty(tmp_path, monkeypatch):
    """Defect: `return []`: not collected answered as collected and empty."""
    real = DocGraphOps._refuse

    def empty(self: DocGraphOps, op: str, state: dict[str, Any], limit: int, **kw: Any) -> Any:
        answer = real(self, op, state, limit, **kw)
        answer.update(collected=True, reason=None, capability="full")
        return answer

    monkeypatch.setattr(DocGraphOps, "_refuse", empty)
    _fails(degradation.test_no_layer_is_not_collected, tmp_path / "a")
    chunks = load_markdown_chunks(_corpus(tmp_path / "b"))
    _fails(degradation.test_llm_not_configured_is_not_collected, tmp_path / "b", chunks)


def test_degradation_checks_catch_unflagged_lexical_search(tmp_path, monkeypatch):
    """Defect: lexical substitution for dual-level search without `degraded`."""
    real = DocGraphOps._envelope

    def unflagged(self: DocGraphOps, op: str, state: dict[str, Any], **kw: Any) -> Any:
        answer = real(self, op, state, **kw)
        if "degraded" in answer:
            answer.update(degraded=False, capability="full")
        return answer

    monkeypatch.setattr(DocGraphOps, "_envelope", unflagged)
    chunks = load_markdown_chunks(_corpus(tmp_path))
    _fails(degradation.test_search_without_llm_is_lexical_and_flagged, tmp_path, chunks)


# -- test_docgraph_themes.py: unstable theme_id; theme without members; summary without
#    citations ------------------------------------------------------------------------------------


def test_theme_checks_catch_a_changed_sort_order(tmp_path, monkeypatch):
    """Defect: the member ids in theme_id joined in another order than sorted."""

    def reversed_order(seed: str, members: Any) -> str:
        import hashlib

        text = seed + "|" + ",".join(sorted(members, reverse=True))
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    monkeypatch.setattr(themes_mod, "theme_id_for", reversed_order)
    chunks = load_markdown_chunks(_corpus(tmp_path))
    _fails(theme_tests.test_theme_id_recomputes_from_members, tmp_path, chunks)


def test_theme_checks_catch_a_summary_without_citations(tmp_path, monkeypatch):
    """Defect: a summary returned although it cites nothing."""
    monkeypatch.setattr(DocGraphOps, "_summary", lambda self, rev, tid: ("Invented.", []))
    chunks = load_markdown_chunks(_corpus(tmp_path))
    _fails(theme_tests.test_themes_without_llm_have_no_summary_but_are_collected, tmp_path, chunks)


def test_theme_checks_catch_ungrounded_summaries(tmp_path, monkeypatch):
    """Defect: the summary prompt without the chunks' quotes (names and ids only)."""
    real = build_mod.summary_messages
    monkeypatch.setattr(
        build_mod,
        "summary_messages",
        lambda title, members, citable: real(title, members, [(c, a, "") for c, a, _ in citable]),
    )
    chunks = load_markdown_chunks(_corpus(tmp_path))
    _fails(theme_tests.test_summary_prompt_quotes_the_cited_chunks_bounded, tmp_path, chunks)


# -- test_docgraph_editions.py: Community passes the gate -------------------------------------


async def test_edition_checks_catch_a_removed_gate(tmp_path, monkeypatch):
    """Defect: the edition gate lets every RPC through."""

    async def no_gate(self: Any, continuation: Any, details: Any) -> Any:
        return await continuation(details)

    monkeypatch.setattr(interceptors.EditionInterceptor, "intercept_service", no_gate)
    vendor = make_vendor(tmp_path / "vendor")
    with pytest.raises(FAILED):
        await editions.test_community_refuses_every_docgraph_rpc(tmp_path, vendor, None)


# -- test_docgraph_ops.py: an operation without an address; surface drift ---------------------


@pytest.fixture()
def built(tmp_path: Path, fake: FakeLLMServer) -> DocGraphStore:
    store = DocGraphStore(tmp_path / "data")
    client = ops_tests._client(fake.url)
    DocGraphBuilder(store, client).build(load_markdown_chunks(_corpus(tmp_path)))
    return store


def test_ops_checks_catch_an_unaddressed_fact(built, fake, monkeypatch):
    """Defect: entities answered without path:line."""
    real = DocGraphOps._entity_item

    def unaddressed(self: DocGraphOps, *args: Any, **kw: Any) -> Any:
        item = real(self, *args, **kw)
        if item:
            for key in ("path", "start_line", "end_line"):
                item.pop(key, None)
        return item

    monkeypatch.setattr(DocGraphOps, "_entity_item", unaddressed)
    _fails(ops_tests.test_every_fact_in_every_answer_has_an_address, built, fake)


def test_ops_checks_catch_surface_drift(monkeypatch):
    """Defect: an operation implemented but not declared; a tool missing from the bridge."""
    monkeypatch.setattr(DocGraphOps, "undeclared_op", lambda self: {}, raising=False)
    _fails(ops_tests.test_declared_operations_match_the_implementation)
    monkeypatch.setattr(
        bridge_tests, "TOOLS", tuple(t for t in bridge_tests.TOOLS if t.name != "knowledge_themes")
    )
    _fails(bridge_tests.test_every_rpc_has_a_tool_or_an_exclusion_with_reason)
