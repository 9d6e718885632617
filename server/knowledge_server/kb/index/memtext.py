"""An organisation's text list in memory: BM25 as FTS5 computes it, over the rows a
question may see.

The embedded index's text list asked FTS5 for the best rows by ``bm25()``: FTS5 calls
that function once per matching row of every organisation, and a question of a dozen
words matches most of an organisation's chunks, so it was most of a retrieval's time
(bench/RESULTS.md, ``bench_kb_retrieve.py``). Here each of an organisation's rows is
tokenised once, by the FTS5 tokenizer of the table itself (``porter unicode61
remove_diacritics 2``, through the connection), into per-term posting arrays; a question
then costs a few array operations per term.

The score is FTS5's ``bm25()`` formula (k1 = 1.2, b = 0.75, every column weight 1, a
row's length counted over both columns, the idf floor of 1e-6), computed over the rows
the question may see (the organisation's released revisions, after the tag filters)
rather than over every row of the table. Statistics of other organisations' rows, or of
drafts and replaced releases, do not move a ranking.

A phrase of several tokens (``load_config`` is ``load config`` to FTS5) is found by
scanning the column's token sequence for its tokens in a row, one after the other, as
FTS5's phrase query does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import apsw
import numpy as np

from knowledge_server import fts
from knowledge_server.episodes.text import QueryTerm

__all__ = ["COLUMNS", "OrgText", "Stopped", "Tokens", "build", "tokenizer"]

# Tokens of rows no longer held are forgotten once the vocabulary is more than twice
# the tokens in use plus this many.
VOCAB_SLACK = 4096
# What Python's objects around a row's token arrays take (two arrays, a tuple, a dict
# entry and its key), and around a token of the vocabulary (a string and a dict entry),
# about, as measured with tracemalloc.
ROW_OVERHEAD_BYTES = 400
TOKEN_OVERHEAD_BYTES = 120
# Rows read and tokenised at a time by ``build``.
BATCH_ROWS = 512
# The FTS5 table's columns, in order.
COLUMNS = ("text", "aux")

Tokens = fts.Tokens
RowKey = tuple[int, int]  # (row id, hash of the row's text)


class Stopped(Exception):
    """``build`` was told to stop."""


def tokenizer(conn: apsw.Connection) -> Tokens:
    """The chunks_fts table's tokenizer, as ``tokens(text, query)``."""
    return fts.tokenizer(conn, "porter", ["unicode61", "remove_diacritics", "2"])


class _Column:
    """One column of every row: the token sequence (rows one after the other) and the
    postings built from it (rows and counts grouped by term)."""

    def __init__(self, rows: Sequence[np.ndarray], terms: int) -> None:
        lengths = np.asarray([r.size for r in rows], dtype=np.int64)
        self.lengths = lengths
        self.offsets = np.concatenate(([0], np.cumsum(lengths)))
        self.seq = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, np.int32)
        row_of = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)
        width = max(len(rows), 1)
        keys, counts = np.unique(self.seq.astype(np.int64) * width + row_of, return_counts=True)
        term_of = keys // width
        self.rows = (keys % width).astype(np.int32)
        self.tf = counts.astype(np.float64)
        self.starts = np.searchsorted(term_of, np.arange(terms + 1))

    @property
    def nbytes(self) -> int:
        return int(
            self.seq.nbytes
            + self.offsets.nbytes
            + self.rows.nbytes
            + self.tf.nbytes
            + self.starts.nbytes
            + self.lengths.nbytes
        )

    def matches(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, counts) of the rows holding the tokens ``ids`` one after the other."""
        if len(ids) == 1:
            lo, hi = self.starts[ids[0]], self.starts[ids[0] + 1]
            return self.rows[lo:hi], self.tf[lo:hi]
        n = len(ids)
        at = np.flatnonzero(self.seq[: max(self.seq.size - n + 1, 0)] == ids[0])
        for j, t in enumerate(ids[1:], start=1):
            at = at[self.seq[at + j] == t]
        row = np.searchsorted(self.offsets, at, side="right") - 1
        row = row[at + n <= self.offsets[row + 1]]  # inside one row
        found, counts = np.unique(row, return_counts=True)
        return found.astype(np.int32), counts.astype(np.float64)


def build(
    ids: np.ndarray,
    texts: Mapping[int, str],
    previous: OrgText | None,
    tokens: Tokens,
    aux: Callable[[str], str],
    *,
    stop: Callable[[], bool] = lambda: False,
) -> OrgText:
    """The text list of the rows ``ids`` (ascending), ``texts`` holding each one's text
    column (a row missing there, deleted meanwhile, has no text). A row keeps the tokens
    ``previous`` held for the same row id and the same text; the others are tokenised
    (``aux`` makes the second column from the text). Row ids alone would not do: SQLite
    gives a freed id to the next row, so a revision staged again, or after another was
    dropped, may hold the ids of rows whose text was different. ``previous`` is not
    changed (a search may still be using it). ``stop`` is asked between batches of rows;
    when it says so, ``Stopped`` is raised."""
    vocab = dict(previous.vocab) if previous is not None else {}
    held = previous.row_tokens if previous is not None else {}
    keys = [(int(i), hash(texts.get(int(i), ""))) for i in ids]
    row_tokens = {k: held[k] for k in keys if k in held}
    missing = [k for k in keys if k not in row_tokens]
    for start in range(0, len(missing), BATCH_ROWS):
        if stop():
            raise Stopped
        for key in missing[start : start + BATCH_ROWS]:
            body = texts.get(key[0], "")
            row_tokens[key] = tuple(  # type: ignore[assignment]
                np.asarray([vocab.setdefault(t, len(vocab)) for t in tokens(v, False)], np.int32)
                for v in (body, aux(body))
            )
    used = np.unique(
        np.concatenate([a for pair in row_tokens.values() for a in pair] or [np.zeros(0, np.int32)])
    )
    if len(vocab) > 2 * used.size + VOCAB_SLACK:
        # Tokens of rows no longer held: renumber the ones in use.
        remap = np.full(len(vocab), -1, dtype=np.int32)
        remap[used] = np.arange(used.size, dtype=np.int32)
        vocab = {t: int(remap[i]) for t, i in vocab.items() if remap[i] >= 0}
        row_tokens = {r: (remap[a], remap[b]) for r, (a, b) in row_tokens.items()}
    text = OrgText(keys, row_tokens, vocab)
    text.tokenised = len(missing)
    return text


class OrgText:
    """The text columns of an organisation's rows, in the order of its rows in memory.

    ``vocab`` maps a token to its id; ``row_tokens`` holds each row's token ids per
    column, by (row id, hash of its text): the next generation tokenises only the rows it
    adds or whose text changed. ``keys`` are the rows' keys in the rows' order."""

    def __init__(
        self,
        keys: Sequence[RowKey],
        row_tokens: dict[RowKey, tuple[np.ndarray, np.ndarray]],
        vocab: dict[str, int],
    ) -> None:
        self.vocab = vocab
        self.row_tokens = row_tokens
        self.tokenised = 0  # rows ``build`` tokenised for this one (the others were held)
        per_row = [row_tokens[k] for k in keys]
        self.columns = tuple(
            _Column([r[c] for r in per_row], len(vocab)) for c in range(len(COLUMNS))
        )
        self.length = (self.columns[0].lengths + self.columns[1].lengths).astype(np.float64)
        # Counted once (a walk over every row): the arrays, and about what Python's own
        # objects around them take (a row's tuple, arrays and dict entry; a token's string
        # and dict entry).
        arrays = sum(a.nbytes + b.nbytes for a, b in row_tokens.values())
        self.nbytes = int(
            arrays
            + len(row_tokens) * ROW_OVERHEAD_BYTES
            + sum(len(t) for t in vocab)
            + len(vocab) * TOKEN_OVERHEAD_BYTES
            + self.length.nbytes
            + sum(c.nbytes for c in self.columns)
        )

    def scores(self, terms: Sequence[QueryTerm], tokens: Tokens, mask: np.ndarray) -> np.ndarray:
        """BM25 of every row for ``terms`` (FTS5's formula, positive: higher is better)
        over the rows of ``mask``; 0 where a row matches none of them or is not visible."""
        score = np.zeros(mask.size, dtype=np.float64)
        n = int(mask.sum())
        if n == 0:
            return score
        avg = float(self.length[mask].sum()) / n
        for term in terms:
            col = self.columns[COLUMNS.index(term.column)]
            ids = [self.vocab.get(t, -1) for t in tokens(term.term, True)]
            if not ids or min(ids) < 0:
                continue  # a token no row holds: the phrase matches nothing
            rows, tf = col.matches(ids)
            seen = mask[rows]
            rows, tf = rows[seen], tf[seen]
            if rows.size == 0:
                continue
            norm = fts.bm25_norm(self.length[rows], avg)
            fts.bm25_add(score, rows, tf, fts.bm25_idf(n, rows.size), norm)
        return score

    def best(self, score: np.ndarray, ids: np.ndarray, n: int) -> list[int]:
        """Row ids of the ``n`` best-scoring rows (score > 0), ties by row id."""
        hit = np.flatnonzero(score > 0)
        if hit.size > n:
            cut = np.partition(score[hit], hit.size - n)[hit.size - n]
            hit = hit[score[hit] >= cut]
        order = np.lexsort((ids[hit], -score[hit]))
        return [int(i) for i in ids[hit[order]][:n]]
