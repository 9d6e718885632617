"""SQLite layout of the code lane (``code.sqlite``).

Content is keyed by file version (workspace, path, file hash, chunker); a revision
is only a list of file versions (``rev_file``) plus a row in ``revisions``.
Readers follow ``workspaces.current_rev_id``, which the indexer flips in its last
transaction, so a crashed run leaves nothing but unreferenced rows behind (the next
run reuses them, GC removes the rest).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Literal, cast, overload

import apsw

from knowledge_server import fts
from knowledge_server.schema import (
    Migrations,
    QueryValues,
    Step,
    has_schema,
    store_settings,
    use_wal,
)

from .tokenize import index_tokens

__all__ = ["MIGRATIONS", "open_store", "vec_table_for"]

_BASELINE = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE workspaces(
  root TEXT PRIMARY KEY,
  current_rev_id INTEGER
);
CREATE TABLE revisions(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  rev TEXT NOT NULL UNIQUE,
  workspace TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  chunker TEXT NOT NULL,
  embedder TEXT NOT NULL,
  created_ns INTEGER NOT NULL,
  files INTEGER NOT NULL,
  chunks INTEGER NOT NULL,
  walk_count INTEGER NOT NULL,
  walk_max_mtime_ns INTEGER NOT NULL,
  vec_missing INTEGER NOT NULL
);
CREATE INDEX revisions_ws ON revisions(workspace, id);
CREATE TABLE file_versions(
  id INTEGER PRIMARY KEY,
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  file_hash TEXT NOT NULL,
  chunker TEXT NOT NULL,
  language TEXT NOT NULL,
  method TEXT NOT NULL,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  n_chunks INTEGER NOT NULL,
  UNIQUE(workspace, path, file_hash, chunker)
);
CREATE TABLE rev_file(
  rev_id INTEGER NOT NULL,
  file_id INTEGER NOT NULL,
  PRIMARY KEY(rev_id, file_id)
) WITHOUT ROWID;
CREATE INDEX rev_file_file ON rev_file(file_id, rev_id);
CREATE TABLE chunks(
  id INTEGER PRIMARY KEY,
  chunk_id TEXT NOT NULL,
  file_id INTEGER NOT NULL,
  workspace TEXT NOT NULL,
  path TEXT NOT NULL,
  start_line INTEGER NOT NULL,
  end_line INTEGER NOT NULL,
  source_kind TEXT NOT NULL,
  symbol TEXT NOT NULL,
  language TEXT NOT NULL,
  content_hash TEXT NOT NULL,
  text TEXT NOT NULL
);
CREATE INDEX chunks_file ON chunks(file_id);
CREATE INDEX chunks_cid ON chunks(chunk_id);
CREATE VIRTUAL TABLE chunks_fts USING fts5(
  tokens, meta, content='', contentless_delete=1, tokenize='unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE chunks_fts_vocab USING fts5vocab(chunks_fts, 'row');
CREATE TABLE drift(
  id INTEGER PRIMARY KEY,
  workspace TEXT NOT NULL,
  rev TEXT NOT NULL,
  previous_fingerprint TEXT NOT NULL,
  new_fingerprint TEXT NOT NULL,
  reason TEXT NOT NULL,
  created_ns INTEGER NOT NULL
);
-- Files the last run could not index (binary, undecodable) with the stat it saw, so an
-- unchanged one is not read again on every run.
CREATE TABLE skipped_files(
  workspace TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
  reason TEXT NOT NULL, PRIMARY KEY(workspace, path)
) WITHOUT ROWID;
CREATE TABLE embedders(identity TEXT PRIMARY KEY, dim INTEGER NOT NULL,
  tbl TEXT NOT NULL);
-- A file version whose chunks all have vectors in vec table `tbl` (written in the
-- same transaction as the vectors, so an interrupted fill never half-counts a file).
CREATE TABLE file_vec(
  file_id INTEGER NOT NULL, tbl TEXT NOT NULL, PRIMARY KEY(file_id, tbl)
) WITHOUT ROWID;
INSERT INTO meta(key, value) VALUES('schema_version', '1');
"""


# bm25 weights: identifier tokens of the body 1.0, path + symbol name 3.0.
FTS_WEIGHTS = (1.0, 3.0)
FTS_RANK = "bm25({}, {})".format(*FTS_WEIGHTS)
# The same ranking as a query expression. ``ORDER BY <this> LIMIT n`` keeps only the best
# n in SQLite's sorter; ``ORDER BY rank`` makes FTS5 sort every match first (slower).
FTS_SCORE = "bm25(chunks_fts, {}, {})".format(*FTS_WEIGHTS)
FTS_AUTOMERGE = 16
# Whole-file BM25: words of the text 1.0, of the path 2.0.
FILE_WEIGHTS = (1.0, 2.0)
FILE_SCORE = "bm25(files_fts, {}, {})".format(*FILE_WEIGHTS)
# How long a connection waits for another one's lock.
BUSY_MS = 10_000


def _fts_settings(cur: apsw.Cursor) -> None:
    cur.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('rank', ?)", (FTS_RANK,))
    # Merge segments 16 at a time instead of 4: a full index run spends less time in the
    # writer, and queries are no measurably slower (figures in bench/RESULTS.md).
    cur.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES('automerge', ?)", (FTS_AUTOMERGE,))


def _legacy(cur: apsw.Cursor) -> list[str]:
    """The steps a store written before they were recorded has: the baseline (its
    tables and the ``schema_version`` row), and the full-text settings when they are the
    ones that step sets."""
    if (
        not has_schema(cur, _BASELINE)
        or not cur.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone()
    ):
        return []
    settings: dict[object, object] = dict(cur.execute("SELECT k, v FROM chunks_fts_config"))
    if settings.get("rank") == FTS_RANK and settings.get("automerge") == FTS_AUTOMERGE:
        return ["001_initial", "002_fts_rank_and_automerge"]
    return ["001_initial"]


# One row per file version (rowid = file_versions.id): the tokens of all its chunks and
# its path, for file-level ranking (code.search: a file whose chunks together cover the
# question is strong evidence). Porter-stemmed: "timestamps" finds "timestamp"; the
# chunk table keeps exact tokens (figures for both in bench/RESULTS.md).
_FILES_FTS = """
CREATE VIRTUAL TABLE files_fts USING fts5(
  tokens, path, content='', contentless_delete=1,
  tokenize='porter unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE files_fts_vocab USING fts5vocab(files_fts, 'row');
"""


def file_tokens(chunk_tokens: list[str]) -> str:
    """The ``files_fts.tokens`` value of a file: its chunks' tokens in order."""
    return " ".join(chunk_tokens)


def _fill_files_fts(cur: apsw.Cursor) -> None:
    """Create ``files_fts`` and fill it for the file versions already stored, from their
    chunks (the same text the indexer gives new versions)."""
    cur.execute(_FILES_FTS)
    cur.execute("INSERT INTO files_fts(files_fts, rank) VALUES('automerge', ?)", (FTS_AUTOMERGE,))
    files = cast(
        list[tuple[int, str]],
        cur.execute("SELECT id, path FROM file_versions ORDER BY id").fetchall(),
    )
    for fid, path in files:
        texts = [
            cast(str, r[0])
            for r in cur.execute(
                "SELECT text FROM chunks WHERE file_id = ? ORDER BY start_line, id", (fid,)
            )
        ]
        cur.execute(
            "INSERT INTO files_fts(rowid, tokens, path) VALUES(?,?,?)",
            (fid, file_tokens([index_tokens(t) for t in texts]), index_tokens(path)),
        )


# The schema as named steps (``knowledge_server.schema.Migrations``): add new ones at the
# end. A new ranking or merge setting is a new step, not an edit of step 002.
MIGRATIONS = Migrations(
    "code.sqlite",
    (
        Step("001_initial", _BASELINE),
        Step("002_fts_rank_and_automerge", _fts_settings),
        Step("003_files_fts", _fill_files_fts),
        # Whether the file says it was generated (chunking.generated_header); versions
        # stored before say 0 until the next index run cuts them again (the chunker's
        # version changed with it, so that run reads every file).
        Step(
            "004_generated_files",
            "ALTER TABLE file_versions ADD COLUMN generated INTEGER NOT NULL DEFAULT 0;",
        ),
        # How many command-line options the file defines (chunking.cli_options); 0 for
        # versions stored before, until the next index run (chunker version 7) reads them.
        Step(
            "005_cli_options",
            "ALTER TABLE file_versions ADD COLUMN cli_options INTEGER NOT NULL DEFAULT 0;",
        ),
    ),
    legacy=_legacy,
)


# Sets of chunk ids of running queries, read by knowledge_in_set (a path filter's chunks).
ID_SETS = QueryValues()


def _in_set(rowid: int, token: int) -> int:
    """SQL ``knowledge_in_set(rowid, token)``: whether ``rowid`` is in the set held under
    ``token``."""
    return int(rowid in ID_SETS[token])  # type: ignore[operator]


def _phrases_found(api: apsw.FTS5ExtensionApi, *args: object) -> int:
    """FTS5 ``knowledge_phrases(table)``: which phrases of the query the current row
    holds, as a bit mask (bit i: phrase i), so one query tells which of several terms
    each row has."""
    return sum(1 << i for i in range(api.phrase_count) if api.phrase_columns(i))


def open_store(path: str) -> apsw.Connection:
    """Open (creating if needed) the code store with sqlite-vec loaded."""
    import sqlite_vec

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    conn = apsw.Connection(path)
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    conn.enable_load_extension(False)
    conn.setbusytimeout(BUSY_MS)
    cur = conn.cursor()
    use_wal(conn)
    # NORMAL in WAL mode still never corrupts on a process kill; it only risks the
    # last transactions on power loss, which a re-index repairs.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=OFF")
    # Readers open this store too (one per pooled connection, in every serving process):
    # when every step is recorded, opening writes nothing.
    try:
        MIGRATIONS.migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    store_settings(conn)
    conn.create_scalar_function("knowledge_in_set", cast("apsw.ScalarProtocol", _in_set), 2)
    conn.register_fts5_function("knowledge_phrases", _phrases_found)
    fts.register_scoped_bm25(conn)
    return conn


# A table name cannot be a bound parameter, so vector table names are interpolated into
# SQL; only names of the form this module makes ("vec_" + 12 hex digits) are ever used.
_VEC_TABLE = re.compile(r"vec_[0-9a-f]{12}")


def _vec_name(tbl: str) -> str:
    if not _VEC_TABLE.fullmatch(tbl):
        raise ValueError(f"not a vector table name: {tbl!r}")
    return tbl


def vec_tables(conn: apsw.Connection) -> list[str]:
    """The vector tables of every embedder that has written to this index."""
    return [_vec_name(str(r[0])) for r in conn.execute("SELECT tbl FROM embedders")]


@overload
def vec_table_for(
    conn: apsw.Connection, identity: str, dim: int, *, create: Literal[True]
) -> str: ...
@overload
def vec_table_for(
    conn: apsw.Connection, identity: str, dim: int, *, create: bool
) -> str | None: ...
def vec_table_for(conn: apsw.Connection, identity: str, dim: int, *, create: bool) -> str | None:
    """Tables holding the vectors of one embedder (one pair per identity).

    ``<tbl>`` is a sqlite-vec ``vec0`` table searched with KNN. When ``dim`` is a
    multiple of 8 it holds binary-quantised vectors (``bit[dim]``, hamming distance:
    a scan several times cheaper than float32), and ``<tbl>_f`` keeps the float32
    vectors that rescore the KNN candidates exactly. Otherwise ``<tbl>`` holds float32
    vectors with cosine distance and no rescoring is needed."""
    row = conn.execute("SELECT tbl, dim FROM embedders WHERE identity = ?", (identity,)).fetchone()
    if row is not None:
        return _vec_name(str(row[0]))
    if not create:
        return None
    tbl = "vec_" + hashlib.sha1(identity.encode(), usedforsecurity=False).hexdigest()[:12]
    column = f"bit[{int(dim)}]" if is_binary(dim) else f"float[{int(dim)}] distance_metric=cosine"
    with conn:
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {tbl} USING vec0(embedding {column})")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {tbl}_f(id INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        conn.execute(
            "INSERT OR IGNORE INTO embedders(identity, dim, tbl) VALUES(?, ?, ?)",
            (identity, dim, tbl),
        )
    return tbl


def is_binary(dim: int) -> bool:
    return dim % 8 == 0


def scalar(conn: apsw.Connection, sql: str, params: Any = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]
