"""The knowledge base's retrieval index contract (KB-IDX-n), run against both
implementations: the embedded SQLite one and Milvus (Milvus Lite, a real local file).

KB-IDX-1  a staged revision is invisible to a search that does not name it
KB-IDX-2  organisations are isolated, even with the same words, vectors, revision and chunk ids
KB-IDX-3  staging a revision again replaces its rows
KB-IDX-4  dropping a revision is idempotent and touches nothing else
KB-IDX-5  tag filters: every tag of ``tags``, at least one of ``any_tags``
KB-IDX-6  an FAQ entry comes back whole, as one chunk of kind ``faq``
KB-IDX-7  lexical-only, vector-only and hybrid searches find their hits, fused by RRF
KB-IDX-8  ``revision_counts`` reports what was staged, per organisation and revision
KB-IDX-9  a backend answer holding another organisation's row is filtered out
KB-IDX-10 ``get_chunks`` returns the organisation's chunks, fields intact, in request order
KB-IDX-11 rows survive closing and reopening the index
KB-IDX-12 staging refuses rows of another organisation or revision, and mismatched vectors
KB-IDX-13 the embedded store refuses a file written by a newer version (named migrations)
KB-IDX-14 the embedded index's vector list over many revisions is the exact nearest visible rows
KB-IDX-15 the embedded index's rows held in memory follow every write, from any connection
KB-IDX-16 the embedded index's text list in memory ranks as FTS5's bm25() over the same rows
KB-IDX-17 another organisation's rows, or hidden revisions, do not move a text ranking
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apsw
import pytest
from knowledge_server.kb.chunk import chunk_document
from knowledge_server.kb.convert import FaqEntry, convert_faq
from knowledge_server.kb.index.port import RRF_K, IndexChunk, RetrievalIndex, index_chunks
from knowledge_server.kb.index.sqlite import (
    STORE_FILE,
    SqliteRetrievalIndex,
    _fts_query,
    _search_terms,
)
from knowledge_server.schema import StoreTooNew

DIM = 8
Opener = Callable[[], RetrievalIndex]


def _unit(i: int) -> list[float]:
    v = [0.0] * DIM
    v[i] = 1.0
    return v


def _milvus_opener(tmp_path: Path) -> Opener:
    try:
        from knowledge_server.kb.index.milvus import MilvusRetrievalIndex
    except ImportError as exc:  # pragma: no cover - the dependency is in pyproject
        pytest.skip(f"pymilvus is not installed: {exc}")
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    uri = str(tmp_path / "kb_index.milvus.db")

    def open_index() -> RetrievalIndex:
        try:
            return MilvusRetrievalIndex(uri, dim=DIM)
        except Exception as exc:  # noqa: BLE001 - any start-up failure of milvus-lite means "cannot run here"
            pytest.skip(f"milvus-lite cannot start on this machine: {exc}")

    return open_index


@pytest.fixture(params=["sqlite", "milvus"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    if request.param == "sqlite":
        path = tmp_path / STORE_FILE

        def open_sqlite() -> RetrievalIndex:
            return SqliteRetrievalIndex(path, dim=DIM)

        yield open_sqlite
    else:
        yield _milvus_opener(tmp_path)


@pytest.fixture
def index(opener: Opener) -> Iterator[RetrievalIndex]:
    idx = opener()
    yield idx
    idx.close()


def _chunk(
    org: str,
    rev: str,
    n: int,
    text: str,
    *,
    tags: Sequence[str] = (),
    kind: str = "text",
    section: tuple[str, ...] = ("Timing",),
    page: int | None = None,
) -> IndexChunk:
    return IndexChunk(
        chunk_id=f"{rev}:{n}",
        org=org,
        topic_id="topic-refunds",
        revision_id=rev,
        source_id="src-1",
        ordinal=n,
        kind=kind,
        title="Refund policy",
        section_path=section,
        page=page,
        text=text,
        tags=tuple(tags),
    )


# Background rows so that BM25's term statistics look like a real collection's (a term
# in most documents of a tiny collection has a negative IDF in Milvus's BM25).
FILLER = [
    "Shipping labels are printed at the warehouse",
    "Passwords must be rotated every ninety days",
    "The cafeteria opens at eight",
    "Invoices are archived for seven years",
    "Printers on the third floor need toner",
    "Parking permits are issued by facilities",
]


def _stage_filler(index: RetrievalIndex, org: str, rev: str = "filler") -> None:
    chunks = [_chunk(org, rev, i, text, section=("Misc",)) for i, text in enumerate(FILLER)]
    index.stage(org, rev, chunks, [_unit(7)] * len(chunks))


def _ids(hits: Sequence[Any]) -> list[tuple[str, str]]:
    return [(h.chunk.org, h.chunk.chunk_id) for h in hits]


def test_kb_idx_1_staged_revision_is_invisible_unless_named(index: RetrievalIndex) -> None:
    """KB-IDX-1: rows of a staged revision answer only a search that names it."""
    _stage_filler(index, "acme")
    index.stage("acme", "r2", [_chunk("acme", "r2", 0, "Refunds arrive in three days")], [_unit(0)])
    for revs in ([], ["r1"], ["filler"]):
        hits = index.search("acme", "refunds arrive", _unit(0), revision_ids=revs, k=10)
        assert all(h.chunk.revision_id != "r2" for h in hits), revs
    hits = index.search("acme", "refunds arrive", _unit(0), revision_ids=["r2"], k=10)
    assert _ids(hits) == [("acme", "r2:0")]


def test_kb_idx_2_organisations_are_isolated(index: RetrievalIndex) -> None:
    """KB-IDX-2: two organisations with the same revision id, chunk ids, words and vectors
    never see each other's rows, in any search mode, in get_chunks or in drop."""
    for org in ("acme", "globex"):
        _stage_filler(index, org)
        index.stage(
            org,
            "r1",
            [
                _chunk(org, "r1", 0, f"Refunds arrive in three days ({org})"),
                _chunk(org, "r1", 1, "Membership renews every year"),
            ],
            [_unit(0), _unit(1)],
        )
    for text, vector in (("refunds arrive", None), ("", _unit(0)), ("refunds arrive", _unit(0))):
        for org in ("acme", "globex"):
            hits = index.search(org, text, vector, revision_ids=["r1", "filler"], k=20)
            assert hits, (org, text)
            assert {h.chunk.org for h in hits} == {org}
            assert all(org in h.chunk.text for h in hits if h.chunk.chunk_id == "r1:0")
    assert [c.org for c in index.get_chunks("acme", ["r1:0", "r1:1"])] == ["acme", "acme"]
    assert index.search("initech", "refunds", _unit(0), revision_ids=["r1"], k=5) == []
    assert index.drop_revision("acme", "r1") == 2
    assert index.revision_counts("globex")[("globex", "r1")] == 2


def test_kb_idx_3_restage_replaces_rows(index: RetrievalIndex) -> None:
    """KB-IDX-3: staging a revision again leaves only the new rows."""
    _stage_filler(index, "acme")
    old = [_chunk("acme", "r1", i, f"Old wording about vouchers {i}") for i in range(3)]
    index.stage("acme", "r1", old, [_unit(0)] * 3)
    new = [_chunk("acme", "r1", 0, "New wording about refunds")]
    index.stage("acme", "r1", new, [_unit(1)])
    index.stage("acme", "r1", new, [_unit(1)])  # and again: still one row
    assert index.revision_counts("acme")[("acme", "r1")] == 1
    assert index.search("acme", "vouchers", None, revision_ids=["r1"], k=5) == []
    hits = index.search("acme", "refunds", _unit(1), revision_ids=["r1"], k=5)
    assert [h.chunk.text for h in hits] == ["New wording about refunds"]
    assert index.get_chunks("acme", ["r1:1", "r1:2"]) == []


def test_kb_idx_4_drop_is_idempotent(index: RetrievalIndex) -> None:
    """KB-IDX-4: drop returns the rows removed, 0 the second time, and leaves other
    revisions and organisations alone."""
    index.stage(
        "acme", "r1", [_chunk("acme", "r1", i, f"text {i}") for i in range(4)], [_unit(0)] * 4
    )
    index.stage("acme", "r2", [_chunk("acme", "r2", 0, "text")], [_unit(0)])
    index.stage("globex", "r1", [_chunk("globex", "r1", 0, "text")], [_unit(0)])
    assert index.drop_revision("acme", "r1") == 4
    assert index.drop_revision("acme", "r1") == 0
    assert index.drop_revision("acme", "never-staged") == 0
    assert index.revision_counts() == {("acme", "r2"): 1, ("globex", "r1"): 1}
    assert index.search("acme", "text", _unit(0), revision_ids=["r1"], k=5) == []


def test_kb_idx_5_tag_filters(index: RetrievalIndex) -> None:
    """KB-IDX-5: ``tags`` keeps rows with every listed tag, ``any_tags`` rows with one of
    them, both together both; in lexical, vector and hybrid searches alike."""
    _stage_filler(index, "acme")
    index.stage(
        "acme",
        "ra",
        [_chunk("acme", "ra", 0, "Refunds for members", tags=["after_sales", "x100"])],
        [_unit(0)],
    )
    index.stage(
        "acme",
        "rb",
        [_chunk("acme", "rb", 0, "Refunds for guests", tags=["after_sales"])],
        [_unit(0)],
    )
    index.stage(
        "acme", "rc", [_chunk("acme", "rc", 0, "Refunds for partners", tags=["refund"])], [_unit(0)]
    )
    revs = ["ra", "rb", "rc", "filler"]
    for text, vector in (("refunds", None), ("", _unit(0)), ("refunds", _unit(0))):

        def found(**kw: Any) -> set[str]:
            return {
                h.chunk.revision_id
                for h in index.search("acme", text, vector, revision_ids=revs, k=10, **kw)  # noqa: B023 - used within the loop iteration
            }

        assert found(tags=["after_sales"]) == {"ra", "rb"}
        assert found(tags=["after_sales", "x100"]) == {"ra"}
        assert found(any_tags=["x100", "refund"]) == {"ra", "rc"}
        assert found(tags=["after_sales"], any_tags=["refund"]) == set()
        assert found(tags=["unknown"]) == set()


def test_kb_idx_6_faq_entry_comes_back_whole(index: RetrievalIndex) -> None:
    """KB-IDX-6: a long FAQ entry is one chunk (question, then answer) and is returned whole."""
    answer = " ".join(f"Step {i}: the refund is checked by the payments team." for i in range(120))
    doc = convert_faq("Refund FAQ", [FaqEntry("How long does a refund take?", answer)])
    chunks = chunk_document(doc)
    assert len(chunks) == 1
    rows = index_chunks(
        org="acme", topic_id="t", revision_id="r1", tags=["refund"], sources=[("faq-1", chunks)]
    )
    _stage_filler(index, "acme")
    index.stage("acme", "r1", rows, [_unit(2)])
    for text, vector in (("refund take", None), ("", _unit(2)), ("refund take", _unit(2))):
        hits = index.search("acme", text, vector, revision_ids=["r1", "filler"], k=3)
        faq = [h for h in hits if h.chunk.kind == "faq"]
        assert len(faq) == 1
        assert faq[0].chunk.text == f"How long does a refund take?\n{answer}"


def test_kb_idx_7_lexical_vector_and_hybrid(index: RetrievalIndex) -> None:
    """KB-IDX-7: text alone ranks by BM25, a vector alone by cosine, both fuse by RRF;
    a single list's hit scores 1 / (RRF_K + rank)."""
    _stage_filler(index, "acme")
    index.stage(
        "acme",
        "r1",
        [
            _chunk("acme", "r1", 0, "Refunds arrive within three working days", section=("A",)),
            _chunk("acme", "r1", 1, "Membership renews automatically", section=("B",)),
        ],
        [_unit(0), _unit(1)],
    )
    revs = ["r1", "filler"]
    # One term only in r1:0 ("days" is in a filler row too: Milvus Lite weighs terms by its
    # segments' statistics, so how two partial matches compare is the backend's business).
    lexical = index.search("acme", "working", None, revision_ids=revs, k=3)
    assert lexical[0].chunk.chunk_id == "r1:0"
    assert lexical[0].lexical_rank == 1 and lexical[0].vector_rank is None
    assert lexical[0].score == pytest.approx(1 / (RRF_K + 1))
    assert all(h.chunk.chunk_id != "r1:1" for h in lexical)

    vector = index.search("acme", "", _unit(1), revision_ids=revs, k=3)
    assert vector[0].chunk.chunk_id == "r1:1"
    assert vector[0].vector_rank == 1 and vector[0].lexical_rank is None

    hybrid = index.search("acme", "working", _unit(1), revision_ids=revs, k=2)
    assert {h.chunk.chunk_id for h in hybrid} == {"r1:0", "r1:1"}
    assert all(h.score > 1 / (RRF_K + 2) - 1e-9 for h in hybrid)
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    for h in hybrid:  # ranks, where a backend reports them, agree with the fused score
        ranks = [r for r in (h.lexical_rank, h.vector_rank) if r is not None]
        if ranks:
            assert h.score == pytest.approx(sum(1 / (RRF_K + r) for r in ranks))
    assert index.search("acme", "", None, revision_ids=revs, k=3) == []
    assert index.search("acme", "refunds", _unit(0), revision_ids=revs, k=0) == []


def test_kb_idx_8_revision_counts(index: RetrievalIndex) -> None:
    """KB-IDX-8: (org, revision) -> rows, for all organisations or one."""
    staged = {("acme", "r1"): 3, ("acme", "r2"): 1, ("globex", "r9"): 2}
    for (org, rev), n in staged.items():
        index.stage(org, rev, [_chunk(org, rev, i, f"row {i}") for i in range(n)], [_unit(0)] * n)
    assert index.revision_counts() == staged
    assert index.revision_counts("acme") == {k: v for k, v in staged.items() if k[0] == "acme"}
    assert index.revision_counts("initech") == {}


def test_kb_idx_9_milvus_hybrid_answer_with_a_foreign_row_is_filtered(tmp_path: Path) -> None:
    """KB-IDX-9: when Milvus's hybrid_search answers rows of another organisation (it is
    reported not to enforce partition-key isolation; here its requests lose their
    organisation condition on the way), the index still returns only the caller's rows."""
    from knowledge_server.kb.index.milvus import MilvusRetrievalIndex

    index = _milvus_opener(tmp_path)()
    assert isinstance(index, MilvusRetrievalIndex)
    try:
        for org in ("acme", "globex"):
            index.stage(
                org, "r1", [_chunk(org, "r1", 0, "Refunds arrive in three days")], [_unit(0)]
            )
        client = index.client
        real = client.hybrid_search
        answered: list[str] = []

        def leaky(collection: str, reqs: list[Any], ranker: Any, **kw: Any) -> Any:
            from pymilvus import AnnSearchRequest

            widened = [
                AnnSearchRequest(
                    data=r.data,
                    anns_field=r.anns_field,
                    param=r.param,
                    limit=r.limit,
                    expr=r.expr.split(" and ", 1)[1],  # drops "org == ..."
                )
                for r in reqs
            ]
            result = real(collection, widened, ranker, **kw)
            answered.extend(h["entity"]["org"] for h in result[0])
            return result

        client.hybrid_search = leaky
        hits = index.search("acme", "refunds arrive", _unit(0), revision_ids=["r1"], k=5)
        assert "globex" in answered  # the backend did answer the foreign row ...
        assert _ids(hits) == [("acme", "r1:0")]  # ... and it was not returned
    finally:
        index.close()


def test_kb_idx_10_get_chunks(index: RetrievalIndex) -> None:
    """KB-IDX-10: get_chunks returns the caller's chunks with every field as staged, in
    the order asked, leaving out unknown ids and other organisations' rows."""
    a = _chunk(
        "acme",
        "r1",
        0,
        "Page three says refunds",
        section=("Refunds", "Timing"),
        page=3,
        tags=["refund"],
    )
    b = _chunk(
        "acme", "r1", 1, "你好，退款将在 1—3 个工作日原路退回。", kind="faq", section=(), page=None
    )
    index.stage("acme", "r1", [a, b], [_unit(0), _unit(1)])
    index.stage("globex", "r1", [_chunk("globex", "r1", 2, "other")], [_unit(0)])
    assert index.get_chunks("acme", ["r1:1", "missing", "r1:0", "r1:2"]) == [b, a]
    assert index.get_chunks("acme", []) == []
    assert index.get_chunks("globex", ["r1:0"]) == []


def test_kb_idx_11_rows_survive_reopening(opener: Opener) -> None:
    """KB-IDX-11: what was staged is there after the index is closed and opened again."""
    first = opener()
    first.stage("acme", "r1", [_chunk("acme", "r1", 0, "Refunds arrive in three days")], [_unit(0)])
    first.close()
    second = opener()
    try:
        assert second.revision_counts() == {("acme", "r1"): 1}
        hits = second.search("acme", "refunds", _unit(0), revision_ids=["r1"], k=1)
        assert _ids(hits) == [("acme", "r1:0")]
    finally:
        second.close()


def test_kb_idx_12_stage_refuses_inconsistent_rows(index: RetrievalIndex) -> None:
    """KB-IDX-12: rows of another organisation or revision, a repeated chunk id, an
    unknown kind or vectors that do not match are refused, and nothing is written."""
    good = _chunk("acme", "r1", 0, "text")
    cases = [
        ([_chunk("globex", "r1", 0, "text")], [_unit(0)]),
        ([_chunk("acme", "r2", 0, "text")], [_unit(0)]),
        ([good, good], [_unit(0), _unit(0)]),
        ([_chunk("acme", "r1", 0, "text", kind="table")], [_unit(0)]),
        ([good], []),
        ([good], [[1.0, 0.0]]),
    ]
    for chunks, vectors in cases:
        with pytest.raises(ValueError):
            index.stage("acme", "r1", chunks, vectors)
    assert index.revision_counts() == {}


def test_kb_idx_13_sqlite_store_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    """KB-IDX-13: the embedded index's schema is named migrations; a store that records a
    step this version does not know is refused instead of misread."""
    path = tmp_path / STORE_FILE
    SqliteRetrievalIndex(path, dim=DIM).close()
    conn = apsw.Connection(str(path))
    assert [r[0] for r in conn.execute("SELECT name FROM migrations")] == [
        "001_initial",
        "002_generations",
    ]
    conn.execute("INSERT INTO migrations(name, applied_at) VALUES('999_future', 'now')")
    conn.close()
    with pytest.raises(StoreTooNew, match="999_future"):
        SqliteRetrievalIndex(path, dim=DIM)


@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.parametrize("visible", [40, 17])
def test_kb_idx_14_sqlite_vector_nearest_of_many_revisions_are_exact(
    tmp_path: Path, visible: int, in_memory: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KB-IDX-14: the SQLite index's vector list is exactly the nearest visible rows
    (brute-force cosine), from the organisation's vectors in memory, or (over the memory
    limit) from vec0, which is asked for the organisation's nearest rows first and drops
    other revisions' itself, whether most revisions are visible (40 of 60) or few (17 of
    200: the filtered query answers)."""
    import numpy as np

    if not in_memory:
        monkeypatch.setattr("knowledge_server.kb.index.sqlite.MEMORY_VECTOR_BYTES", 0)

    rng = np.random.default_rng(14)
    idx = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=8)
    total = 60 if visible == 40 else 200
    vectors: dict[str, np.ndarray] = {}
    for r in range(total):
        rev = f"rev{r:03d}"
        chunks = [
            IndexChunk(f"{rev}:{n}", "o", f"t{r}", rev, "s", n, "text", "T", (), None, "x", ())
            for n in range(5)
        ]
        vecs = rng.normal(size=(5, 8)).astype(np.float32)
        idx.stage("o", rev, chunks, vecs.tolist())
        for chunk, vec in zip(chunks, vecs, strict=True):
            vectors[chunk.chunk_id] = vec
    shown = {f"rev{r:03d}" for r in rng.choice(total, size=visible, replace=False)}
    idx.warm("o", wait=True)
    assert idx.held("o") is in_memory
    try:
        for _ in range(5):
            query = rng.normal(size=8).astype(np.float32)
            hits = idx.search("o", "", query.tolist(), revision_ids=shown, k=10)
            cos = {
                cid: float(v @ query / (np.linalg.norm(v) * np.linalg.norm(query)))
                for cid, v in vectors.items()
                if cid.split(":")[0] in shown
            }
            best = sorted(cos, key=lambda c: -cos[c])[:10]
            assert [h.chunk.chunk_id for h in hits] == best
    finally:
        idx.close()


def test_kb_idx_15_sqlite_in_memory_lists_follow_writes_of_other_processes(tmp_path: Path) -> None:
    """KB-IDX-15: the organisation's rows held in memory follow every write to the store,
    also one made through another connection (another serving process): a new revision's
    rows are found, a dropped one's never, and tag filters give what vec0 and the joined
    text query give."""
    import numpy as np

    rng = np.random.default_rng(15)
    reader = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=8)
    writer = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=8)

    def rows(rev: str, words: str, tags: tuple[str, ...]) -> list[IndexChunk]:
        return [
            IndexChunk(
                f"{rev}:{n}",
                "o",
                f"t-{rev}",
                rev,
                "s",
                n,
                "text",
                "T",
                (),
                None,
                f"{words} {n}",
                tags,
            )
            for n in range(4)
        ]

    def found(text: str, **filters: Any) -> set[str]:
        hits = reader.search("o", text, q, revision_ids={"r1", "r2"}, k=10, **filters)
        return {h.chunk.revision_id for h in hits}

    try:
        writer.stage("o", "r1", rows("r1", "alpha beta", ("a",)), rng.normal(size=(4, 8)).tolist())
        q = rng.normal(size=8).tolist()
        for warm in (False, True):  # a search right after a write, and once rebuilt
            if warm:
                reader.warm("o", wait=True)
                assert reader.held("o")
            assert found("alpha") == {"r1"}
        writer.stage("o", "r2", rows("r2", "alpha gamma", ("b",)), rng.normal(size=(4, 8)).tolist())
        assert not reader.held("o")  # another connection's write is seen
        for warm in (False, True):
            if warm:
                reader.warm("o", wait=True)
                assert reader.held("o")
            assert found("alpha") == {"r1", "r2"}
            assert found("alpha", tags=("b",)) == {"r2"}
            assert found("gamma", any_tags=("a", "zz")) == {"r1"}
        writer.drop_revision("o", "r2")
        assert not reader.held("o")
        for warm in (False, True):
            if warm:
                reader.warm("o", wait=True)
                assert reader.held("o")
            assert found("gamma alpha") == {"r1"}
    finally:
        reader.close()
        writer.close()


_WORDS = (
    "refund policy customer order payment invoice shipping delay account password reset "
    "token ledger balance transfer fee limit card travel insurance claim window"
).split()
_EXTRA = ["load_config", "read_only_mode", "возврат средств", "退款政策", "refunds", "paid"]


def _corpus(
    rng: Any, rev: str, org: str, n: int, vocabulary: Sequence[str] = _WORDS
) -> list[IndexChunk]:
    """``n`` chunks of words drawn with very different frequencies, with identifiers
    (phrases to FTS5), Cyrillic and CJK words among them."""
    weights = 1.0 / (1.0 + rng.permutation(len(vocabulary)))
    weights /= weights.sum()
    out = []
    for i in range(n):
        words = list(rng.choice(vocabulary, size=int(rng.integers(3, 60)), p=weights))
        if rng.random() < 0.3:
            words.insert(int(rng.integers(0, len(words))), str(rng.choice(_EXTRA)))
        out.append(
            IndexChunk(
                f"{rev}:{i}",
                org,
                f"t-{rev}",
                rev,
                "s",
                i,
                "text",
                str(rng.choice(_WORDS)).title(),
                ("Section", str(i % 3)),
                1,
                " ".join(words),
                (),
            )
        )
    return out


_QUESTIONS = (
    "refund policy",
    "how do I reset my account password",
    "payment delay on shipping",
    "load_config",
    "read_only_mode token",
    "возврат средств за заказ",
    "退款政策",
    "refunds paid travel insurance claim window fee",
)


@pytest.mark.parametrize("words", [len(_WORDS), 8])
def test_kb_idx_16_sqlite_text_list_in_memory_ranks_as_fts5_bm25(
    tmp_path: Path, words: int
) -> None:
    """KB-IDX-16: with one organisation whose every revision is visible, the text list
    held in memory returns exactly the rows, in the order, of FTS5's ``ORDER BY
    bm25(chunks_fts), rowid`` (plain words, stems, identifiers that FTS5 reads as phrases,
    Cyrillic stems and CJK bigrams; and with eight words only, where near-ties abound and
    the last bits of the arithmetic decide)."""
    import numpy as np

    rng = np.random.default_rng(16)
    idx = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=DIM)
    revs = [f"r{r}" for r in range(6 if words > 8 else 10)]
    try:
        for rev in revs:
            chunks = _corpus(rng, rev, "o", 40, vocabulary=_WORDS[:words])
            idx.stage("o", rev, chunks, [_unit(i % DIM) for i in range(len(chunks))])
        idx.warm("o", wait=True)
        assert idx.held("o")
        conn = apsw.Connection(str(tmp_path / STORE_FILE))
        ids = dict(conn.execute("SELECT id, chunk_id FROM chunks").fetchall())
        compared = 0
        few = _WORDS[:8]
        questions = (
            list(_QUESTIONS)
            if words > 8
            else [" ".join(c) for n in (1, 2, 3) for c in itertools.combinations(few, n)]
        )
        for question in questions:
            match = _fts_query(_search_terms(question))
            expected = [
                ids[r[0]]
                for r in conn.execute(
                    "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? "
                    "ORDER BY bm25(chunks_fts), rowid LIMIT 20",
                    (match,),
                )
            ]
            if not expected:
                continue  # words of the other corpus
            compared += 1
            hits = idx.search("o", question, None, revision_ids=set(revs), k=20)
            assert [h.chunk.chunk_id for h in hits] == expected, question
        assert compared >= 8
        conn.close()
    finally:
        idx.close()


def test_kb_idx_17_other_organisations_do_not_move_a_text_ranking(tmp_path: Path) -> None:
    """KB-IDX-17: the text list's statistics are those of the rows the question may
    see: another organisation's rows (and the organisation's own hidden revisions),
    however many and whatever their words, leave a ranking exactly as it was."""
    import numpy as np

    rng = np.random.default_rng(17)
    alone = SqliteRetrievalIndex(tmp_path / "a" / STORE_FILE, dim=DIM)
    shared = SqliteRetrievalIndex(tmp_path / "b" / STORE_FILE, dim=DIM)
    try:
        mine = [_corpus(rng, f"r{r}", "o", 30) for r in range(3)]
        for index in (alone, shared):
            for chunks in mine:
                index.stage("o", chunks[0].revision_id, chunks, [_unit(0)] * len(chunks))
        for r in range(4):  # other rows, full of the questions' words
            other = _corpus(rng, f"x{r}", "other", 60)
            shared.stage("other", f"x{r}", other, [_unit(1)] * len(other))
        hidden = _corpus(rng, "hidden", "o", 60)
        shared.stage("o", "hidden", hidden, [_unit(1)] * len(hidden))
        visible = {"r0", "r1", "r2"}
        for index in (alone, shared):
            index.warm("o", wait=True)
            assert index.held("o")
        for question in _QUESTIONS:
            a = alone.search("o", question, None, revision_ids=visible, k=20)
            b = shared.search("o", question, None, revision_ids=visible, k=20)
            assert [(h.chunk.chunk_id, h.score) for h in a] == [
                (h.chunk.chunk_id, h.score) for h in b
            ], question
    finally:
        alone.close()
        shared.close()


def test_kb_idx_18_a_text_ranking_by_sql_is_the_one_in_memory_and_others_move_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KB-IDX-18: for an organisation whose rows are not held in memory (over the memory
    limit, or while they are built), the text list ranked by SQL has the statistics of
    the rows the question may see, as the list in memory has (KB-IDX-17): the same rows
    in the same order as the list in memory, with and without tag filters, in a store
    where another organisation's rows and the organisation's hidden revisions are full
    of the questions' words; and exactly the ranking of a store that holds the visible
    rows alone. With FTS5's bm25() over the whole table the two stores ranked apart."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(18)
    alone = SqliteRetrievalIndex(tmp_path / "a" / STORE_FILE, dim=DIM)
    shared = SqliteRetrievalIndex(tmp_path / "b" / STORE_FILE, dim=DIM)
    try:
        mine = [
            [
                dataclasses.replace(c, tags=("t1",) if c.ordinal % 2 else ())
                for c in _corpus(rng, f"r{r}", "o", 30)
            ]
            for r in range(3)
        ]
        for index in (alone, shared):
            for chunks in mine:
                index.stage("o", chunks[0].revision_id, chunks, [_unit(0)] * len(chunks))
        for r in range(4):
            other = _corpus(rng, f"x{r}", "other", 60)
            shared.stage("other", f"x{r}", other, [_unit(1)] * len(other))
        hidden = _corpus(rng, "hidden", "o", 60)
        shared.stage("o", "hidden", hidden, [_unit(1)] * len(hidden))
        visible = {"r0", "r1", "r2"}

        def ranked(index: SqliteRetrievalIndex, question: str, **tags: Any) -> list[str]:
            hits = index.search("o", question, None, revision_ids=visible, k=20, **tags)
            return [h.chunk.chunk_id for h in hits]

        filters: list[dict[str, Any]] = [{}, {"tags": ["t1"]}, {"any_tags": ["t1", "t9"]}]
        shared.warm("o", wait=True)
        assert shared.held("o")
        in_memory = {
            (q, i): ranked(shared, q, **f) for q in _QUESTIONS for i, f in enumerate(filters)
        }
        monkeypatch.setattr("knowledge_server.kb.index.sqlite.MEMORY_VECTOR_BYTES", 0)
        alone.close()
        shared.close()
        alone = SqliteRetrievalIndex(tmp_path / "a" / STORE_FILE, dim=DIM)
        shared = SqliteRetrievalIndex(tmp_path / "b" / STORE_FILE, dim=DIM)
        compared = 0
        for q in _QUESTIONS:
            for i, f in enumerate(filters):
                by_sql = ranked(shared, q, **f)
                assert not shared.held("o")
                assert by_sql == in_memory[(q, i)], (q, f)
                assert ranked(alone, q, **f) == by_sql, (q, f)
                compared += bool(by_sql)
        assert compared >= 10
    finally:
        alone.close()
        shared.close()


def test_milvus_restaging_a_visible_revision_never_leaves_it_without_rows(tmp_path: Path) -> None:
    """A revision staged again while it is published (reconcile, an upgrade step) was
    deleted first and inserted after: an insert that failed (Milvus unavailable) left the
    release with no rows, so Retrieve found nothing for it. The new rows now replace the
    old ones by key, and only the rows past the new last chunk are deleted after."""
    idx = _milvus_opener(tmp_path)()
    try:
        three = [_chunk("o", "r1", n, f"refund text {n}") for n in range(3)]
        idx.stage("o", "r1", three, [_unit(n) for n in range(3)])
        assert idx.revision_counts("o") == {("o", "r1"): 3}

        def unavailable(*args: object, **kwargs: object) -> None:
            raise ConnectionError("Milvus unavailable")

        client = idx.client  # type: ignore[attr-defined]
        real = client.upsert, client.insert
        client.upsert = client.insert = unavailable  # every way of writing rows fails
        try:
            with pytest.raises(ConnectionError):
                idx.stage("o", "r1", three, [_unit(n) for n in range(3)])
        finally:
            client.upsert, client.insert = real
        assert idx.revision_counts("o") == {("o", "r1"): 3}
        two = [_chunk("o", "r1", n, f"new refund text {n}") for n in range(2)]
        idx.stage("o", "r1", two, [_unit(n) for n in range(2)])
        assert idx.revision_counts("o") == {("o", "r1"): 2}
        got = idx.get_chunks("o", ["r1:0", "r1:1", "r1:2"])
        assert sorted(c.text for c in got) == ["new refund text 0", "new refund text 1"]
    finally:
        idx.close()
