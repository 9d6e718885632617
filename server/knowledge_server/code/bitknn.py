"""Nearest binary vectors by hamming distance, scanned in process memory.

The code store keeps binary-quantised vectors in a sqlite-vec ``vec0`` table (one bit
per dimension: the sign of the float). sqlite-vec's KNN scans that table through the
virtual-table interface on every query. The same bits, held as a few contiguous
``uint64`` columns, are scanned with numpy an order of magnitude faster (figures in
bench/RESULTS.md): XOR with the query, count the bits, keep the ``k`` nearest.

Each serving process keeps one copy per (database, vector table), about 40 bytes per
chunk. The writer bumps ``meta['vec_epoch:<tbl>']`` in every transaction that adds or
removes vectors (:func:`bump_epoch`); a reader compares the epoch (one indexed lookup)
and reloads the copy when it moved, in one read transaction with the epoch itself.
Results are the same as sqlite-vec's: the distances are equal bit for bit, and ties
are broken by rowid so the order is deterministic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import cast

import apsw
import numpy as np

__all__ = ["BitMatrix", "bump_epoch", "nearest", "preload", "quantize"]


def _epoch_key(vtbl: str) -> str:
    return f"vec_epoch:{vtbl}"


def bump_epoch(conn: apsw.Connection, vtbl: str) -> None:
    """Mark the vectors of ``vtbl`` as changed; call inside the writing transaction."""
    conn.execute(
        "INSERT INTO meta(key, value) VALUES(?, '1') ON CONFLICT(key) DO UPDATE"
        " SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)",
        (_epoch_key(vtbl),),
    )


def _epoch(conn: apsw.Connection, vtbl: str) -> str:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (_epoch_key(vtbl),)).fetchone()
    return "0" if row is None else str(row[0])


def quantize(vec: np.ndarray) -> bytes:
    """The bit vector sqlite-vec's ``vec_quantize_binary`` makes: bit i is set when
    ``vec[i] > 0``, least significant bit first within each byte."""
    return np.packbits(np.asarray(vec) > 0, bitorder="little").tobytes()


@dataclass(frozen=True)
class BitMatrix:
    """Binary vectors as 64-bit columns (rows padded with zero bits to a multiple of 64)."""

    ids: np.ndarray  # int64 rowids, one per vector
    columns: tuple[np.ndarray, ...]  # uint64 arrays, each len(ids) long
    # The last ``among`` asked and its rows' positions: a scoped search passes the same
    # (memoised) array question after question.
    last_among: dict[str, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def from_rows(cls, rows: list[tuple[int, bytes]], nbytes: int) -> BitMatrix:
        width = -(-nbytes // 8) * 8
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        buf = np.zeros((len(rows), width), dtype=np.uint8)
        if rows:
            raw = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype=np.uint8)
            buf[:, :nbytes] = raw.reshape(len(rows), nbytes)
        words = buf.view(np.uint64)
        return cls(ids, tuple(np.ascontiguousarray(words[:, j]) for j in range(words.shape[1])))

    def __len__(self) -> int:
        return len(self.ids)

    def nearest(
        self, query: bytes, k: int, among: np.ndarray | None = None
    ) -> list[tuple[int, int]]:
        """The ``k`` nearest rows as (rowid, hamming distance), by (distance, rowid);
        with ``among`` (sorted rowids), only those rows count."""
        ids = self.ids
        columns = self.columns
        if among is not None:
            last = self.last_among.get("among")
            if last is not None and last[0] is among:
                pos = last[1]
            else:
                pos = np.flatnonzero(np.isin(ids, among, assume_unique=True))
                self.last_among["among"] = (among, pos)
            ids = ids[pos]
            columns = tuple(c[pos] for c in columns)
        n = len(ids)
        if n == 0 or k <= 0:
            return []
        width = len(columns) * 8
        q = np.frombuffer(query.ljust(width, b"\x00")[:width], dtype=np.uint64)
        dist = np.bitwise_count(columns[0] ^ q[0]).astype(np.int32)
        for j in range(1, len(columns)):
            dist += np.bitwise_count(columns[j] ^ q[j])
        if k < n:
            # Distances are small integers: the k-th smallest is found from their histogram.
            counts = np.bincount(dist, minlength=width * 8 + 1).cumsum()
            cut = int(np.searchsorted(counts, k))
            sel = np.flatnonzero(dist <= cut)
        else:
            sel = np.arange(n)
        sel = sel[np.lexsort((ids[sel], dist[sel]))][:k]
        return list(zip(ids[sel].tolist(), dist[sel].tolist(), strict=True))


_cache: dict[tuple[str, str], tuple[str, BitMatrix]] = {}
_lock = threading.Lock()


def _matrix(conn: apsw.Connection, vtbl: str, nbytes: int) -> BitMatrix:
    key = (conn.filename, vtbl)
    epoch = _epoch(conn, vtbl)
    hit = _cache.get(key)
    if hit is not None and hit[0] == epoch:
        return hit[1]
    with _lock:
        # One read transaction: the epoch stored with the copy is the one its rows carry
        # (and another thread may have loaded that epoch while this one waited).
        with conn:
            epoch = _epoch(conn, vtbl)
            hit = _cache.get(key)
            if hit is not None and hit[0] == epoch:
                return hit[1]
            rows = cast(
                list[tuple[int, bytes]],
                conn.execute(f"SELECT rowid, embedding FROM {vtbl}").fetchall(),  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
            )
        matrix = BitMatrix.from_rows(rows, nbytes)
        if conn.filename:  # in-memory databases share the name ""
            _cache[key] = (epoch, matrix)
        return matrix


def preload(conn: apsw.Connection, vtbl: str, dim: int) -> int:
    """Load (or refresh) this process's copy now, so no query waits for it; the number
    of vectors held."""
    return len(_matrix(conn, vtbl, dim // 8))


def nearest(
    conn: apsw.Connection,
    vtbl: str,
    dim: int,
    query: np.ndarray,
    k: int,
    among: np.ndarray | None = None,
) -> tuple[list[tuple[int, int]], int]:
    """(the ``k`` nearest vectors of ``vtbl`` to ``query`` as (rowid, distance), the
    number of vectors held); with ``among`` (sorted rowids), only among those."""
    matrix = _matrix(conn, vtbl, dim // 8)
    return matrix.nearest(quantize(query), k, among), len(matrix)
