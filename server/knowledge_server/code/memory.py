"""The code store's two full-text tables in process memory, for ranking.

A code search asked SQLite a dozen statements: the chunks and the files by FTS5's
``bm25()``, each joined to the current revisions of the chosen workspaces, which chunk
belongs to which file, how many chunks a file has, which question words the best files
hold. Each statement costs its own set-up, and a workspace filter calls back into Python
for every match; the file-level ranking made a search much slower over gRPC than before
it (figures in bench/RESULTS.md). Here every row of ``chunks_fts`` and ``files_fts`` is
tokenised once, by the table's own tokenizer (through the connection, so the tokens are
exactly the index's), into one posting list per token, and the rows' metadata is held
next to it: a question is a few array operations per word.

The scores are FTS5's: its ``bm25()`` formula (k1 = 1.2, b = 0.75, the tables' column
weights, a row's length counted over both columns, the idf floor of 1e-6) over every
row of the table, as FTS5 computes it; the rows' order, ties included, is the SQL
queries' (score, then path, line and row id; ``tests/test_code_memory.py`` compares them).

One copy per serving process and store file, for one state of the store (its current
revisions, its newest chunk and file version, the tables' row and token totals). A
search that finds the copy behind the store is answered by SQL (the same answer, only
slower) and starts one build in the background once that state has stood SETTLE_S. A build tokenises only the rows it
does not hold for the same row id and text (SQLite gives a freed id to the next row).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, cast

import apsw
import numpy as np

from knowledge_server import fts
from knowledge_server.logs import get_logger

from .store import FILE_WEIGHTS, FTS_WEIGHTS, scalar
from .tokenize import index_tokens

__all__ = [
    "Lexicon",
    "Scoped",
    "StoreMemory",
    "build",
    "cancel",
    "enable",
    "forget",
    "held",
    "ready",
    "state_key",
    "warm",
]

_log = get_logger("knowledge.code.memory")

# Above this many chunks a store is ranked by SQL alone: the copy's memory grows with the
# chunks, about twice as much while it is built (figures in bench/RESULTS.md).
MAX_CHUNKS = 120_000
# A build that failed is tried again for the same state after this long.
RETRY_S = 30.0
# A search starts a build only for a state it saw this long before (not during an index
# run, whose every commit is a new state); the serving lane's warm-up does not wait.
SETTLE_S = 1.0
# Rows read (chunks, files) between two checks of ``stop``.
BATCH_ROWS = 1024
# The vocabulary is renewed (every row tokenised again) once it holds more than twice
# the tokens in use plus this many.
VOCAB_SLACK = 8192
# What Python's objects take around a row's two token arrays (the arrays' headers, a
# tuple, a dict entry and its key), around a token of a vocabulary (a string and a dict
# entry), and a chunk's metadata (a tuple, its strings and numbers, its key and array
# slots), about, as measured with tracemalloc on the standard library (the estimate
# logged against that count: bench/RESULTS.md).
ROW_OVERHEAD_BYTES = 360
TOKEN_OVERHEAD_BYTES = 120
CHUNK_META_BYTES = 950

Tokens = fts.Tokens


def chunk_tokenizer(conn: apsw.Connection) -> Tokens:
    """``chunks_fts``'s tokenizer (code.store)."""
    return fts.tokenizer(conn, "unicode61", ["remove_diacritics", "2"])


def file_tokenizer(conn: apsw.Connection) -> Tokens:
    """``files_fts``'s tokenizer (code.store)."""
    return fts.tokenizer(conn, "porter", ["unicode61", "remove_diacritics", "2"])


def state_key(conn: apsw.Connection) -> tuple[Any, ...]:
    """What a copy is valid for: the newest chunk and file version, the workspaces'
    current revisions, and the two tables' totals record (row and token counts, which
    every insert and delete changes). Read inside the caller's read transaction."""
    # A SELECT of scalar subqueries has exactly one row.
    row = conn.execute(
        "SELECT (SELECT max(rowid) FROM chunks), (SELECT max(id) FROM file_versions),"
        " (SELECT group_concat(coalesce(current_rev_id, ''), ',') FROM workspaces),"
        " (SELECT block FROM chunks_fts_data WHERE id = 1),"
        " (SELECT block FROM files_fts_data WHERE id = 1)"
    ).fetchone()
    return tuple(cast(tuple[Any, ...], row))


class Scoped(NamedTuple):
    """A Lexicon's statistics over some of its rows (``Lexicon.scoped``)."""

    n: int
    norm: np.ndarray
    mask: np.ndarray


class Lexicon:
    """One FTS5 table's rows: per token, the rows holding it (positions in ``ids``) and
    its weighted count in each (sum over the columns of weight x occurrences, FTS5's
    ``aFreq``)."""

    def __init__(
        self,
        rows: Sequence[tuple[np.ndarray, np.ndarray]],
        vocab: dict[str, int],
        weights: tuple[float, float],
        tokens: Tokens,
    ) -> None:
        self.vocab = vocab
        self.tokens = tokens
        n = len(rows)
        self.n = n
        sizes = [np.asarray([r[c].size for r in rows], dtype=np.int64) for c in (0, 1)]
        self.length = (sizes[0] + sizes[1]).astype(np.float64)
        avg = float(self.length.sum()) / n if n else 1.0
        self.norm = fts.bm25_norm(self.length, avg)
        # One sort over (token, row, column) of every token occurrence: the count per
        # column times its weight, summed over the columns of a (token, row) pair.
        width = max(n, 1)
        keys = []
        for c in (0, 1):
            seq = [r[c] for r in rows]
            tok = np.concatenate(seq).astype(np.int64) if seq else np.zeros(0, np.int64)
            tok *= 2 * width
            tok += np.repeat(np.arange(0, 2 * n, 2, dtype=np.int64), sizes[c]) + c
            keys.append(tok)
        uniq, counts = np.unique(np.concatenate(keys), return_counts=True)
        del keys
        part = counts * np.asarray(weights, dtype=np.float64)[uniq & 1]
        pair = uniq >> 1  # token * width + row
        first = np.flatnonzero(np.diff(pair, prepend=-1))
        # Sums of 1.0, 2.0 and 3.0: exact in any order, as FTS5's running sum is, and
        # exact in 32 bits (scores are computed in 64).
        self.wf = (np.add.reduceat(part, first) if first.size else np.zeros(0)).astype(np.float32)
        pair = pair[first]
        self.rows = (pair % width).astype(np.int32)
        uniq = pair
        self.starts = np.searchsorted(uniq // width, np.arange(len(vocab) + 1))
        self.used = int(np.count_nonzero(np.diff(self.starts)))
        self.nbytes = int(
            self.wf.nbytes
            + self.rows.nbytes
            + self.starts.nbytes
            + self.length.nbytes
            + self.norm.nbytes
            + sum(len(t) for t in vocab)
            + len(vocab) * TOKEN_OVERHEAD_BYTES
        )

    def scoped(self, mask: np.ndarray) -> Scoped:
        """The statistics of the rows where ``mask``: their count and each row's length
        term against their average length (``bm25_norm``)."""
        n = int(np.count_nonzero(mask))
        total = float(self.length[mask].sum())
        # No tokens in the rows (punctuation alone): none of them can match; any average.
        avg = total / n if total else 1.0
        return Scoped(n, fts.bm25_norm(self.length, avg), mask)

    def token(self, term: str) -> int | None:
        """The token id of a question term; -1 for a term no row holds; None when the
        tokenizer makes other than one token of it (a phrase: SQL answers that search)."""
        out = self.tokens(term, True)
        if len(out) != 1:
            return None
        return self.vocab.get(out[0], -1)

    def exact(self, term: str) -> int | None:
        """``token``, for a term the tokenizer leaves as it is; None otherwise."""
        out = self.tokens(term, True)
        if out != [term]:
            return None
        return self.vocab.get(term, -1)

    def posting(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, weighted counts) of token ``tid`` (-1: none)."""
        if tid < 0:
            return self.rows[:0], self.wf[:0]
        lo, hi = self.starts[tid], self.starts[tid + 1]
        return self.rows[lo:hi], self.wf[lo:hi]

    def df(self, tid: int, scoped: Scoped | None = None) -> int:
        """The rows holding token ``tid``; with ``scoped``, those of its rows."""
        if tid < 0:
            return 0
        if scoped is not None:
            return int(np.count_nonzero(scoped.mask[self.posting(tid)[0]]))
        return int(self.starts[tid + 1] - self.starts[tid])

    def bm25(self, tids: Sequence[int], scoped: Scoped | None = None) -> np.ndarray:
        """FTS5's bm25() of every row for the phrases ``tids`` (one token each, repeats
        counted as FTS5 counts a phrase that appears twice in the expression), positive:
        higher is better; 0 for a row that holds none. Its idf and average row length are
        those of every row, or with ``scoped`` of its rows alone (``knowledge_bm25`` in
        SQL)."""
        n, norm = (self.n, self.norm) if scoped is None else (scoped.n, scoped.norm)
        score = np.zeros(self.n, dtype=np.float64)
        for tid in tids:
            rows, wf = self.posting(tid)
            if rows.size == 0:
                continue
            hits = rows.size if scoped is None else int(np.count_nonzero(scoped.mask[rows]))
            fts.bm25_add(score, rows, wf.astype(np.float64), fts.bm25_idf(n, hits), norm[rows])
        return score

    def holding(self, tids: Sequence[int]) -> np.ndarray:
        """Whether each row holds one of ``tids``."""
        out = np.zeros(self.n, dtype=bool)
        for tid in tids:
            out[self.posting(tid)[0]] = True
        return out

    def holds_rows(self, tid: int, rows: np.ndarray) -> np.ndarray:
        """Whether each of ``rows`` holds token ``tid`` (a row of -1 holds nothing)."""
        posting = self.posting(tid)[0]
        if posting.size == 0:
            return np.zeros(len(rows), dtype=bool)
        at = np.minimum(np.searchsorted(posting, rows), posting.size - 1)
        return np.asarray(posting[at] == rows)


class StoreMemory:
    """A store's rows for one state (``state_key``): the chunks' and files' lexicons,
    every chunk's metadata row (code.search's columns, text left out), and which file
    versions the workspaces' current revisions hold."""

    def __init__(
        self,
        key: tuple[Any, ...],
        chunk_rows: list[tuple[Any, ...]],
        chunk_tokens: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
        chunk_keys: list[tuple[int, int]],
        chunk_vocab: dict[str, int],
        file_rows: list[tuple[Any, ...]],
        file_tokens_: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
        file_keys: list[tuple[int, str]],
        file_vocab: dict[str, int],
        current: dict[int, tuple[str, str]],
        tokens: tuple[Tokens, Tokens],
    ) -> None:
        self.key = key
        self.chunk_tokens, self.chunk_keys = chunk_tokens, chunk_keys
        self.file_tokens, self.file_keys = file_tokens_, file_keys
        self.chunks = Lexicon(
            [chunk_tokens[k] for k in chunk_keys], chunk_vocab, FTS_WEIGHTS, tokens[0]
        )
        self.files = Lexicon(
            [file_tokens_[k] for k in file_keys], file_vocab, FILE_WEIGHTS, tokens[1]
        )
        # Chunks: (id, chunk_id, workspace, path, start_line, end_line, source_kind, symbol,
        # language, file_id), ascending id.
        self.chunk_ids = np.asarray([r[0] for r in chunk_rows], dtype=np.int64)
        self.chunk_meta = [r[:9] for r in chunk_rows]
        # Files: (id, workspace, path, language, n_chunks, generated, cli_options), by id.
        self.file_ids = np.asarray([r[0] for r in file_rows], dtype=np.int64)
        self.file_meta = file_rows
        self.file_pos = file_pos = {int(f): i for i, f in enumerate(self.file_ids)}
        self.chunk_file = np.asarray([file_pos.get(r[9], -1) for r in chunk_rows], dtype=np.int64)
        # The chunks in (path, start_line) order: the SQL queries' tie-break.
        order = sorted(range(len(chunk_rows)), key=lambda i: (chunk_rows[i][3], chunk_rows[i][4]))
        self.chunk_order = np.empty(len(chunk_rows), dtype=np.int64)
        self.chunk_order[order] = np.arange(len(chunk_rows))
        forder = sorted(range(len(file_rows)), key=lambda i: file_rows[i][2])
        self.file_order = np.empty(len(file_rows), dtype=np.int64)
        self.file_order[forder] = np.arange(len(file_rows))
        # file position -> its first chunk's position (by start_line, id), -1 without.
        self.first_chunk = np.full(len(file_rows), -1, dtype=np.int64)
        best: dict[int, tuple[int, int]] = {}
        for i, r in enumerate(chunk_rows):
            fp = int(self.chunk_file[i])
            if fp >= 0 and (fp not in best or (r[4], r[0]) < best[fp]):
                best[fp] = (r[4], r[0])
                self.first_chunk[fp] = i
        # file position -> (workspace root, rev label) for the files of current revisions.
        self.current = {file_pos[f]: v for f, v in current.items() if f in file_pos}
        self._scopes: dict[tuple[Any, ...], np.ndarray] = {}
        # Each file version's workspace, as a number: a scoped search's statistics (``stats``).
        self.roots = roots = {r: i for i, r in enumerate(sorted({f[1] for f in file_rows}))}
        self.file_root = np.asarray([roots[f[1]] for f in file_rows], dtype=np.int32)
        self._stats: dict[tuple[str, ...], tuple[Scoped, Scoped]] = {}
        self._lock = threading.Lock()
        self.stem: list[int] = []  # chunk token id -> its stem's file token id (-1: none)
        self.own: apsw.Connection | None = None  # the tokenizers' connection (build)
        self.tokenised = 0
        # More than half the vocabulary unused (rows dropped since): the next build
        # tokenises every row afresh.
        self.worn = any(
            2 * lex.used + VOCAB_SLACK < len(lex.vocab) for lex in (self.chunks, self.files)
        )
        row_arrays = sum(a.nbytes + b.nbytes for a, b in chunk_tokens.values()) + sum(
            a.nbytes + b.nbytes for a, b in file_tokens_.values()
        )
        self.nbytes = int(
            self.chunks.nbytes
            + self.files.nbytes
            + row_arrays
            + (len(chunk_tokens) + len(file_tokens_)) * ROW_OVERHEAD_BYTES
            + len(chunk_rows) * CHUNK_META_BYTES
        )

    def file_scope(
        self, workspaces: Sequence[str] | None, prefixes: Sequence[str] | None
    ) -> np.ndarray:
        """Whether each file version is in a current revision of ``workspaces`` (None:
        any) with a path under one of ``prefixes`` (None or empty: any)."""
        key = (
            tuple(sorted(workspaces)) if workspaces is not None else None,
            tuple(prefixes or ()),
        )
        mask = self._scopes.get(key)
        if mask is None:
            mask = np.zeros(len(self.file_meta), dtype=bool)
            chosen = set(workspaces) if workspaces is not None else None
            for fp, (root, _) in self.current.items():
                if chosen is not None and root not in chosen:
                    continue
                if prefixes and not any(self.file_meta[fp][2].startswith(p) for p in prefixes):
                    continue
                mask[fp] = True
            with self._lock:
                if len(self._scopes) > 64:
                    self._scopes.clear()
                self._scopes[key] = mask
        return mask

    def stats(self, workspaces: Sequence[str] | None) -> tuple[Scoped, Scoped] | None:
        """The chunks' and the files' statistics over every row of ``workspaces`` (all
        their file versions, as FTS5 counts every row of its table); None for None (every
        row of the store)."""
        if workspaces is None:
            return None
        key = tuple(sorted(set(workspaces)))
        held = self._stats.get(key)
        if held is None:
            chosen = np.asarray([self.roots[w] for w in key if w in self.roots], dtype=np.int32)
            files = np.isin(self.file_root, chosen)
            # A chunk counts with its file version (a chunk of none, with no workspace).
            chunks = np.append(files, False)[self.chunk_file]
            held = (self.chunks.scoped(chunks), self.files.scoped(files))
            with self._lock:
                if len(self._stats) > 16:
                    self._stats.clear()
                self._stats[key] = held
        return held

    def chunk_row(self, pos: int, rank: float) -> tuple[Any, ...]:
        """code.search's row of the chunk at ``pos``: its columns, NULL text, the current
        revision's label, then ``rank`` (FTS5's sign: lower is better)."""
        fp = int(self.chunk_file[pos])
        return (*self.chunk_meta[pos], None, self.current[fp][1], rank)


def best(score: np.ndarray, among: np.ndarray, tie: np.ndarray, n: int) -> np.ndarray:
    """Positions of the ``n`` best rows with ``score`` > 0 where ``among``, by score
    (higher first), then ``tie`` (lower first)."""
    hit = np.flatnonzero((score > 0) & among)
    if hit.size > n:
        cut = np.partition(score[hit], hit.size - n)[hit.size - n]
        hit = hit[score[hit] >= cut]
    order = np.lexsort((tie[hit], -score[hit]))
    return hit[order][:n]


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def build(
    conn: apsw.Connection,
    previous: StoreMemory | None,
    *,
    stop: Callable[[], bool] = lambda: False,
) -> StoreMemory | None:
    """The copy of the store as it is now (one read transaction); None for a store above
    MAX_CHUNKS, for a file whose tokens cannot be mapped as below, or when ``stop`` said
    so between two batches of rows. Rows ``previous``
    holds with the same id and text keep their tokens.

    A file's text column is its chunks' token strings (code.store.file_tokens) under the
    porter tokenizer, which stems each of the tokens the chunks' tokenizer makes: so a
    file's tokens are its chunks' tokens, each mapped to its stem once per distinct token,
    and no text is tokenised twice."""
    base = None if previous is None or previous.worn else previous
    c_vocab = dict(base.chunks.vocab) if base else {}
    f_vocab = dict(base.files.vocab) if base else {}
    stem: list[int] = list(base.stem) if base else []
    c_held = base.chunk_tokens if base else {}
    f_held = base.file_tokens if base else {}
    # The copy's own connection for its tokenizers (the built-in ones; the store's
    # connection is closed after the build).
    own = base.own if base is not None and base.own is not None else apsw.Connection(":memory:")
    tok_c, tok_f = chunk_tokenizer(own), file_tokenizer(own)

    def chunk_ids(text: str) -> np.ndarray:
        out = []
        for t in tok_c(text, False):
            tid = c_vocab.get(t)
            if tid is None:
                tid = c_vocab[t] = len(c_vocab)
                stems = tok_f(t, False)
                stem.append(f_vocab.setdefault(stems[0], len(f_vocab)) if len(stems) == 1 else -1)
            out.append(tid)
        return np.asarray(out, dtype=np.int32)

    with conn:
        key = state_key(conn)
        if int(scalar(conn, "SELECT count(*) FROM chunks")) > MAX_CHUNKS:
            return None
        files = [
            tuple(map(_intern, r))
            for r in conn.execute(
                "SELECT id, workspace, path, language, n_chunks, file_hash, chunker, generated,"
                " cli_options FROM file_versions ORDER BY id"
            )
        ]
        current = {
            int(fid): (sys.intern(root), sys.intern(rev))
            for fid, root, rev in conn.execute(
                "SELECT rf.file_id, w.root, r.rev FROM workspaces w"
                " JOIN revisions r ON r.id = w.current_rev_id"
                " JOIN rev_file rf ON rf.rev_id = w.current_rev_id"
            )
        }
        rows: list[tuple[Any, ...]] = []
        c_keys: list[tuple[int, int]] = []
        c_tokens: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        of_file: dict[int, list[tuple[int, int, tuple[int, int]]]] = {}
        tokenised = 0
        for r in conn.execute(
            "SELECT id, chunk_id, workspace, path, start_line, end_line, source_kind, symbol,"
            " language, file_id, text FROM chunks ORDER BY id"
        ):
            if len(rows) % BATCH_ROWS == 0 and stop():
                return None
            k = (int(r[0]), hash((r[10], r[3], r[7])))
            held = c_held.get(k)
            if held is None:
                held = (chunk_ids(index_tokens(r[10])), chunk_ids(index_tokens(f"{r[3]} {r[7]}")))
                tokenised += 1
            c_tokens[k] = held
            c_keys.append(k)
            rows.append(tuple(map(_intern, r[:10])))
            of_file.setdefault(int(r[9]), []).append((int(r[4]), int(r[0]), k))
    stems = np.asarray(stem, dtype=np.int32)
    # A file version's id, content, path and chunker: its chunks are the same.
    f_keys = [(int(r[0]), f"{r[5]}\x00{r[2]}\x00{r[6]}") for r in files]
    f_tokens: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for i, (r, fk) in enumerate(zip(files, f_keys, strict=True)):
        if i % BATCH_ROWS == 0 and stop():
            return None
        held_f = f_held.get(fk)
        if held_f is None:
            parts = [stems[c_tokens[ck][0]] for _, _, ck in sorted(of_file.get(int(r[0]), []))]
            body = np.concatenate(parts) if parts else np.zeros(0, np.int32)
            if (body < 0).any():
                # A chunk token the porter tokenizer does not make one token of (no code
                # point does, checked one by one): this state is ranked by SQL.
                return None
            path = [f_vocab.setdefault(t, len(f_vocab)) for t in tok_f(index_tokens(r[2]), False)]
            held_f = (body, np.asarray(path, dtype=np.int32))
        f_tokens[fk] = held_f
    mem = StoreMemory(
        key,
        rows,
        c_tokens,
        c_keys,
        c_vocab,
        [(*r[:5], bool(r[7]), int(r[8])) for r in files],
        f_tokens,
        f_keys,
        f_vocab,
        current,
        (tok_c, tok_f),
    )
    mem.stem = stem
    mem.own = own
    mem.tokenised = tokenised
    return mem


class _Builds:
    """The copies this process holds, one per store file, and the builds under way."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, StoreMemory] = {}
        self.building: set[str] = set()
        self.failed: dict[str, tuple[tuple[Any, ...], float]] = {}
        # Per store, a state no copy can be made of (too large; a token that cannot be
        # mapped): SQL answers it, and no build is tried again for it.
        self.unheld: dict[str, tuple[Any, ...]] = {}
        self.pool: ThreadPoolExecutor | None = None
        # Stores closed (cancel): no build starts or is kept until enabled again.
        self.cancelled: set[str] = set()
        # The last state a search saw per store, and since when (``start``'s settled).
        self.seen: dict[str, tuple[tuple[Any, ...], float]] = {}
        # Stores whose searches start a build when the copy is missing or behind (a
        # serving process's); others are built only when asked (``warm``).
        self.enabled: set[str] = set()

    def start(self, filename: str, key: tuple[Any, ...], settled: bool = True) -> Any:
        """A build of ``filename``'s copy, unless one runs, the store was closed (cancel),
        the last build for ``key`` failed less than RETRY_S ago, or ``key`` is too large.
        Without ``settled``, only a key seen SETTLE_S ago starts one: an index run
        commits batch after batch, and each commit is a new state a copy would lag."""
        now = time.monotonic()
        with self.lock:
            if filename in self.building or filename in self.cancelled:
                return None
            if not settled:
                seen = self.seen.get(filename)
                if seen is None or seen[0] != key:
                    self.seen[filename] = (key, now)
                    return None
                if now - seen[1] < SETTLE_S:
                    return None
            failed = self.failed.get(filename)
            if failed is not None and failed[0] == key and now - failed[1] < RETRY_S:
                return None
            if self.unheld.get(filename) == key:
                return None
            self.building.add(filename)
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="code-memory")
            return self.pool.submit(self._run, filename, key)

    def _run(self, filename: str, key: tuple[Any, ...]) -> None:
        t0 = time.perf_counter()
        mem = None
        try:
            conn = apsw.Connection(filename, flags=apsw.SQLITE_OPEN_READONLY)
            try:
                conn.setbusytimeout(10_000)
                mem = build(conn, self.held.get(filename), stop=lambda: filename in self.cancelled)
            finally:
                conn.close()
        except Exception:  # noqa: BLE001 - searches go on through SQL; tried again later
            _log.warning("code.memory.build_failed", exc_info=True)
            with self.lock:
                self.failed[filename] = (key, time.monotonic())
            return
        finally:
            with self.lock:
                self.building.discard(filename)
        with self.lock:
            if filename in self.cancelled:
                return  # the store was closed meanwhile: nothing is kept for it
            if mem is None:
                self.unheld[filename] = key
                return
            self.held[filename] = mem
        _log.info(
            "code.memory.built",
            chunks=len(mem.chunk_meta),
            files=len(mem.file_meta),
            tokenised=mem.tokenised,
            mib=round(mem.nbytes / 2**20, 1),
            ms=round((time.perf_counter() - t0) * 1000),
        )


_builds = _Builds()


def ready(conn: apsw.Connection, key: tuple[Any, ...]) -> StoreMemory | None:
    """The copy of ``conn``'s store for state ``key`` if this process holds it; else
    None, and a build of the store as it is now starts in the background."""
    if not conn.filename:  # in-memory databases share the name ""
        return None
    mem = _builds.held.get(conn.filename)
    if mem is not None and mem.key == key:
        return mem
    if conn.filename in _builds.enabled:
        _builds.start(conn.filename, key, settled=False)
    return None


def enable(filename: str) -> None:
    """Let searches of ``filename``'s store start a build of its copy (a serving process:
    a one-off search would build a copy it never uses)."""
    with _builds.lock:
        _builds.enabled.add(filename)
        _builds.cancelled.discard(filename)


def warm(conn: apsw.Connection, wait: bool = False) -> StoreMemory | None:
    """Start (``wait``: and finish) a build for the store as it is now."""
    if not conn.filename:
        return None
    with conn:
        key = state_key(conn)
    mem = _builds.held.get(conn.filename)
    if mem is not None and mem.key == key:
        return mem
    job = _builds.start(conn.filename, key)
    if wait and job is not None:
        job.result()
    elif wait:
        while conn.filename in _builds.building:
            time.sleep(0.01)
    return held(conn.filename)


def held(filename: str) -> StoreMemory | None:
    return _builds.held.get(filename)


def cancel(filename: str) -> None:
    """Stop a build of ``filename``'s copy between two batches of rows (the store is
    being closed), and drop the copy."""
    with _builds.lock:
        _builds.cancelled.add(filename)
        _builds.enabled.discard(filename)
    forget(filename)


def forget(filename: str) -> None:
    """Drop the copy of a store (tests; a store file that is gone)."""
    with _builds.lock:
        _builds.held.pop(filename, None)
        _builds.failed.pop(filename, None)
        _builds.unheld.pop(filename, None)
        _builds.seen.pop(filename, None)
