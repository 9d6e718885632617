"""The embedded retrieval index: SQLite FTS5 (BM25) + sqlite-vec, fused by RRF.

One store file in the data directory (``kb_index.sqlite``), its schema as named
migrations (``MIGRATIONS``). Rows:

- ``chunks``: one row per chunk, unique by (org, chunk_id), indexed by (org, revision_id);
  ``section_path`` and ``tags`` as JSON arrays.
- ``chunks_fts`` (contentless FTS5, rowid = ``chunks.id``): column ``text`` holds the
  title, section path and text (``porter unicode61``: "refunds" finds "refund"),
  ``aux`` the CJK character bigrams and Russian Snowball stems of the same
  (``episodes.text.aux_terms``, as the episodes lane indexes them). Queries are split
  into literal terms, never passed as FTS5 syntax.
- ``chunks_vec_d<dim>``: a sqlite-vec ``vec0`` table per vector dimension, the
  organisation as its partition key and the revision as a metadata column, cosine
  distance. A KNN query names both, so it scans only that organisation's rows of
  those revisions; a tag filter adds the allowed rowids.

Every query filters by organisation and revision inside SQL, and every row read back is
checked again (``port.recheck``) before it is returned.

An organisation's rows are also held in memory (``_OrgVectors``, its text list
``memtext.OrgText``), built in the background at each new generation; searches read them
there once built, and the tables above meanwhile (docs/kb-index.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import apsw
import numpy as np
import sqlite_vec

from knowledge_server import fts
from knowledge_server.episodes.text import QueryTerm, aux_terms, query_terms
from knowledge_server.fts import compact
from knowledge_server.kb.index import memtext
from knowledge_server.kb.index.port import (
    IndexChunk,
    IndexHit,
    recheck,
    rrf,
    validate_stage,
)
from knowledge_server.lanes.common import WriterLock
from knowledge_server.logs import get_logger
from knowledge_server.schema import Migrations, Step, immediate, store_settings, use_wal

__all__ = ["MIGRATIONS", "STORE_FILE", "SqliteRetrievalIndex"]

_log = get_logger("knowledge.kb.index")

STORE_FILE = "kb_index.sqlite"
BUSY_MS = 10_000
# Candidates taken from each list before fusion, per requested hit.
CANDIDATES_PER_HIT = 4
MAX_CANDIDATES = 400
# The vector query over many revisions: first the organisation's nearest WIDEN x the
# candidates without the revision filter (see ``_nearest``), when more than
# WIDEN_ABOVE_REVISIONS revisions are visible.
WIDEN = 4
MAX_WIDE_CANDIDATES = 1_600
WIDEN_ABOVE_REVISIONS = 16
# Organisations' vectors held in memory for the vector list (``_OrgVectors``), at most
# this many bytes of them in all; an organisation beyond it is searched by vec0.
MEMORY_VECTOR_BYTES = 256 * 1024 * 1024
# What a row's text list takes in memory, roughly (its tokens, postings and counts), for
# the limit above.
TEXT_BYTES_PER_ROW = 4096
# A build that failed is tried again for the same generation after this long (a new
# generation tries at once); the searches meanwhile read the tables.
RETRY_BUILD_S = 30.0

# Vectors per sqlite-vec storage chunk. vec0 allocates whole chunks per partition (here an
# organisation): with its default of 1,024, 100 organisations of one row each took 103 MiB
# at 256 dimensions, with 64 they took 6.5 MiB; a KNN query over 10,000 rows of one
# organisation took the same time (5.5 ms) with either.
VEC_CHUNK_SIZE = 64

_BASELINE = """
CREATE TABLE chunks(
  id INTEGER PRIMARY KEY,
  org TEXT NOT NULL,
  chunk_id TEXT NOT NULL,
  topic_id TEXT NOT NULL,
  revision_id TEXT NOT NULL,
  source_id TEXT NOT NULL,
  ordinal INTEGER NOT NULL,
  kind TEXT NOT NULL,
  title TEXT NOT NULL,
  section_path TEXT NOT NULL,
  page INTEGER,
  text TEXT NOT NULL,
  tags TEXT NOT NULL,
  UNIQUE(org, chunk_id)
);
CREATE INDEX chunks_revision ON chunks(org, revision_id);
CREATE VIRTUAL TABLE chunks_fts USING fts5(
  text, aux, content='', contentless_delete=1,
  tokenize='porter unicode61 remove_diacritics 2'
);
CREATE TABLE vector_tables(dim INTEGER PRIMARY KEY, tbl TEXT NOT NULL UNIQUE);
"""

# Each write of an organisation's rows bumps its generation: a process holding that
# organisation's vectors in memory sees the change on its next search.
_GENERATIONS = """
CREATE TABLE generations(org TEXT PRIMARY KEY, gen INTEGER NOT NULL);
"""

MIGRATIONS = Migrations(
    "kb_index.sqlite",
    (Step("001_initial", _BASELINE), Step("002_generations", _GENERATIONS)),
)


class _OrgVectors:
    """One organisation's rows for the vector list, in memory: row ids (ascending), unit
    vectors, a revision code per row and a mask per tag. A search is one matrix-vector
    product over them (exact: the same nearest rows as vec0's brute-force scan), where
    vec0 read and compared every stored vector per question (bench/RESULTS.md)."""

    def __init__(self, gen: int, rows: Sequence[tuple[Any, ...]], dim: int) -> None:
        self.gen = gen
        self.text: memtext.OrgText | None = None  # set by the index once built
        self.ids = np.asarray([int(r[0]) for r in rows], dtype=np.int64)
        codes: dict[str, int] = {}
        self.revs = np.asarray(
            [codes.setdefault(str(r[1]), len(codes)) for r in rows], dtype=np.int32
        )
        self.codes = codes
        m = np.frombuffer(b"".join(bytes(r[2]) for r in rows), dtype=np.float32)
        m = m.reshape(len(rows), dim) if rows else np.zeros((0, dim), dtype=np.float32)
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        self.matrix = m / np.where(norms == 0, 1.0, norms)
        tag_rows: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            for tag in json.loads(str(r[3])):
                tag_rows.setdefault(str(tag), []).append(i)
        self.tags = {t: np.asarray(ix, dtype=np.int64) for t, ix in tag_rows.items()}

    @property
    def nbytes(self) -> int:
        held = self.text.nbytes if self.text is not None else 0
        return int(self.matrix.nbytes + self.ids.nbytes + self.revs.nbytes + held)

    def visible(
        self, revision_ids: Collection[str], tags: Collection[str], any_tags: Collection[str]
    ) -> np.ndarray:
        """The mask of rows in ``revision_ids`` carrying every tag and one of ``any_tags``."""
        wanted = [self.codes[r] for r in revision_ids if r in self.codes]
        mask = np.isin(self.revs, np.asarray(wanted, dtype=np.int32))
        for tag in set(tags):
            has = np.zeros(len(self.ids), dtype=bool)
            has[self.tags.get(tag, np.zeros(0, dtype=np.int64))] = True
            mask &= has
        if any_tags:
            some = np.zeros(len(self.ids), dtype=bool)
            for tag in set(any_tags):
                some[self.tags.get(tag, np.zeros(0, dtype=np.int64))] = True
            mask &= some
        return mask

    def nearest(self, query: np.ndarray, mask: np.ndarray, n: int) -> list[int]:
        """Row ids of the ``n`` nearest visible rows by cosine distance, ties by row id."""
        positions = np.flatnonzero(mask)
        if positions.size == 0:
            return []
        q = query / (np.linalg.norm(query) or 1.0)
        dist = (
            1.0 - self.matrix[positions] @ q
            if positions.size < len(self.ids)
            else 1.0 - self.matrix @ q
        )
        if n < dist.size:
            # Everything at least as near as the n-th, so ties at the boundary stay exact.
            cut = np.partition(dist, n - 1)[n - 1]
            keep = np.flatnonzero(dist <= cut)
        else:
            keep = np.arange(dist.size)
        ids = self.ids[positions[keep]]
        order = np.lexsort((ids, dist[keep]))
        return [int(i) for i in ids[order][:n]]


_COLUMNS = (
    "id, org, chunk_id, topic_id, revision_id, source_id, ordinal, kind, title, "
    "section_path, page, text, tags"
)


def _bump(conn: apsw.Connection, org: str) -> None:
    conn.execute(
        "INSERT INTO generations(org, gen) VALUES(?, 1) "
        "ON CONFLICT(org) DO UPDATE SET gen = gen + 1",
        (org,),
    )


def _vec_table(dim: int) -> str:
    if not 1 <= dim <= 8192:
        raise ValueError(f"vector dimension {dim} is out of range")
    return f"chunks_vec_d{int(dim)}"


def _row_chunk(row: Sequence[object]) -> IndexChunk:
    (_id, org, chunk_id, topic, rev, source, ordinal, kind, title, section, page, text, tags) = row
    return IndexChunk(
        chunk_id=str(chunk_id),
        org=str(org),
        topic_id=str(topic),
        revision_id=str(rev),
        source_id=str(source),
        ordinal=int(ordinal),  # type: ignore[call-overload]
        kind=str(kind),
        title=str(title),
        section_path=tuple(json.loads(str(section))),
        page=None if page is None else int(page),  # type: ignore[call-overload]
        text=str(text),
        tags=tuple(json.loads(str(tags))),
    )


def _fts_text(chunk: IndexChunk) -> str:
    return _indexed(chunk.title, chunk.section_path, chunk.text)


def _indexed(title: str, section_path: Sequence[str], text: str) -> str:
    """The text index's ``text`` column: the title, the section path and the text."""
    return "\n".join([title, *section_path, text])


def _search_terms(text: str) -> list[QueryTerm]:
    """The question's terms the text list looks for: its words but stop words, or all of
    them when it has no other."""
    terms = query_terms(text)
    return [t for t in terms if not t.stop] or terms


def _fts_query(terms: Sequence[QueryTerm]) -> str | None:
    return " OR ".join(t.fts() for t in terms) or None


class SqliteRetrievalIndex:
    """``RetrievalIndex`` over one SQLite file. ``dim`` is the dimension of the vectors
    staged and searched (the embedder's)."""

    def __init__(self, path: Path | str, *, dim: int, lock: WriterLock | None = None) -> None:
        self.path = Path(path)
        self.dim = dim
        self._vec = _vec_table(dim)
        self._lock = lock or WriterLock(self.path.parent, "kb_index")
        self._local = threading.local()
        self._all: list[apsw.Connection] = []
        self._all_guard = threading.Lock()
        self._closed = False
        # Organisations' vectors in memory (``_OrgVectors``), least recently used first.
        self._memory: dict[str, _OrgVectors] = {}
        # Organisations found too large for memory, with the generation they were counted
        # at: not counted again on every search until they change.
        self._too_large: dict[str, int] = {}
        self._memory_guard = threading.Lock()
        # Organisations whose rows are being read into memory, with the generation.
        self._building: dict[str, int] = {}
        # Organisations whose build failed: (generation, when to try it again).
        self._failed: dict[str, tuple[int, float]] = {}
        # The text list's statistics by SQL (``_lexical``) per organisation, generation and
        # visible set: its rows and tokens, and each term's count among them (keyed by a
        # digest of all that, so an entry's size does not depend on the visible set's).
        self._stats: dict[bytes, int] = {}
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-index-memory")
        with self._lock:
            conn = self._connect(write=True)
            with immediate(conn):
                conn.execute(
                    f"CREATE VIRTUAL TABLE IF NOT EXISTS {self._vec} USING vec0("
                    f"org text partition key, revision_id text, "
                    f"embedding float[{int(dim)}] distance_metric=cosine, "
                    f"chunk_size={VEC_CHUNK_SIZE})"
                )
                conn.execute(
                    "INSERT OR IGNORE INTO vector_tables(dim, tbl) VALUES(?, ?)", (dim, self._vec)
                )

    # ------------------------------------------------------------------ connections

    def _connect(self, *, write: bool = False) -> apsw.Connection:
        if self._closed:
            raise RuntimeError("the retrieval index is closed")
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn  # type: ignore[no-any-return]
        os.makedirs(self.path.parent, exist_ok=True)
        conn = apsw.Connection(str(self.path))
        try:
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            conn.setbusytimeout(BUSY_MS)
            if write:
                use_wal(conn)
                conn.execute("PRAGMA synchronous=NORMAL")
                MIGRATIONS.migrate(conn, str(self.path))
            else:
                MIGRATIONS.check(conn, str(self.path))
            store_settings(conn)
            fts.register_scoped_bm25(conn)
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn
        with self._all_guard:
            self._all.append(conn)
        return conn

    def close(self) -> None:
        self._closed = True  # a build in progress stops at its next batch of rows
        self._builder.shutdown(wait=True, cancel_futures=True)
        with self._all_guard:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()

    # ------------------------------------------------------------------ writes

    def _vec_tables(self, conn: apsw.Connection) -> list[str]:
        return [_vec_table(int(r[0])) for r in conn.execute("SELECT dim FROM vector_tables")]

    def _delete(self, conn: apsw.Connection, org: str, revision_id: str) -> int:
        ids = [
            int(r[0])
            for r in conn.execute(
                "SELECT id FROM chunks WHERE org = ? AND revision_id = ?", (org, revision_id)
            )
        ]
        if not ids:
            return 0
        id_list = json.dumps(ids)
        conn.execute(
            "DELETE FROM chunks_fts WHERE rowid IN (SELECT value FROM json_each(?))", (id_list,)
        )
        for tbl in self._vec_tables(conn):
            conn.execute(
                f"DELETE FROM {tbl} WHERE rowid IN (SELECT value FROM json_each(?))",  # noqa: S608 - tbl comes from _vec_table, a fixed pattern
                (id_list,),
            )
        conn.execute("DELETE FROM chunks WHERE org = ? AND revision_id = ?", (org, revision_id))
        _bump(conn, org)
        return len(ids)

    def stage(
        self,
        org: str,
        revision_id: str,
        chunks: Sequence[IndexChunk],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        validate_stage(org, revision_id, chunks, vectors, self.dim)
        with self._lock:
            conn = self._connect(write=True)
            with immediate(conn):
                self._delete(conn, org, revision_id)
                _bump(conn, org)
                for chunk, vector in zip(chunks, vectors, strict=True):
                    conn.execute(
                        "INSERT INTO chunks(org, chunk_id, topic_id, revision_id, source_id, "
                        "ordinal, kind, title, section_path, page, text, tags) "
                        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
                        (
                            org,
                            chunk.chunk_id,
                            chunk.topic_id,
                            revision_id,
                            chunk.source_id,
                            chunk.ordinal,
                            chunk.kind,
                            chunk.title,
                            json.dumps(list(chunk.section_path), ensure_ascii=False),
                            chunk.page,
                            chunk.text,
                            json.dumps(list(chunk.tags), ensure_ascii=False),
                        ),
                    )
                    rowid = conn.last_insert_rowid()
                    indexed = _fts_text(chunk)
                    conn.execute(
                        "INSERT INTO chunks_fts(rowid, text, aux) VALUES(?, ?, ?)",
                        (rowid, indexed, aux_terms(indexed)),
                    )
                    conn.execute(
                        f"INSERT INTO {self._vec}(rowid, org, revision_id, embedding) "
                        "VALUES(?, ?, ?, ?)",
                        (rowid, org, revision_id, np.asarray(vector, dtype=np.float32).tobytes()),
                    )
            total = int(str(conn.execute("SELECT count(*) FROM chunks").fetchall()[0][0]))
            compact(conn, "chunks_fts", changed_rows=len(chunks), total_rows=total)

    def drop_revision(self, org: str, revision_id: str) -> int:
        with self._lock:
            conn = self._connect(write=True)
            with immediate(conn):
                return self._delete(conn, org, revision_id)

    # ------------------------------------------------------------------ reads

    def _filter_sql(
        self, tags: Collection[str], any_tags: Collection[str]
    ) -> tuple[str, list[object]]:
        sql = ""
        params: list[object] = []
        for tag in sorted(set(tags)):
            sql += " AND EXISTS(SELECT 1 FROM json_each(c.tags) WHERE value = ?)"
            params.append(tag)
        if any_tags:
            sql += (
                " AND EXISTS(SELECT 1 FROM json_each(c.tags) WHERE value IN "
                "(SELECT value FROM json_each(?)))"
            )
            params.append(json.dumps(sorted(set(any_tags))))
        return sql, params

    def search(
        self,
        org: str,
        text: str,
        vector: Sequence[float] | None,
        *,
        revision_ids: Collection[str],
        k: int,
        tags: Collection[str] = (),
        any_tags: Collection[str] = (),
        timeout_s: float | None = None,  # nothing remote to wait for: ignored
    ) -> list[IndexHit]:
        if k <= 0 or not revision_ids:
            return []
        conn = self._connect()
        revs = json.dumps(sorted(set(revision_ids)))
        n = min(MAX_CANDIDATES, max(k, k * CANDIDATES_PER_HIT))
        tag_sql, tag_params = self._filter_sql(tags, any_tags)
        memory = self._org_vectors(conn, org)
        mask = None if memory is None else memory.visible(revision_ids, tags, any_tags)
        lexical: list[str] = []
        terms = _search_terms(text)
        if terms and memory is not None and mask is not None and memory.text is not None:
            text_list = memory.text
            bm25 = text_list.scores(terms, self._tokens(conn), mask)
            lexical = [str(i) for i in text_list.best(bm25, memory.ids, n)]
        elif terms:
            lexical = self._lexical(conn, org, terms, revs, tag_sql, tag_params, n)
        nearest: list[str] = []
        if vector is not None:
            if len(vector) != self.dim:
                raise ValueError(f"query vector has {len(vector)} dimensions, not {self.dim}")
            if memory is not None and mask is not None:
                q = np.asarray(vector, dtype=np.float32)
                nearest = [str(i) for i in memory.nearest(q, mask, n)]
            else:
                nearest = self._nearest(
                    conn, org, vector, n, revision_ids, revs, tag_sql, tag_params
                )
        fused = rrf(lexical, nearest)
        hits: list[IndexHit] = []
        allowed = set(revision_ids)
        # Rows are read in the fused order, k at a time: nearly every candidate passes
        # the check, and reading (and decoding) all of up to 2n candidates for k hits
        # was most of a search's remaining time.
        for start in range(0, len(fused), k):
            batch = fused[start : start + k]
            rows = self._rows(conn, [int(key) for key, *_ in batch])
            for key, score, lex_rank, vec_rank in batch:
                chunk = rows.get(int(key))
                if chunk is None or not recheck(chunk, org, allowed, tags, any_tags):
                    continue
                hits.append(IndexHit(chunk, score, lex_rank, vec_rank))
                if len(hits) == k:
                    return hits
        return hits

    def _lexical(
        self,
        conn: apsw.Connection,
        org: str,
        terms: Sequence[QueryTerm],
        revs: str,
        tag_sql: str,
        tag_params: Sequence[object],
        n: int,
    ) -> list[str]:
        """The text list by SQL (an organisation not held in memory): BM25 with the
        statistics of the rows the question may see, the organisation's visible revisions
        after the tag filters, as the list in memory (memtext) computes it, through
        ``knowledge_bm25`` (FTS5's formula with given idf and average length). FTS5's
        ``bm25()`` counted every row of the table: another organisation's words moved this
        one's ranking. The counts are remembered per generation of the organisation (every
        write bumps it) and visible set."""
        visible = "c.org = ? AND c.revision_id IN (SELECT value FROM json_each(?))"
        visible += tag_sql
        args = (org, revs, *tag_params)
        # The key is a digest of the organisation, its generation, the visible set and
        # the count: the visible set (every visible revision id, and the tag filters) is
        # as long as the organisation is large, and a key holding it kept one copy per
        # search of a new word until the cache was cleared.
        seen = hashlib.blake2b(
            json.dumps([org, self._generation(conn, org), revs, tag_sql, *tag_params]).encode(),
            digest_size=16,
        )
        if len(self._stats) > 50_000:
            self._stats.clear()

        def count(key: str, sql: str, params: tuple[object, ...]) -> int:
            digest = seen.copy()
            digest.update(key.encode())
            cache_key = digest.digest()
            held = self._stats.get(cache_key)
            if held is None:
                ((value,),) = conn.execute(sql, params).fetchall()
                held = self._stats[cache_key] = int(str(value))
            return held

        rows = count(
            "\x00rows",
            f"SELECT count(*) FROM chunks c WHERE {visible}",  # noqa: S608 - tag_sql (in visible) is built from constant fragments; values are bound
            args,
        )
        if not rows:
            return []
        tokens = count(
            "\x00tokens",
            "SELECT coalesce(sum(knowledge_docsize(d.sz)), 0) FROM chunks c"  # noqa: S608 - as above
            f" CROSS JOIN chunks_fts_docsize d ON d.id = c.id WHERE {visible}",
            args,
        )
        idf = [
            fts.bm25_idf(
                rows,
                count(
                    t.fts(),
                    "SELECT count(*) FROM chunks_fts CROSS JOIN chunks c"  # noqa: S608 - as above
                    f" ON c.id = chunks_fts.rowid WHERE chunks_fts MATCH ? AND {visible}",
                    (t.fts(), *args),
                ),
            )
            for t in terms
        ]
        score, score_args = fts.scoped_score("chunks_fts", rows, tokens, (1.0, 1.0), idf)
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT c.id FROM chunks_fts CROSS JOIN chunks c ON c.id = chunks_fts.rowid"  # noqa: S608 - as above
                f" WHERE chunks_fts MATCH ? AND {visible}"
                f" ORDER BY {score}, c.id LIMIT ?",
                (_fts_query(terms), *args, *score_args, n),
            )
        ]

    def _generation(self, conn: apsw.Connection, org: str) -> int:
        rows = conn.execute("SELECT gen FROM generations WHERE org = ?", (org,)).fetchall()
        return int(str(rows[0][0])) if rows else 0

    def _org_vectors(self, conn: apsw.Connection, org: str) -> _OrgVectors | None:
        """``org``'s rows in memory, current with the store (its generation); None while
        they are being built (in the background: a search never waits for it) or when
        they would not fit in ``MEMORY_VECTOR_BYTES``. The searches meanwhile read the
        text index and vec0, as an organisation too large for memory always does."""
        gen = self._generation(conn, org)
        with self._memory_guard:
            held = self._memory.get(org)
            if held is not None and held.gen == gen:
                self._memory[org] = self._memory.pop(org)  # most recently used last
                return held
            failed = self._failed.get(org)
            waiting = failed is not None and failed[0] == gen and time.monotonic() < failed[1]
            if self._too_large.get(org) != gen and self._building.get(org) is None and not waiting:
                self._building[org] = gen
                try:
                    self._builder.submit(self._build_quietly, org, gen)
                except RuntimeError:  # closed meanwhile
                    self._building.pop(org, None)
        return None

    def warm(self, org: str | None = None, *, wait: bool = False) -> None:
        """Build the rows in memory of ``org`` (every organisation when None), in the
        background, or now with ``wait``. A serving process warms all at its start."""
        conn = self._connect()
        orgs = (
            [org]
            if org is not None
            else [str(r[0]) for r in conn.execute("SELECT DISTINCT org FROM chunks")]
        )
        for name in orgs:
            if wait:
                self._build(name, self._generation(conn, name))
            else:
                self._org_vectors(conn, name)

    def held(self, org: str) -> bool:
        """Whether ``org``'s rows are in memory at the store's current generation (its
        searches read them there)."""
        gen = self._generation(self._connect(), org)
        with self._memory_guard:
            held = self._memory.get(org)
        return held is not None and held.gen == gen

    def _build_quietly(self, org: str, gen: int) -> None:
        try:
            self._build(org, gen)
        except Exception:  # noqa: BLE001 - the searches go on without it; tried again later
            if not self._closed:
                _log.warning("kb_index.memory_build_failed", org=org, exc_info=True)
                with self._memory_guard:
                    self._failed[org] = (gen, time.monotonic() + RETRY_BUILD_S)
        finally:
            with self._memory_guard:
                if self._building.get(org) == gen:
                    del self._building[org]

    def _build(self, org: str, gen: int) -> None:
        """Read ``org``'s rows into memory and keep them at ``gen`` (read before them: after
        a write meanwhile the next search sees a newer one and builds again, reusing the
        rows' tokens)."""
        started = time.perf_counter()
        conn = self._connect()
        count = int(
            str(conn.execute("SELECT count(*) FROM chunks WHERE org = ?", (org,)).fetchall()[0][0])
        )
        if count * (self.dim * 4 + TEXT_BYTES_PER_ROW) > MEMORY_VECTOR_BYTES:
            with self._memory_guard:
                self._too_large[org] = gen
                self._memory.pop(org, None)  # an older generation's copy is of no use
            return
        loaded = conn.execute(
            f"SELECT v.rowid, v.revision_id, v.embedding, c.tags FROM {self._vec} v "  # noqa: S608 - a fixed-pattern table name
            "JOIN chunks c ON c.id = v.rowid WHERE v.org = ? ORDER BY v.rowid",
            (org,),
        ).fetchall()
        memory = _OrgVectors(gen, loaded, self.dim)
        with self._memory_guard:
            held = self._memory.get(org)
        previous = held.text if held is not None else None
        memory.text = memtext.build(
            memory.ids,
            self._texts(conn, org),
            previous,
            self._tokens(conn),
            aux_terms,
            stop=lambda: self._closed,
        )
        _log.info(
            "kb_index.memory_built",
            org=org,
            generation=gen,
            rows=len(memory.ids),
            tokenised=memory.text.tokenised,
            ms=round((time.perf_counter() - started) * 1000),
        )
        with self._memory_guard:
            now = self._memory.get(org)
            if now is not None and now.gen > gen:
                return  # a newer build finished first
            self._memory.pop(org, None)
            self._memory[org] = memory
            total = sum(m.nbytes for m in self._memory.values())
            while total > MEMORY_VECTOR_BYTES and len(self._memory) > 1:
                oldest = next(iter(self._memory))
                total -= self._memory.pop(oldest).nbytes

    def _tokens(self, conn: apsw.Connection) -> memtext.Tokens:
        """The text index's tokenizer, through this thread's connection."""
        tokens = getattr(self._local, "tokens", None)
        if tokens is None or getattr(self._local, "tokens_conn", None) is not conn:
            tokens = memtext.tokenizer(conn)
            self._local.tokens, self._local.tokens_conn = tokens, conn
        return tokens

    @staticmethod
    def _texts(conn: apsw.Connection, org: str) -> dict[int, str]:
        """The text index's ``text`` column of ``org``'s rows, as ``stage`` wrote it."""
        return {
            int(rid): _indexed(str(title), json.loads(str(section)), str(text))
            for rid, title, section, text in conn.execute(
                "SELECT id, title, section_path, text FROM chunks WHERE org = ?", (org,)
            )
        }

    def _nearest(
        self,
        conn: apsw.Connection,
        org: str,
        vector: Sequence[float],
        n: int,
        revision_ids: Collection[str],
        revs: str,
        tag_sql: str,
        tag_params: list[object],
    ) -> list[str]:
        """The ``n`` nearest rows of ``org`` in ``revision_ids`` (and the tags), as ids.

        vec0 checks a metadata ``IN`` list row by row against every value: with the
        revisions of hundreds of topics that was most of a search's time (bench/RESULTS.md,
        ``bench_kb_retrieve.py``). So without
        tag filters the organisation's nearest ``n * WIDEN`` rows are asked for first
        (the partition key only) and those of other revisions dropped here; when fewer
        than ``n`` remain while more rows exist, the filtered query answers instead. Either
        way the answer is the ``n`` nearest visible rows: a visible row outside the wider
        list is farther than every row in it."""
        query = np.asarray(vector, dtype=np.float32).tobytes()
        knn = (
            f"SELECT rowid, distance, revision_id FROM {self._vec} "  # noqa: S608 - a fixed-pattern table name
            "WHERE embedding MATCH ? AND k = ? AND org = ?"
        )
        found: list[Any] | None = None
        if not tag_sql and len(revision_ids) > WIDEN_ABOVE_REVISIONS:
            wide = min(MAX_WIDE_CANDIDATES, n * WIDEN)
            rows = conn.execute(knn + " ORDER BY distance", (query, wide, org)).fetchall()
            allowed = set(revision_ids)
            kept = [r for r in rows if r[2] in allowed]
            if len(kept) >= n or len(rows) < wide:
                found = kept
        if found is None:
            rowid_sql, rowid_params = "", []
            if tag_sql:
                rowid_sql = (
                    " AND rowid IN (SELECT c.id FROM chunks c WHERE c.org = ? AND c.revision_id IN "  # noqa: S608 - constant fragments; values are bound
                    "(SELECT value FROM json_each(?))" + tag_sql + ")"
                )
                rowid_params = [org, revs, *tag_params]
            found = conn.execute(
                knn  # noqa: S608 - constant fragments; values are bound
                + " AND revision_id IN (SELECT value FROM json_each(?))"
                + rowid_sql
                + " ORDER BY distance",
                (query, n, org, revs, *rowid_params),
            ).fetchall()
        # vec0 allows no second ORDER BY term: equal distances are ordered by rowid here.
        return [str(r[0]) for r in sorted(found, key=lambda r: (r[1], r[0]))[:n]]

    def _rows(self, conn: apsw.Connection, ids: Sequence[int]) -> dict[int, IndexChunk]:
        if not ids:
            return {}
        return {
            int(r[0]): _row_chunk(r)
            for r in conn.execute(
                f"SELECT {_COLUMNS} FROM chunks WHERE id IN (SELECT value FROM json_each(?))",  # noqa: S608 - a constant column list
                (json.dumps(list(ids)),),
            )
        }

    def revision_counts(self, org: str | None = None) -> dict[tuple[str, str], int]:
        conn = self._connect()
        if org is None:
            rows = conn.execute(
                "SELECT org, revision_id, count(*) FROM chunks GROUP BY org, revision_id"
            )
        else:
            rows = conn.execute(
                "SELECT org, revision_id, count(*) FROM chunks WHERE org = ? "
                "GROUP BY org, revision_id",
                (org,),
            )
        return {(str(o), str(r)): int(n) for o, r, n in rows}

    def get_chunks(self, org: str, chunk_ids: Collection[str]) -> list[IndexChunk]:
        if not chunk_ids:
            return []
        conn = self._connect()
        found = {
            chunk.chunk_id: chunk
            for chunk in map(
                _row_chunk,
                conn.execute(
                    f"SELECT {_COLUMNS} FROM chunks WHERE org = ? AND chunk_id IN "  # noqa: S608 - a constant column list
                    "(SELECT value FROM json_each(?))",
                    (org, json.dumps(list(chunk_ids))),
                ),
            )
        }
        return [found[c] for c in dict.fromkeys(chunk_ids) if c in found and found[c].org == org]
