"""The embedded knowledge-base index's storage (``kb.index.sqlite``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import apsw
import knowledge_server.kb.index.sqlite as sqlite_index
import pytest
from knowledge_server.kb.index.port import IndexChunk
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex


def test_many_small_organisations_keep_the_store_small(tmp_path: Path) -> None:
    """sqlite-vec allocates its vector chunks per partition (organisation): with its
    default of 1,024 vectors a chunk, 60 organisations of one row each took 60 MiB at 256
    dimensions. The index's smaller chunks keep that to a few MiB."""
    path = tmp_path / STORE_FILE
    index = SqliteRetrievalIndex(path, dim=256)
    try:
        for n in range(60):
            org = f"org-{n}"
            row = IndexChunk("r1:0", org, "t", "r1", "s", 0, "text", "T", (), None, "text", ())
            index.stage(org, "r1", [row], [[1.0] + [0.0] * 255])
        assert len(index.revision_counts()) == 60
    finally:
        index.close()
    conn = apsw.Connection(str(path))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        pages, page_size = (
            conn.execute("PRAGMA page_count").fetchall()[0][0],
            conn.execute("PRAGMA page_size").fetchall()[0][0],
        )
    finally:
        conn.close()
    assert pages * page_size < 12 * 1024 * 1024


def _rows(rev: str, n: int) -> list[IndexChunk]:
    return [
        IndexChunk(f"{rev}:{i}", "o", f"t-{rev}", rev, "s", i, "text", "T", (), None, f"w{i}", ())
        for i in range(n)
    ]


def test_a_new_generation_tokenises_only_the_rows_it_did_not_hold(tmp_path: Path) -> None:
    """After a write, the build of the organisation's rows in memory reuses the tokens of
    the rows it held and tokenises only the new revision's; a dropped revision's rows
    leave the text list."""
    index = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=4)
    try:
        index.stage("o", "r1", _rows("r1", 30), [[1.0, 0, 0, 0]] * 30)
        index.warm("o", wait=True)
        assert index._memory["o"].text is not None
        assert index._memory["o"].text.tokenised == 30
        index.stage("o", "r2", _rows("r2", 5), [[0, 1.0, 0, 0]] * 5)
        index.warm("o", wait=True)
        text = index._memory["o"].text
        assert text is not None and text.tokenised == 5 and len(text.row_tokens) == 35
        index.drop_revision("o", "r1")
        index.warm("o", wait=True)
        text = index._memory["o"].text
        assert text is not None and text.tokenised == 0 and len(text.row_tokens) == 5
        hits = index.search("o", "w3", None, revision_ids={"r1", "r2"}, k=5)
        assert [h.chunk.chunk_id for h in hits] == ["r2:3"]
    finally:
        index.close()


def test_closing_stops_a_build_and_searches_never_wait_for_one(tmp_path: Path) -> None:
    """A search that finds the rows in memory out of date starts a build and is answered
    from the tables meanwhile; closing the index stops a build in progress."""
    index = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=4)
    index.stage("o", "r1", _rows("r1", 3000), [[1.0, 0, 0, 0]] * 3000)
    assert not index.held("o")
    hits = index.search("o", "w7", None, revision_ids={"r1"}, k=3)
    assert [h.chunk.chunk_id for h in hits] == ["r1:7"]  # answered without the build
    index.close()  # returns with the build stopped or done, its connections closed


def _texts(rev: str, words: list[str]) -> list[IndexChunk]:
    return [
        IndexChunk(f"{rev}:{i}", "o", f"t-{rev}", rev, "s", i, "text", "T", (), None, w, ())
        for i, w in enumerate(words)
    ]


def test_rows_that_get_freed_ids_are_tokenised_again(tmp_path: Path) -> None:
    """SQLite gives a freed row id to the next row: after a draft is dropped and another
    revision staged, or a revision staged again with other text, the rows holding those
    ids are found by their own words in memory, never by the words of the rows before."""
    index = SqliteRetrievalIndex(tmp_path / STORE_FILE, dim=4)
    vec = [[1.0, 0, 0, 0]] * 2

    def found(word: str) -> list[str]:
        hits = index.search("o", word, None, revision_ids={"r1", "r2", "r3"}, k=5)
        return sorted(h.chunk.chunk_id for h in hits)

    try:
        index.stage("o", "r1", _texts("r1", ["alpha one", "alpha two"]), vec)
        index.stage("o", "draft", _texts("draft", ["banana", "banana split"]), vec)
        index.warm("o", wait=True)
        index.drop_revision("o", "draft")
        index.stage("o", "r2", _texts("r2", ["cherry", "cherry pie"]), vec)
        ids = [
            r[0]
            for r in apsw.Connection(str(tmp_path / STORE_FILE)).execute(
                "SELECT id FROM chunks WHERE revision_id = 'r2' ORDER BY id"
            )
        ]
        assert ids == [3, 4]  # the draft's ids, given again
        index.warm("o", wait=True)
        assert index.held("o")
        assert found("cherry") == ["r2:0", "r2:1"]
        assert found("banana") == []
        index.stage("o", "r2", _texts("r2", ["damson", "damson jam"]), vec)  # staged again
        index.warm("o", wait=True)
        assert index.held("o")
        assert found("damson") == ["r2:0", "r2:1"]
        assert found("cherry") == []
        assert found("alpha") == ["r1:0", "r1:1"]
    finally:
        index.close()


def _cache_bytes_per_search(tmp_path: Path, revisions: int) -> float:
    """Bytes the text statistics' cache keeps per search of a new word, ranked by SQL,
    over ``revisions`` visible revisions."""
    index = SqliteRetrievalIndex(tmp_path / f"{revisions}" / STORE_FILE, dim=4)
    try:
        revs = [f"rev_{n:016x}" for n in range(revisions)]
        for rev in revs:
            row = IndexChunk(
                f"{rev}:0", "o", f"t-{rev}", rev, "s", 0, "text", "T", (), None, "refunds", ()
            )
            index.stage("o", rev, [row], [[1.0, 0.0, 0.0, 0.0]])
        index.search("o", "refund", [1.0, 0, 0, 0], revision_ids=revs, k=5)
        entries = len(index._stats)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for n in range(200):
                index.search("o", f"refund word{n}", [1.0, 0, 0, 0], revision_ids=revs, k=5)
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert len(index._stats) == entries + 200  # one count per new word
        return grown / 200
    finally:
        index.close()


def test_the_text_statistics_cache_holds_no_copy_of_the_visible_revisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KB-IDX-19: ranked by SQL, the text list's statistics are cached per visible set
    by a digest of it: the memory one search of a new word keeps does not grow with the
    number of visible revisions (each entry held the list of every visible revision id,
    up to a gibibyte for a large organisation at the cache's entry limit)."""
    monkeypatch.setattr(sqlite_index, "MEMORY_VECTOR_BYTES", 0)  # never held in memory
    few = _cache_bytes_per_search(tmp_path, 10)
    many = _cache_bytes_per_search(tmp_path, 600)
    assert many < few + 512, (few, many)
    assert many < 2048, many
