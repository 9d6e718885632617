"""Document graph operations: every fact addressed, fixed surface, dual-level search."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.docgraph.build import BuildSettings, DocGraphBuilder
from knowledge_server.docgraph.llm import LLMClient, LLMSettings
from knowledge_server.docgraph.model import chunk_markdown_file
from knowledge_server.docgraph.ops import INVALID_REQUEST, OPS, DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks, write_sample_corpus
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.testing.fake_llm import FakeLLMServer

ENVELOPE = {
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
_FACT_KEYS = ("entity_id", "theme_id", "chunk_id")


@pytest.fixture(scope="module")
def fake():
    with FakeLLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def built(tmp_path_factory, fake) -> DocGraphStore:
    root = tmp_path_factory.mktemp("docgraph_ops")
    write_sample_corpus(root / "docs")
    store = DocGraphStore(root / "data")
    DocGraphBuilder(store, _client(fake.url)).build(load_markdown_chunks(root / "docs"))
    return store


def _client(url: str) -> LLMClient:
    return LLMClient(LLMSettings(base_url=url, model="fake-model", backoff_seconds=0.0))


def _facts(obj: Any, where: str = "") -> Iterator[tuple[str, dict]]:
    """Every dict in an answer that names an entity, theme or chunk (i.e. states a fact)."""
    if isinstance(obj, dict):
        if any(k in obj for k in _FACT_KEYS):
            yield where, obj
        for k, v in obj.items():
            if k != "provenance":
                yield from _facts(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _facts(v, f"{where}[{i}]")


def _assert_addressed(answer: dict) -> int:
    n = 0
    for where, fact in _facts(answer):
        assert isinstance(fact.get("path"), str) and fact["path"], where
        assert isinstance(fact.get("start_line"), int) and fact["start_line"] >= 1, where
        assert isinstance(fact.get("end_line"), int) and fact["end_line"] >= fact["start_line"]
        n += 1
    return n


def _answers(ops: DocGraphOps) -> list[dict]:
    return [
        ops.themes(limit=10),
        ops.themes(scope="notes", limit=10),
        ops.entity_neighbors("EIP-100", depth=1),
        ops.entity_neighbors("base fee oracle", depth=3, limit=50),
        ops.entity_neighbors("EIP-200", depth=2, kind="theme"),
        ops.doc_relations(doc="eip-100.md"),
        ops.doc_relations(entity="Base Fee Oracle"),
        ops.global_overview(limit=5),
        ops.search_levels("How does the fee market relate to EIP-200?"),
    ]


def test_every_fact_in_every_answer_has_an_address(built, fake):
    """Catches: an operation returning an item without path:line (a guess, not a fact)."""
    total = 0
    for answer in _answers(DocGraphOps(built, _client(fake.url))):
        assert ENVELOPE <= set(answer), answer["op"]
        assert answer["collected"] and answer["found"], answer["op"]
        total += _assert_addressed(answer)
        for citation in [c for t in answer.get("themes", []) for c in t["citations"]]:
            assert citation["path"] and citation["start_line"] >= 1
        for rel in answer.get("relations", []):
            assert rel["citations"] and rel["via_entities"]
    assert total > 50


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(alphabet="abcdefgimorstuABEFIOP-0123 ", min_size=1, max_size=30),
    depth=st.integers(1, 3),
    limit=st.integers(1, 30),
)
def test_random_requests_never_return_unaddressed_items(built, fake, text, depth, limit):
    """Catches: an unaddressed item slipping out on unusual inputs (any entity, query, limit)."""
    ops = DocGraphOps(built, _client(fake.url))
    for answer in (
        ops.entity_neighbors(text, depth=depth, limit=limit),
        ops.doc_relations(entity=text, limit=limit),
        ops.search_levels(text, limit=limit),
        ops.themes(scope=text, limit=limit),
    ):
        assert ENVELOPE <= set(answer)
        _assert_addressed(answer)
        assert answer["limits"]["requested"] == limit
        if answer["error"] is None:
            assert answer["collected"] is True


def test_invalid_requests_are_refused_with_a_code(built):
    """Catches: out-of-range requests executed (unbounded depth/limit) or refused silently."""
    ops = DocGraphOps(built)
    for answer in (
        ops.entity_neighbors("EIP-100", depth=4),
        ops.entity_neighbors("EIP-100", kind="galaxy"),
        ops.themes(limit=0),
        ops.doc_relations(),
        ops.doc_relations(doc="eip-100.md", entity="EIP-100"),
        ops.global_overview(limit=10_000),
        ops.search_levels("  "),
    ):
        assert answer["error"] == INVALID_REQUEST and answer["found"] is False


def test_unknown_entity_is_found_false_but_collected(built):
    """Catches: an unknown entity answered as "not collected" (or with invented neighbours)."""
    answer = DocGraphOps(built).entity_neighbors("no such thing at all")
    assert answer["collected"] is True and answer["found"] is False
    assert answer["neighbors"] == [] and answer["reason"] == "entity not found"


def test_neighbors_by_relation_and_by_theme(built):
    """Catches: neighbours without relation kind/weight, or depth not bounding the walk."""
    ops = DocGraphOps(built)
    one = ops.entity_neighbors("EIP-100", depth=1, limit=100)
    names = {(n["name"], n["kind"]): n for n in one["neighbors"]}
    assert names[("EIP-200", "standard")]["relation"] in ("requires", "links_to", "references")
    assert names[("Alice Doe", "person")]["relation"] == "authored_by"
    assert all(n["depth"] == 1 and n["weight"] >= 1 for n in one["neighbors"])
    deeper = ops.entity_neighbors("EIP-100", depth=2, limit=100)
    assert len(deeper["neighbors"]) >= len(one["neighbors"])
    themes = ops.entity_neighbors("Base Fee Oracle", kind="theme")
    assert themes["neighbors"] and all(n["kind"] == "theme" for n in themes["neighbors"])


def test_doc_relations_go_through_shared_entities(built):
    """Catches: document relations asserted without the shared entities that justify them."""
    answer = DocGraphOps(built).doc_relations(doc="eip-100.md", limit=10)
    targets = {r["to"]: r for r in answer["relations"]}
    assert {"eip-200.md", "eip-300.md", "notes/operator-notes.md"} <= set(targets)
    via = {v["name"] for v in targets["eip-200.md"]["via_entities"]}
    assert "Base Fee Oracle" in via
    for r in answer["relations"]:
        for v in r["via_entities"]:
            assert v["from_address"]["path"] == "eip-100.md" and v["to_address"]["path"] == r["to"]


def test_themes_scope_restricts_to_a_folder(built):
    """Catches: a scope that is ignored (themes from outside the requested folder)."""
    scoped = DocGraphOps(built).themes(scope="notes")
    assert scoped["themes"]
    for theme in scoped["themes"]:
        assert theme["path"].startswith("notes/")
        assert all(e["path"].startswith("notes/") for e in theme["top_entities"])


def test_dual_level_search_uses_both_levels_and_caches_keywords(built, fake):
    """Catches: dual-level search that loses one level, or recomputes cached keywords."""
    ops = DocGraphOps(built, _client(fake.url))
    query = "How does the fee market relate to EIP-200?"
    first = ops.search_levels(query, limit=5)
    assert first["capability"] == "full" and first["degraded"] is False
    assert "EIP-200" in first["keywords"]["low_level"]
    assert "market" in first["keywords"]["high_level"]
    assert first["low_level"] and {i["match_kind"] for i in first["low_level"]} == {"entity"}
    assert first["high_level"] and {i["match_kind"] for i in first["high_level"]} == {"theme"}
    assert any(m["name"] == "EIP-200" for i in first["low_level"] for m in i["matched_entities"])
    before = fake.calls
    again = ops.search_levels("  how does the FEE market relate to eip-200? ", limit=5)
    assert fake.calls == before and again["low_level"] == first["low_level"]


def test_global_overview_counts_and_addresses(built):
    """Catches: an overview without counts, or top themes without addresses."""
    answer = DocGraphOps(built).global_overview(limit=3)
    counts = answer["counts"]
    assert counts["documents"] == 4 and counts["entities"] > 0 and counts["themes"] > 0
    assert answer["degraded"] is False and answer["top_themes"]
    assert all(t["path"] and t["start_line"] for t in answer["top_themes"])


def test_answers_are_deterministic(built, fake):
    """Catches: nondeterministic ordering of operation results."""
    a = _answers(DocGraphOps(built, _client(fake.url)))
    b = _answers(DocGraphOps(built, _client(fake.url)))
    assert a == b


def test_declared_operations_match_the_implementation():
    """Catches: a declared operation without an implementation (surface drift)."""
    public = {
        n for n, f in inspect.getmembers(DocGraphOps, inspect.isfunction) if not n.startswith("_")
    }
    assert set(OPS) == public


@pytest.mark.realdata
def test_real_eips_answers_are_addressed(shared_data, tmp_path, fake):
    """Catches: address loss on real documents (front matter offsets, long sections)."""
    root = shared_data / "docs" / "eips"
    if not root.is_dir():
        pytest.skip("eips corpus absent")
    chunks = load_markdown_chunks(root, "eip-15*.md") + load_markdown_chunks(root, "eip-27*.md")
    store = DocGraphStore(tmp_path / "data")
    DocGraphBuilder(store, _client(fake.url)).build(chunks)
    ops = DocGraphOps(store, _client(fake.url))
    for answer in (
        ops.themes(),
        ops.entity_neighbors("EIP-1559", depth=2),
        ops.doc_relations(doc="eip-1559.md"),
        ops.global_overview(),
        ops.search_levels("base fee burn EIP-1559"),
    ):
        assert answer["found"], answer["op"]
        _assert_addressed(answer)
    lines = (root / "eip-1559.md").read_text().split("\n")
    for _path, sl, cs, ce, cid in store.rows(
        "SELECT path, start_line, char_start, char_end, chunk_id FROM entity_mention "
        "WHERE path='eip-1559.md'"
    ):
        chunk = next(c for c in chunks if c.chunk_id == cid)
        assert chunk.text[cs:ce].split("\n")[0] in lines[sl - 1]


def test_workspaces_have_separate_layers(tmp_path, fake):
    """Catches: one workspace's facts answered through another workspace's operations."""
    write_sample_corpus(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "other.md").write_text("# Other\n\nThe Zebra Protocol uses ZEBRAOP.\n")
    store = DocGraphStore(tmp_path / "data")
    builder = DocGraphBuilder(store, _client(fake.url))
    ra = builder.build(load_markdown_chunks(tmp_path / "a"), workspace="/ws/a")
    rb = builder.build(load_markdown_chunks(tmp_path / "b"), workspace="/ws/b")
    assert ra.rev_id != rb.rev_id and not rb.noop and not rb.drift
    a = DocGraphOps(store, workspace="/ws/a")
    b = DocGraphOps(store, workspace="/ws/b")
    assert a.entity_neighbors("EIP-100")["found"] and not b.entity_neighbors("EIP-100")["found"]
    assert b.global_overview()["counts"]["documents"] == 1
    assert a.global_overview()["counts"]["documents"] == 4
    assert b.global_overview()["index_rev"] == rb.rev_id
    none = DocGraphOps(store, workspace="/ws/c").themes()
    assert none["collected"] is False and none["index_rev"] is None
    # Rebuilding a with the same input stays a no-op although b was built in between.
    assert builder.build(load_markdown_chunks(tmp_path / "a"), workspace="/ws/a").noop


def test_a_question_ending_in_a_full_stop_finds_the_entity_it_names(tmp_path):
    """A question is a sentence: its last word came with the full stop ("base_fee_per_gas."),
    since names may hold dots, and the entity it names was not found (search_levels without
    a model, and the graph match of Search mode=docs)."""
    (tmp_path / "eip-1559.md").write_text(
        "---\neip: 1559\ntitle: Fee market change\n---\n\n# Specification\n\n"
        "The `base_fee_per_gas` is computed per block; see EIP-2718.\n\n## Rationale\n\n"
        "The `base_fee_per_gas` MUST NOT be negative. EIP-2718 envelopes carry it.\n"
    )
    store = DocGraphStore(tmp_path / "data")
    DocGraphBuilder(store, None, BuildSettings(use_llm=False)).build(
        chunk_markdown_file(tmp_path, "eip-1559.md"), workspace="/ws"
    )
    ops = DocGraphOps(store, None, workspace="/ws")
    for question in ("Explain base_fee_per_gas.", "What does this say about EIP-2718."):
        plain = question.rstrip(".")
        assert ops.search_levels(question)["low_level"] == ops.search_levels(plain)["low_level"]
        assert ops.search_levels(question)["found"], question
        asked = ops._match_chunks(question, "docs", 10)["items"]
        assert asked and asked == ops._match_chunks(plain, "docs", 10)["items"], question
