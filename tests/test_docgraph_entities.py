"""Document graph: extraction facts, identifiers, cache, fingerprint, storage without copies."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.docgraph.build import BuildSettings, DocGraphBuilder
from knowledge_server.docgraph.extract import ExtractionSettings, validate_extraction
from knowledge_server.docgraph.llm import LLMClient, LLMSettings
from knowledge_server.docgraph.model import (
    DocChunk,
    entity_id_for,
    line_span,
    norm_name,
    quote_hash,
)
from knowledge_server.docgraph.ops import DocGraphOps
from knowledge_server.docgraph.sample import SAMPLE_DOCS, load_markdown_chunks, write_sample_corpus
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.testing.fake_llm import FakeLLMServer


@pytest.fixture(scope="module")
def fake():
    with FakeLLMServer() as server:
        yield server


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    write_sample_corpus(root)
    return root


def _client(url: str) -> LLMClient:
    return LLMClient(LLMSettings(base_url=url, model="fake-model", backoff_seconds=0.0))


def _store(tmp_path: Path, name: str = "data") -> DocGraphStore:
    return DocGraphStore(tmp_path / name)


def _chunk(text: str, start_line: int = 10) -> DocChunk:
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return DocChunk(
        "c1", "doc.md", start_line, start_line + text.count("\n"), text, "markdown", "doc", digest
    )


def test_every_fact_has_a_mention_that_matches_the_text(tmp_path, corpus, fake):
    """Catches: facts without mentions (an entity or relation with no real quote in the text)."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    report = DocGraphBuilder(store, _client(fake.url)).build(chunks)
    assert report.complete and report.entities > 0 and report.relations > 0
    by_id = {c.chunk_id: c for c in chunks}
    rev = report.rev_id
    files = {rel: (corpus / rel).read_text().split("\n") for rel in SAMPLE_DOCS}
    entity_ids = {r[0] for r in store.rows("SELECT entity_id FROM entity WHERE rev_id=?", (rev,))}
    mentioned = {
        r[0]
        for r in store.rows("SELECT DISTINCT entity_id FROM entity_mention WHERE rev_id=?", (rev,))
    }
    assert entity_ids == mentioned
    for _eid, cid, path, sl, el, cs, ce, qh in store.rows(
        "SELECT entity_id, chunk_id, path, start_line, end_line, char_start, char_end, quote_hash "
        "FROM entity_mention WHERE rev_id=?",
        (rev,),
    ):
        chunk = by_id[cid]
        quote = chunk.text[cs:ce]
        assert quote and quote_hash(quote) == qh and chunk.path == path
        # Line numbers derived from offsets point at the lines that hold the quote.
        first_line = quote.split("\n")[0]
        assert first_line in files[path][sl - 1]
        assert chunk.start_line <= sl <= el <= chunk.end_line
    for src, dst, cid, _sl, qh in store.rows(
        "SELECT src_entity_id, dst_entity_id, chunk_id, start_line, quote_hash "
        "FROM entity_relation WHERE rev_id=?",
        (rev,),
    ):
        assert src in entity_ids and dst in entity_ids and cid in by_id
        assert qh.startswith("sha256:")


@pytest.mark.parametrize(
    ("mode", "counter"),
    [
        ("invent_entity", "mention_not_found"),
        ("unknown_kind", "unknown_kind"),
        ("malformed_json", "malformed_json"),
        ("bad_evidence", "evidence_not_found"),
    ],
)
def test_invalid_llm_answers_are_rejected_and_counted(tmp_path, corpus, mode, counter):
    """Catches: accepting invented entities, unknown kinds, broken JSON or unquoted relations."""
    chunks = load_markdown_chunks(corpus)
    with FakeLLMServer(mode=mode) as bad:
        store = _store(tmp_path)
        report = DocGraphBuilder(store, _client(bad.url), BuildSettings(structural=False)).build(
            chunks
        )
    assert report.counters.get(counter, 0) > 0
    names = {r[0] for r in store.rows("SELECT norm_name FROM entity")}
    assert "quantum ledger oracle" not in names
    kinds = {r[0] for r in store.rows("SELECT kind FROM entity")}
    assert "galaxy" not in kinds
    if mode in ("unknown_kind", "malformed_json"):
        assert report.entities == 0
    if mode == "bad_evidence":
        assert report.relations == 0


_ALPHA = st.text(alphabet="abcXYZ -.\n", min_size=0, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=_ALPHA,
    picks=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8), st.booleans()), max_size=6),
)
def test_validation_accepts_only_mentions_found_in_text(text, picks):
    """Catches: dropping the mention check (a fact whose mention is not in the chunk)."""
    chunk = _chunk(text)
    ents = []
    for start, length, real in picks:
        piece = text[start : start + length] if real else "zzqq" + str(start)
        ents.append({"name": piece or "zz", "kind": "concept", "mention": piece or "zz"})
    answer = json.dumps({"entities": ents, "relations": []})
    res = validate_extraction(chunk, answer, ExtractionSettings(min_name_chars=1))
    for m in res.mentions:
        quote = text[m.char_start : m.char_end]
        assert quote and quote.lower() in text.lower()
        assert (
            norm_name(m.name) and norm_name(m.name) in text.lower()
        ) or m.name.lower() in quote.lower()
    assert sum(res.counters.values()) == len(ents)


def test_relation_requires_accepted_entities_and_quoted_evidence():
    """Catches: relations to entities that were rejected, or with evidence not in the text."""
    text = "The Fee Market requires the Base Fee Oracle. Nothing else."
    chunk = _chunk(text, start_line=3)
    answer = json.dumps(
        {
            "entities": [
                {"name": "Fee Market", "kind": "concept", "mention": "Fee Market"},
                {"name": "Base Fee Oracle", "kind": "component", "mention": "base fee oracle"},
                {"name": "Ghost", "kind": "concept", "mention": "Ghost"},
            ],
            "relations": [
                {
                    "src": "Fee Market",
                    "dst": "Base Fee Oracle",
                    "kind": "requires",
                    "evidence": "The Fee Market requires the Base Fee Oracle.",
                },
                {
                    "src": "Fee Market",
                    "dst": "Ghost",
                    "kind": "requires",
                    "evidence": "Nothing else.",
                },
                {
                    "src": "Fee Market",
                    "dst": "Base Fee Oracle",
                    "kind": "requires",
                    "evidence": "a quote that is not there",
                },
                {
                    "src": "Fee Market",
                    "dst": "Base Fee Oracle",
                    "kind": "teleports",
                    "evidence": "Nothing else.",
                },
            ],
        }
    )
    res = validate_extraction(chunk, answer, ExtractionSettings())
    assert [m.name for m in res.mentions] == ["Fee Market", "Base Fee Oracle"]
    assert len(res.relations) == 1
    rel = res.relations[0]
    assert text[rel.char_start : rel.char_end] == "The Fee Market requires the Base Fee Oracle."
    c = res.counters
    assert (
        c["mention_not_found"],
        c["relation_unknown_entity"],
        c["evidence_not_found"],
        c["unknown_relation_kind"],
    ) == (1, 1, 1, 1)


@given(name=st.text(min_size=1, max_size=30), kind=st.sampled_from(["concept", "standard"]))
def test_entity_id_is_a_pure_function(name, kind):
    """Catches: nondeterministic entity ids (random, time or order dependent)."""
    norm = norm_name(name)
    assert (
        entity_id_for(norm, kind)
        == hashlib.sha1((norm + "|" + kind).encode(), usedforsecurity=False).hexdigest()
    )
    # Surrounding whitespace never changes the merge key, so it never changes the id.
    assert entity_id_for(norm_name("  " + name + " \t"), kind) == entity_id_for(norm, kind)


def test_ids_and_layer_do_not_depend_on_input_order(tmp_path, corpus, fake):
    """Catches: nondeterministic ids or layer rows that depend on chunk order."""
    chunks = load_markdown_chunks(corpus)
    shuffled = list(chunks)
    random.Random(7).shuffle(shuffled)
    a, b = _store(tmp_path, "a"), _store(tmp_path, "b")
    ra = DocGraphBuilder(a, _client(fake.url)).build(chunks)
    rb = DocGraphBuilder(b, _client(fake.url)).build(shuffled)
    assert a.dump_layer(ra.rev_id) == b.dump_layer(rb.rev_id)
    assert ra.fingerprint == rb.fingerprint


def test_second_run_makes_zero_calls_and_an_identical_layer(tmp_path, corpus, fake):
    """Catches: a cache that misses (LLM called again) or a rebuild that is not byte-identical."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    builder = DocGraphBuilder(store, _client(fake.url))
    est0 = builder.estimate(chunks)
    assert est0.cached == 0 and est0.expected_calls == est0.chunks_to_process == len(chunks)
    first = builder.build(chunks)
    assert first.llm_calls > 0
    est1 = builder.estimate(chunks)
    assert est1.expected_calls == 0 and est1.cached == len(chunks)
    before = fake.calls
    second = builder.build(chunks, force=True)
    assert fake.calls == before and second.llm_calls == 0
    assert second.rev_id != first.rev_id
    assert store.dump_layer(first.rev_id) == store.dump_layer(second.rev_id)


def test_rebuild_without_fingerprint_change_is_a_noop_and_a_change_is_drift(tmp_path, corpus, fake):
    """Catches: rebuilding (new revision) without a fingerprint change; silent replacement."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    builder = DocGraphBuilder(store, _client(fake.url))
    first = builder.build(chunks)
    again = builder.build(list(reversed(chunks)))
    assert again.noop and again.rev_id == first.rev_id and store.revision_count() == 1
    assert store.drift_entries() == []
    # A changed document changes the fingerprint: new revision + drift entry.
    (corpus / "eip-300.md").write_text(SAMPLE_DOCS["eip-300.md"] + "\nA new Gas Refund Rule.\n")
    changed = DocGraphBuilder(store, _client(fake.url)).build(load_markdown_chunks(corpus))
    assert not changed.noop and changed.drift and changed.rev_id == first.rev_id + 1
    assert store.drift_entries()[-1]["changes"]["changed"] == ["chunks"]
    # Changed extraction settings: drift again, naming the settings.
    other = BuildSettings(extraction=ExtractionSettings(max_entities_per_chunk=5))
    DocGraphBuilder(store, _client(fake.url), other).build(load_markdown_chunks(corpus))
    assert store.drift_entries()[-1]["changes"]["changed"] == ["settings"]
    # The old revision is unchanged.
    assert store.dump_layer(first.rev_id)


def test_database_holds_no_corpus_sentences(tmp_path, corpus, fake):
    """Catches: quotes stored as copied text (the layer becoming a second corpus)."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    DocGraphBuilder(store, _client(fake.url)).build(chunks)
    DocGraphOps(store, _client(fake.url)).search_levels("fee market EIP-200")
    store.close()
    raw = b"".join(p.read_bytes() for p in (tmp_path / "data").iterdir() if p.is_file())
    for sentence in (
        "The Fee Market design requires EIP-200 for the Base Fee Oracle.",
        "Clients read the Storage Slot Map through SLOAD.",
        "requires the Base Fee Oracle",
        "Operators watch",
    ):
        assert sentence.encode() not in raw
    assert b"Base Fee Oracle" in raw  # entity names are the only text kept


def test_budget_stops_a_run_and_the_next_run_resumes(tmp_path, corpus, fake):
    """Catches: a budget stop that is not reported, or a rerun that redoes finished chunks."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    ticks = iter(range(10_000))

    def clock() -> float:
        return float(next(ticks))

    limited = BuildSettings(budget_seconds=4, summaries=False)
    first = DocGraphBuilder(store, _client(fake.url), limited, clock=clock).build(chunks)
    assert first.stopped_by == "budget" and not first.complete and first.pending_chunks > 0
    assert "budget" in (first.reason or "")
    view = DocGraphOps(store).global_overview()
    assert view["capability"] == "degraded" and "budget" in view["reason"]
    done = first.processed_chunks
    second = DocGraphBuilder(store, _client(fake.url), BuildSettings(summaries=False)).build(chunks)
    assert second.complete and second.cached_chunks == done
    assert second.processed_chunks == len(chunks) - done
    assert DocGraphOps(store).global_overview()["capability"] == "full"


def test_max_chunks_caps_llm_calls_per_run(tmp_path, corpus, fake):
    """Catches: a per-run chunk cap that is ignored (unbounded cost)."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    capped = BuildSettings(max_chunks=3, summaries=False)
    builder = DocGraphBuilder(store, _client(fake.url), capped)
    assert builder.estimate(chunks).expected_calls == 3
    report = builder.build(chunks)
    assert report.llm_calls == 3 and report.stopped_by == "max_chunks"
    assert report.pending_chunks == len(chunks) - 3


def test_structural_extractor_reads_front_matter_and_links(tmp_path, corpus):
    """Catches: structural facts without real offsets, or missing requires/author/link facts."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    report = DocGraphBuilder(store, None).build(chunks)
    assert report.llm_state == "not_configured" and report.entities > 0
    rels = store.rows(
        "SELECT s.name, r.kind, d.name, r.path, r.start_line, r.built_by FROM entity_relation r "
        "JOIN entity s ON s.rev_id=r.rev_id AND s.entity_id=r.src_entity_id "
        "JOIN entity d ON d.rev_id=r.rev_id AND d.entity_id=r.dst_entity_id"
    )
    got = {(a, k, b, p, line) for a, k, b, p, line, _ in rels}
    assert ("EIP-100", "requires", "EIP-200", "eip-100.md", 8) in got
    assert ("EIP-100", "requires", "EIP-300", "eip-100.md", 8) in got
    assert ("EIP-100", "authored_by", "Bob Roe", "eip-100.md", 4) in got
    assert ("EIP-100", "in_category", "Core", "eip-100.md", 7) in got
    assert ("EIP-200", "links_to", "EIP-100", "eip-200.md", 18) in got
    assert ("Operator Notes", "links_to", "EIP-100", "notes/operator-notes.md", 7) in got
    assert {b for *_, b in rels} == {"structural"}
    by_id = {c.chunk_id: c for c in chunks}
    for eid, cid, cs, ce in store.rows(
        "SELECT m.entity_id, m.chunk_id, m.char_start, m.char_end FROM entity_mention m"
    ):
        name = store.one("SELECT name, kind FROM entity WHERE entity_id=?", (eid,))
        quote = by_id[cid].text[cs:ce]
        if name[1] == "person":
            assert quote == name[0]
        if name[1] == "standard" and not quote.startswith("["):
            assert name[0].endswith(quote)  # EIP-200 cited by its number "200"


def test_prune_keeps_the_newest_revisions(tmp_path, corpus, fake):
    """Catches: pruning that touches the current revision or leaves orphaned layer rows."""
    chunks = load_markdown_chunks(corpus)
    store = _store(tmp_path)
    builder = DocGraphBuilder(store, _client(fake.url))
    revs = [builder.build(chunks, force=True).rev_id for _ in range(3)]
    current = store.dump_layer(revs[-1])
    assert store.prune_revisions(keep=1) == 2
    assert store.revision_count() == 1 and store.dump_layer(revs[-1]) == current
    assert store.dump_layer(revs[0]) == b""


def test_fenced_json_is_read_and_garbage_is_counted():
    """Catches: a fenced JSON answer lost as malformed, or garbage accepted as an answer."""
    chunk = _chunk("The Fee Market is here.")
    body = json.dumps(
        {
            "entities": [{"name": "Fee Market", "kind": "concept", "mention": "Fee Market"}],
            "relations": [],
        }
    )
    fenced = validate_extraction(chunk, "```json\n" + body + "\n```", ExtractionSettings())
    assert [m.name for m in fenced.mentions] == ["Fee Market"]
    for garbage in ("", "not json", "[1, 2]", '{"entities": 3}', "```\n{\n```"):
        res = validate_extraction(chunk, garbage, ExtractionSettings())
        assert res.mentions == [] and res.counters["malformed_json"] == 1


def test_llm_offsets_point_at_the_text_after_letters_that_lower_casing_lengthens() -> None:
    """Every fact has an exact address: mention and evidence spans were found in
    ``text.lower()``, which is longer than the text after each "İ", so the stored span (and
    its lines and quote hash) pointed at other text."""
    text = "İSTANBUL İZMİR İĞDIR İNEGÖL sets the Gas Limit\nThe Gas Limit caps the Base Fee here\n"
    chunk = DocChunk("c1", "tr.md", 10, 11, text, "markdown", "doc", "h")
    answer = json.dumps(
        {
            "entities": [
                {"name": "Gas Limit", "kind": "concept", "mention": "gas limit"},
                {"name": "Base Fee", "kind": "concept", "mention": "Base Fee"},
            ],
            "relations": [
                {
                    "src": "Gas Limit",
                    "dst": "Base Fee",
                    "kind": "uses",
                    "evidence": "the gas limit caps the base fee",
                }
            ],
        }
    )
    res = validate_extraction(chunk, answer, ExtractionSettings())
    gas, fee = res.mentions
    assert text[gas.char_start : gas.char_end] == "Gas Limit"
    assert text[fee.char_start : fee.char_end] == "Base Fee"
    (rel,) = res.relations
    assert text[rel.char_start : rel.char_end] == "The Gas Limit caps the Base Fee"
    assert line_span(chunk, fee.char_start, fee.char_end) == (11, 11)
