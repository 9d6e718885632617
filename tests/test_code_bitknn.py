"""The in-process hamming KNN of the code lane (knowledge_server.code.bitknn).

Invariants: it finds the same neighbours at the same distances as sqlite-vec's own KNN
over the same ``vec0`` table, in a deterministic (distance, rowid) order; and a reader
never answers from a copy older than the vectors another connection committed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.code import CodeIndex, IndexOptions, bitknn
from knowledge_server.code.store import open_store


def _table(tmp_path: Path, dim: int, vectors: np.ndarray):
    conn = open_store(str(tmp_path / "code.sqlite"))
    conn.execute(f"CREATE VIRTUAL TABLE v USING vec0(embedding bit[{dim}])")
    with conn:
        for i, vec in enumerate(vectors, start=1):
            conn.execute(
                "INSERT INTO v(rowid, embedding) VALUES(?, vec_quantize_binary(?))",
                (i * 7, vec.astype(np.float32).tobytes()),
            )
        bitknn.bump_epoch(conn, "v")
    return conn


@pytest.mark.parametrize("dim", [8, 24, 64, 256])
def test_same_neighbours_and_distances_as_sqlite_vec(tmp_path: Path, dim: int) -> None:
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((500, dim))
    conn = _table(tmp_path, dim, vectors)
    for _ in range(20):
        q = rng.standard_normal(dim).astype(np.float32)
        assert (
            bitknn.quantize(q)
            == conn.execute("SELECT vec_quantize_binary(?)", (q.tobytes(),)).fetchone()[0]
        )
        for k in (1, 10, 60, 500, 900):
            mine, held = bitknn.nearest(conn, "v", dim, q, k)
            assert held == 500
            theirs = conn.execute(
                "SELECT rowid, distance FROM v WHERE embedding MATCH vec_quantize_binary(?)"
                " AND k = ?",
                (q.tobytes(), min(k, 500)),
            ).fetchall()
            assert len(mine) == len(theirs) == min(k, 500)
            # Same distance profile; the same rows wherever the distance is not a tie at the cut.
            assert [d for _, d in mine] == [int(d) for _, d in theirs]
            cut = mine[-1][1]
            assert {r for r, d in mine if d < cut} == {r for r, d in theirs if d < cut}
            assert mine == sorted(mine, key=lambda x: (x[1], x[0]))
    conn.close()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(min_size=3, max_size=3), min_size=1, max_size=40),
    st.binary(min_size=3, max_size=3),
    st.integers(1, 50),
)
def test_matrix_matches_brute_force(rows: list[bytes], query: bytes, k: int) -> None:
    m = bitknn.BitMatrix.from_rows([(i, r) for i, r in enumerate(rows)], 3)
    expect = sorted(
        (
            (i, sum((a ^ b).bit_count() for a, b in zip(r, query, strict=True)))
            for i, r in enumerate(rows)
        ),
        key=lambda x: (x[1], x[0]),
    )[:k]
    assert m.nearest(query, k) == expect


def test_reader_copy_follows_committed_vectors(tmp_path: Path) -> None:
    """A second connection (another serving process in production) answers from the
    vectors as committed: new chunks are found, removed ones are gone."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def alpha_beta():\n    return 'gamma delta'\n")
    db = str(tmp_path / "data" / "code.sqlite")
    with CodeIndex(db) as writer, CodeIndex(db) as reader:
        writer.index_workspace(str(ws))
        first = reader.search("alpha beta gamma", mode="vector")
        assert [h.path for h in first.hits] == ["a.py"]
        (ws / "b.py").write_text("def zeta_theta():\n    return 'kappa lambda'\n")
        writer.index_workspace(str(ws))
        assert "b.py" in {h.path for h in reader.search("zeta theta kappa", mode="vector").hits}
        (ws / "a.py").unlink()
        for _ in range(3):  # past the revisions GC keeps: a.py's vectors are deleted
            (ws / "b.py").write_text((ws / "b.py").read_text() + "# more\n")
            writer.index_workspace(str(ws), options=IndexOptions())
        vtbl = reader.conn.execute("SELECT tbl FROM embedders").fetchone()[0]
        ids = {r[0] for r in reader.conn.execute(f"SELECT rowid FROM {vtbl}")}
        q = writer.embedder.embed_query(["alpha beta gamma"])[0]
        near, held = bitknn.nearest(reader.conn, vtbl, writer.embedder.dim, q, 100)
        assert held == len(ids) and {r for r, _ in near} == ids


def test_serving_lane_preloads_the_copy_before_any_query(tmp_path: Path) -> None:
    """The code lane's background loop loads the bits at start, so the first query does
    not pay for the load."""
    import time

    from knowledge_server.lanes.code import CodeLane

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def alpha_beta():\n    return 'gamma delta'\n")
    data = tmp_path / "data"
    data.mkdir()
    with CodeIndex(str(data / "code.sqlite")) as ix:
        ix.index_workspace(str(ws))
        vtbl = ix.conn.execute("SELECT tbl FROM embedders").fetchone()[0]
        held = ix.conn.execute(f"SELECT count(*) FROM {vtbl}").fetchone()[0]
    bitknn._cache.clear()
    lane = CodeLane(data, embedder=ix.embedder)
    try:
        deadline = time.monotonic() + 10
        while not any(key[1] == vtbl for key in bitknn._cache) and time.monotonic() < deadline:
            time.sleep(0.01)
        entry = [v for k, v in bitknn._cache.items() if k[1] == vtbl]
        assert entry and len(entry[0][1]) == held > 0
        assert lane.preload_vectors() == held
    finally:
        lane.close()
