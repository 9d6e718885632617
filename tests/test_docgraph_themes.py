"""Document graph themes: stable ids, real members, summaries only with citations."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.docgraph.build import BuildSettings, DocGraphBuilder
from knowledge_server.docgraph.llm import LLMClient, LLMSettings
from knowledge_server.docgraph.model import DocChunk, chunk_markdown_file
from knowledge_server.docgraph.ops import DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks, write_sample_corpus
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.docgraph.themes import ThemeEntity, ThemeSettings, build_themes
from knowledge_server.testing.fake_llm import FakeLLMServer


@pytest.fixture()
def corpus(tmp_path: Path) -> list[DocChunk]:
    write_sample_corpus(tmp_path / "docs")
    return load_markdown_chunks(tmp_path / "docs")


def _client(url: str) -> LLMClient:
    return LLMClient(LLMSettings(base_url=url, model="fake-model", backoff_seconds=0.0))


def _built(
    tmp_path: Path, corpus: list[DocChunk], mode: str = "ok", bs: BuildSettings | None = None
) -> DocGraphStore:
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer(mode=mode) as fake:
        DocGraphBuilder(store, _client(fake.url), bs).build(corpus)
    return store


def test_theme_id_recomputes_from_members(tmp_path, corpus):
    """Catches: unstable theme ids (order-dependent sort, ids not derived from the members)."""
    store = _built(tmp_path, corpus)
    rev = store.current_rev()["rev_id"]
    themes = store.rows(
        "SELECT theme_id, seed_entity_id, size, title FROM theme WHERE rev_id=?", (rev,)
    )
    assert themes
    for theme_id, seed, size, title in themes:
        members = store.rows(
            "SELECT e.entity_id, e.mentions, e.norm_name FROM theme_member tm JOIN entity e ON "
            "e.rev_id=tm.rev_id AND e.entity_id=tm.entity_id WHERE tm.rev_id=? AND tm.theme_id=?",
            (rev, theme_id),
        )
        ids = sorted(m[0] for m in members)
        assert len(ids) == size >= 2  # a theme without members is not a theme
        recomputed = hashlib.sha1(
            (seed + "|" + ",".join(ids)).encode(), usedforsecurity=False
        ).hexdigest()
        assert recomputed == theme_id
        best = min(members, key=lambda m: (-m[1], m[2], m[0]))
        assert best[0] == seed and title == best[2]


def _graph(
    draw_edges: list[tuple[int, int, int]],
) -> tuple[dict[str, ThemeEntity], dict[str, set[str]]]:
    entities: dict[str, ThemeEntity] = {}
    chunks: dict[str, set[str]] = {}
    for n, (a, b, c) in enumerate(draw_edges):
        ids = {f"e{a}", f"e{b}", f"e{c}"}
        chunks[f"c{n}"] = ids
        for e in ids:
            count = sum(1 for cs in chunks.values() if e in cs)
            entities[e] = ThemeEntity(e, f"name {int(e[1:]) % 5}", "concept", count)
    return entities, chunks


@settings(max_examples=60, deadline=None)
@given(
    edges=st.lists(
        st.tuples(st.integers(0, 25), st.integers(0, 25), st.integers(0, 25)), max_size=60
    ),
    max_size=st.integers(2, 6),
    seed=st.integers(0, 1000),
)
def test_themes_do_not_depend_on_input_order(edges, max_size, seed):
    """Catches: clustering that depends on dict/insertion order or on a random source."""
    entities, chunks = _graph(edges)
    cfg = ThemeSettings(min_weight=1, max_size=max_size)
    first = build_themes(entities, chunks, cfg)
    keys = list(chunks)
    random.Random(seed).shuffle(keys)
    ents = list(entities.items())
    random.Random(seed + 1).shuffle(ents)
    second = build_themes(dict(ents), {k: set(chunks[k]) for k in keys}, cfg)
    assert [(t.theme_id, t.members) for t in first] == [(t.theme_id, t.members) for t in second]
    seen: set[str] = set()
    for t in first:
        ids = {e for e, _ in t.members}
        assert 2 <= t.size <= max_size and not (ids & seen)  # disjoint, bounded, non-trivial
        seen |= ids


def test_weak_edges_are_dropped():
    """Catches: a min-weight threshold that is ignored (every single co-mention a theme)."""
    entities = {e: ThemeEntity(e, e, "concept", 1) for e in ("a", "b", "c")}
    chunks = {"c1": {"a", "b"}, "c2": {"a", "b"}, "c3": {"b", "c"}}
    themes = build_themes(entities, chunks, ThemeSettings(min_weight=2))
    assert [sorted(e for e, _ in t.members) for t in themes] == [["a", "b"]]


def test_summary_without_citations_is_neither_stored_nor_returned(tmp_path, corpus):
    """Catches: storing or returning a theme summary that cites nothing."""
    store = _built(tmp_path, corpus, mode="no_citations")
    assert store.rows("SELECT count(*) FROM theme_summary")[0][0] == 0
    stats = store.current_rev()["stats"]
    assert stats["counters"]["summary_rejected"] == stats["themes"] > 0
    answer = DocGraphOps(store).themes()
    assert answer["themes"] and all(t["summary"] is None for t in answer["themes"])


def test_summaries_cite_offered_chunks_with_addresses(tmp_path, corpus):
    """Catches: a summary citing chunks it was not given, or citations without an address."""
    store = _built(tmp_path, corpus)
    known = {
        r[0]: r[1:]
        for r in store.rows("SELECT chunk_id, path, start_line, end_line FROM doc_chunk")
    }
    rows = store.rows("SELECT text, citations_json FROM theme_summary")
    assert rows
    for text, cites_json in rows:
        cites = json.loads(cites_json)
        assert text and cites
        for c in cites:
            assert known[c["chunk_id"]] == (c["path"], c["start_line"], c["end_line"])
    for theme in DocGraphOps(store).themes()["themes"]:
        assert theme["summary"] and theme["citations"]


def test_themes_without_llm_have_no_summary_but_are_collected(tmp_path, corpus):
    """Catches: themes hidden (or summaries invented) when no LLM is configured."""
    store = DocGraphStore(tmp_path / "data")
    cfg = BuildSettings(themes=ThemeSettings(min_weight=1))
    DocGraphBuilder(store, None, cfg).build(corpus)
    answer = DocGraphOps(store).themes()
    assert answer["collected"] is True and answer["found"] is True
    assert answer["capability"] == "degraded" and "LLM not configured" in answer["reason"]
    for theme in answer["themes"]:
        assert theme["summary"] is None and theme["top_entities"] and theme["citations"]


def test_rebuild_keeps_theme_ids(tmp_path, corpus):
    """Catches: theme ids that change between revisions built from the same input."""
    store = _built(tmp_path, corpus)
    with FakeLLMServer() as fake:
        DocGraphBuilder(store, _client(fake.url)).build(list(reversed(corpus)), force=True)
    ids = [
        sorted(r[0] for r in store.rows("SELECT theme_id FROM theme WHERE rev_id=?", (rev,)))
        for rev in (1, 2)
    ]
    assert ids[0] == ids[1] and ids[0]


def test_summary_prompt_quotes_the_cited_chunks_bounded(tmp_path, corpus):
    """Catches: a summary written from entity names alone (no quotes of the chunks it may
    cite), quotes longer than their bound, or quotes that are not the chunks' own text."""
    from knowledge_server.docgraph.prompts import QUOTE_PREFIX

    bound = 120
    store = DocGraphStore(tmp_path / "data")
    by_id = {c.chunk_id: c for c in corpus}
    cfg = BuildSettings(themes=ThemeSettings(max_quote_chars=bound))
    with FakeLLMServer() as fake:
        DocGraphBuilder(store, _client(fake.url), cfg).build(corpus)
        payloads = list(fake.summary_payloads)
    assert payloads
    for payload in payloads:
        offered: dict[str, list[str]] = {}
        current = None
        for line in payload.split("\n"):
            if line.startswith("- chunk: "):
                current = line[len("- chunk: ") :].split(" ", 1)[0]
                offered[current] = []
            elif line.startswith(QUOTE_PREFIX):
                assert current is not None
                offered[current].append(line[len(QUOTE_PREFIX) :])
        assert offered
        for cid, lines in offered.items():
            quote = "\n".join(lines)
            assert quote.strip() and len(quote) <= bound
            assert by_id[cid].text.startswith(quote)  # the chunk's own text, from its start
    # The stored summaries come from the quotes (the fake model repeats their first words).
    texts = [r[0] for r in store.rows("SELECT text FROM theme_summary")]
    assert texts and all('Quoted: "' in t for t in texts)


def test_model_identity_enters_the_fingerprint(tmp_path, corpus):
    """Catches: a new local model version reusing the old layer (identity not fingerprinted)."""
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer() as fake:
        reports = []
        for version in ("v1", "v1", "v2"):
            settings_ = LLMSettings(
                base_url=fake.url,
                model="fake-model",
                provider="local",
                model_version=version,
                backoff_seconds=0.0,
            )
            reports.append(DocGraphBuilder(store, LLMClient(settings_)).build(corpus))
    assert reports[1].noop and not reports[2].noop and reports[2].drift
    assert reports[0].fingerprint == reports[1].fingerprint != reports[2].fingerprint
    assert "model" in store.drift_entries()[-1]["changes"]["changed"]
    prov = DocGraphOps(store).themes()["provenance"]
    assert prov["model"] == "local:fake-model:v2" and prov["fingerprint"] == reports[2].fingerprint
    assert "docgraph-summary/2" in prov["prompt_versions"]


_FEES = """# Fee Market

## Base fee

The `base_fee_per_gas` uses the `gas_target` of the Fee Market Change.

## Adjust

The `base_fee_per_gas` moves toward the `gas_target` each block. Fee Market Change requires it.

## Burn

The `base_fee_per_gas` is burned; the `gas_target` is half the Gas Limit Value.
"""


def test_summaries_survive_a_rename_and_a_second_workspace(tmp_path):
    """A summary cites the chunk ids it was offered; the cache key held the chunks' content
    only, so after a rename (new ids, same text), or for the same documents in another
    workspace, the cached answer cited ids no longer offered and every summary was
    rejected, for good: the rejected answer stayed cached, even through a forced build."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "fees.md").write_text(_FEES)
    (ws / "renamed-fees.md").write_text(_FEES)
    with FakeLLMServer() as fake:
        store = DocGraphStore(tmp_path / "data.sqlite")
        builder = DocGraphBuilder(store, _client(fake.url), BuildSettings())
        first = builder.build(chunk_markdown_file(ws, "fees.md"), workspace="/ws")
        assert first.summaries >= 1
        renamed = builder.build(chunk_markdown_file(ws, "renamed-fees.md"), workspace="/ws")
        assert renamed.summaries == first.summaries
        assert renamed.counters.get("summary_rejected", 0) == 0
        other = [
            dataclasses.replace(c, chunk_id="ws2:" + c.chunk_id)
            for c in chunk_markdown_file(ws, "fees.md")
        ]
        elsewhere = builder.build(other, workspace="/other-ws")
        assert elsewhere.summaries == first.summaries
        assert elsewhere.counters.get("summary_rejected", 0) == 0
