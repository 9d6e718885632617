"""FTS5 index upkeep: how many segments an index has, and merging them after a write run.

An FTS5 index is a set of b-tree segments. Every write transaction adds one, and
automerge folds segments of a level together only once enough of them have piled up
(16 for the code store, FTS5's default 4 elsewhere). A query looks each of its terms up
in every segment and skips entries that later segments deleted, so its cost grows with
the segment count: merging down to one segment made a small query an order of magnitude
faster (figures in bench/RESULTS.md). Merging is a rewrite of the whole index, so a write
run merges only when it changed a sizeable share of the rows, or when the segments have
piled up regardless.
The order of results does not change: BM25 sees the same rows and terms either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import cast

import apsw
import numpy as np

__all__ = [
    "BM25_B",
    "BM25_IDF_FLOOR",
    "BM25_K1",
    "MAX_SEGMENTS",
    "Tokens",
    "bm25_add",
    "bm25_idf",
    "bm25_norm",
    "compact",
    "docsize",
    "register_scoped_bm25",
    "scoped_bm25",
    "scoped_score",
    "segment_count",
    "tokenizer",
    "varint",
]

# FTS5 bm25()'s constants (fts5_aux.c), for the copies of full-text tables held in
# memory (kb.index.memtext, code.memory) that score as FTS5 does.
BM25_K1 = 1.2
BM25_B = 0.75
BM25_IDF_FLOOR = 1e-6

Tokens = Callable[[str, bool], list[str]]

# Merge when a run changed at least 1/CHANGED_SHARE of the rows ...
CHANGED_SHARE = 20
# ... or whenever more segments than this are left.
MAX_SEGMENTS = 16

# The structure record of an FTS5 index (its %_data row 10): a 4-byte cookie, the
# 4-byte marker of the second format when present, then varints: levels, segments.
_STRUCTURE_ROWID = 10
_STRUCTURE_V2 = b"\xff\x00\x00\x01"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """SQLite's varint: big-endian groups of 7 bits, the 9th byte holds 8."""
    value = 0
    for k in range(9):
        byte = data[pos + k]
        if k == 8:
            return (value << 8) | byte, pos + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos + k + 1
    raise AssertionError("unreachable")


def row_count(averages: bytes | None) -> int:
    """The rows of an FTS5 table, from its averages record (its %_data row 1: a varint of
    the row count, then one of each column's token count); 0 without one."""
    return varint(averages, 0)[0] if averages else 0


def totals(averages: bytes | None) -> tuple[int, int]:
    """(rows, tokens in all columns) of an FTS5 table, from its averages record."""
    rows = row_count(averages)
    return rows, docsize(averages) - rows


def segment_count(conn: apsw.Connection, table: str) -> int:
    """Segments in the FTS5 index of ``table`` (0 for an index never written)."""
    if not _NAME.fullmatch(table):
        raise ValueError(f"not a table name: {table!r}")
    row = conn.execute(
        f"SELECT block FROM {table}_data WHERE id = ?",  # noqa: S608 - table checked against _NAME above
        (_STRUCTURE_ROWID,),
    ).fetchone()
    if row is None or row[0] is None or len(row[0]) < 6:
        return 0
    data = bytes(row[0])
    pos = 8 if data[4:8] == _STRUCTURE_V2 else 4
    _levels, pos = varint(data, pos)
    segments, _ = varint(data, pos)
    return segments


def compact(conn: apsw.Connection, table: str, *, changed_rows: int, total_rows: int) -> bool:
    """After a write run: merge the index of ``table`` into one segment when the run
    changed at least 1/CHANGED_SHARE of its rows, or when more than MAX_SEGMENTS are
    left. Runs in its own transaction; call it with the store's write lock held.
    Returns whether it merged."""
    segments = segment_count(conn, table)
    if segments <= 1:
        return False
    if changed_rows * CHANGED_SHARE < total_rows and segments <= MAX_SEGMENTS:
        return False
    with conn:
        conn.execute(f"INSERT INTO {table}({table}) VALUES('optimize')")
    return True


def tokenizer(conn: apsw.Connection, name: str, args: list[str]) -> Tokens:
    """The FTS5 tokenizer ``name`` with ``args`` (a table's ``tokenize=`` option) as
    ``tokens(text, query)``: the tokens FTS5 makes of a document, or of a query."""
    tok = conn.fts5_tokenizer(name, args)

    def tokens(text: str, query: bool) -> list[str]:
        flags = apsw.FTS5_TOKENIZE_QUERY if query else apsw.FTS5_TOKENIZE_DOCUMENT
        out = tok(text.encode("utf-8"), flags, None, include_offsets=False, include_colocated=False)
        return [str(t) for t in out]

    return tokens


def bm25_idf(rows: int, hits: int) -> float:
    """FTS5's idf of a phrase that ``hits`` of ``rows`` rows hold, with its floor; the C
    library's log, as FTS5 calls it (numpy may use its own)."""
    idf = math.log((rows - hits + 0.5) / (hits + 0.5))
    return idf if idf > 0 else BM25_IDF_FLOOR


def bm25_norm(length: np.ndarray, avg: float) -> np.ndarray:
    """FTS5's row-length term ``k1 * (1 - b + b * D / avgdl)`` of rows ``length`` tokens long."""
    return BM25_K1 * (1 - BM25_B + BM25_B * length / avg)


def bm25_add(
    score: np.ndarray, rows: np.ndarray, freq: np.ndarray, idf: float, norm: np.ndarray
) -> None:
    """Add one phrase's part of bm25() to ``score`` at ``rows`` (``freq``: its weighted
    count in each, ``norm``: theirs from ``bm25_norm``), grouped as fts5_aux.c groups it,
    so near-ties order as FTS5 orders them."""
    score[rows] += idf * ((freq * (BM25_K1 + 1)) / (freq + norm))


def scoped_bm25(api: apsw.FTS5ExtensionApi, *args: float) -> float:
    """FTS5 ``knowledge_bm25(table, avgdl, w_0 ... w_c-1, idf_0, idf_1, ...)``: FTS5's
    bm25() (the same formula, in the same order of operations, so equal scores come out
    equal) with a weight per column of the table, and the row-length average and each
    phrase's idf given by the caller instead of counted over every row of the table: the
    statistics of the rows a search may see (a scope's workspaces, an organisation's
    visible revisions), so what other rows hold moves no score. Lower is better, as
    bm25()."""
    columns = api.column_count
    norm = BM25_K1 * (1 - BM25_B + BM25_B * api.column_size(-1) / args[0])
    score = 0.0
    for p in range(api.phrase_count):
        if not api.phrase_columns(p):
            continue
        where = api.phrase_locations(p)
        freq = 0.0
        for c in range(columns):
            freq += len(where[c]) * args[1 + c]
        score += args[1 + columns + p] * ((freq * (BM25_K1 + 1)) / (freq + norm))
    return -score


def scoped_score(
    table: str, rows: int, tokens: int, weights: Sequence[float], idf: Sequence[float]
) -> tuple[str, list[float]]:
    """The SQL expression ``knowledge_bm25(table, ...)`` (``scoped_bm25``) and its
    parameters, for ``rows`` rows holding ``tokens`` tokens in all, a weight per column
    and each phrase's idf in the order of the MATCH expression. ``table`` is a constant
    name. Rows without a token (punctuation alone) cannot match: any average will do."""
    avg = tokens / rows if tokens else 1.0
    marks = ", ".join("?" * (1 + len(weights) + len(idf)))
    return f"knowledge_bm25({table}, {marks})", [avg, *weights, *idf]


def docsize(blob: bytes | None) -> int:
    """SQL ``knowledge_docsize(sz)``: the tokens of one row of an FTS5 table, from its
    ``%_docsize`` record (a varint per column)."""
    total, pos = 0, 0
    while blob and pos < len(blob):
        value, pos = varint(blob, pos)
        total += value
    return total


def register_scoped_bm25(conn: apsw.Connection) -> None:
    """``knowledge_bm25`` (``scoped_bm25``) and ``knowledge_docsize`` (``docsize``) on
    ``conn``."""
    # Typed by what SQL passes them: the floats and the docsize record the queries bind.
    conn.register_fts5_function("knowledge_bm25", cast("apsw.FTS5Function", scoped_bm25))
    conn.create_scalar_function(
        "knowledge_docsize", cast("apsw.ScalarProtocol", docsize), 1, deterministic=True
    )
