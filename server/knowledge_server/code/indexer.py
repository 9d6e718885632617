"""Index a workspace into a new immutable revision; fill vectors afterwards."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import operator
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import apsw
import numpy as np

from knowledge_server import fts
from knowledge_server.logs import get_logger

from . import bitknn
from .chunking import CHUNKER_VERSION, chunk_file, cli_options, generated_header
from .embed import Embedder, EmbeddingError
from .model import IndexInterrupted, IndexOptions, IndexReport, ProgressCallback, StopCheck
from .store import file_tokens, is_binary, scalar, vec_table_for, vec_tables
from .tokenize import index_tokens
from .walker import read_text, walk_workspace

__all__ = ["fill_vectors", "gc", "index_workspace", "normalise_root"]

_log = get_logger("knowledge.code.embed")


def normalise_root(root: str) -> str:
    return os.path.normpath(os.path.abspath(root))


def _fingerprint(files: list[tuple[str, str]], embedder_identity: str) -> str:
    h = hashlib.sha256()
    for path, file_hash in sorted(files):
        h.update(path.encode("utf-8", "surrogatepass") + b"\0" + file_hash.encode() + b"\n")
    h.update(f"chunker={CHUNKER_VERSION}\nembedder={embedder_identity}\n".encode())
    return h.hexdigest()


# Chunk fields stored in ``chunks``. Workers send chunks as plain tuples in this order:
# they cross the process boundary several times cheaper than dataclass instances.
_CHUNK_COLUMNS = (
    "chunk_id",
    "path",
    "start_line",
    "end_line",
    "source_kind",
    "symbol",
    "language",
    "content_hash",
    "text",
)
_chunk_row = operator.attrgetter(*_CHUNK_COLUMNS)
_INSERT_CHUNK = (
    f"INSERT INTO chunks({', '.join(_CHUNK_COLUMNS)}, file_id, workspace)"
    f" VALUES({', '.join('?' * (len(_CHUNK_COLUMNS) + 2))})"
)


_Job = tuple[str, str, str, tuple[str, ...], IndexOptions, tuple[int, int] | None]


def _prepare(job: _Job) -> dict[str, Any]:
    """Read, hash, chunk and tokenise one file (runs in a worker process for large runs)."""
    abspath, rel, ws, known_hashes, opts, root_id = job
    text, raw, reason = read_text(abspath, beneath=ws, root_id=root_id)
    if text is None:
        return {"skip": reason}
    fhash = hashlib.sha256(raw).hexdigest()
    if fhash in known_hashes:
        return {"hash": fhash, "known": True}
    chunks, language, method = chunk_file(ws, rel, text, opts)
    tokens = [(index_tokens(c.text), index_tokens(f"{c.path} {c.symbol}")) for c in chunks]
    return {
        "hash": fhash,
        "known": False,
        "language": language,
        "method": method,
        "generated": generated_header(text),
        "cli_options": cli_options(text),
        "chunks": [_chunk_row(c) for c in chunks],
        "tokens": tokens,
    }


def _results(jobs: list[_Job], opts: IndexOptions) -> Iterator[dict[str, Any]]:
    workers = opts.workers or min(4, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) < 64:
        for job in jobs:
            yield _prepare(job)
        return
    # Not "fork": the server process runs gRPC threads, and forking a threaded process can
    # copy a held lock into the child. "forkserver" forks from a clean helper process.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
    # Results (chunk texts and their tokens) cross a pipe into this process, and each
    # message costs the receiving thread more than its bytes do: send them in bigger
    # groups, yet small enough that the workers finish together (figures in bench/RESULTS.md).
    chunksize = max(8, min(64, len(jobs) // (workers * 8)))
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_prepare, jobs, chunksize=chunksize)


def _write_batch(conn: apsw.Connection, workspace: str, batch: list[dict[str, Any]]) -> None:
    """Insert new file versions with their chunks; they stay invisible until a revision
    references them."""
    with conn:
        for f in batch:
            conn.execute(
                "INSERT INTO file_versions(workspace, path, file_hash, chunker, language, method,"
                " size, mtime_ns, n_chunks, generated, cli_options) VALUES(?,?,?,?,?,?,?,?,?,?,?)",
                (
                    workspace,
                    f["path"],
                    f["hash"],
                    CHUNKER_VERSION,
                    f["language"],
                    f["method"],
                    f["size"],
                    f["mtime_ns"],
                    len(f["chunks"]),
                    int(f["generated"]),
                    int(f["cli_options"]),
                ),
            )
            file_id = conn.last_insert_rowid()
            f["file_id"] = file_id
            for row, (tokens, meta) in zip(f["chunks"], f["tokens"], strict=True):
                conn.execute(_INSERT_CHUNK, (*row, file_id, workspace))
                conn.execute(
                    "INSERT INTO chunks_fts(rowid, tokens, meta) VALUES(?,?,?)",
                    (conn.last_insert_rowid(), tokens, meta),
                )
            conn.execute(
                "INSERT INTO files_fts(rowid, tokens, path) VALUES(?,?,?)",
                (file_id, file_tokens([t for t, _ in f["tokens"]]), index_tokens(f["path"])),
            )


# Skips decided by a file's content, remembered with its size and mtime (``skipped_files``).
CONTENT_SKIPS = frozenset({"binary", "encoding"})


def index_workspace(  # noqa: C901 - the indexing pipeline in order (reuse by size+mtime, read, chunk, write, drop); splitting it scatters one transaction plan
    conn: apsw.Connection,
    root: str,
    *,
    embedder: Embedder,
    progress_callback: ProgressCallback | None = None,
    options: IndexOptions | None = None,
    vector_progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
    full: bool = False,
    within: Callable[[str], bool] | None = None,
) -> IndexReport:
    """Index ``root`` into a new revision (committed in one transaction), then embed its
    new chunks. ``progress_callback`` follows the walked files, ``vector_progress`` the
    embedded chunks. A provider that fails after its retries leaves the revision
    lexical-only (``vectors_error``; the next run fills them); ``should_stop`` ends the
    embedding between two batches with ``IndexInterrupted``. ``full``: every file is read
    again, even one whose size and modification time are unchanged (a copy that kept
    them, ``cp -p``, ``rsync -t``); chunks of a content already stored are still reused.
    ``within``: the caller's scope, asked about the real path of the folder opened as the
    root (``walker.RootOutside`` when it answers no)."""
    opts = options or IndexOptions()
    ws = normalise_root(root)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    walk = walk_workspace(
        ws,
        max_file_bytes=opts.max_file_bytes,
        skip_secret_files=opts.skip_secret_files,
        extra_ignore=opts.extra_ignore,
        within=within,
    )
    timings["walk"] = (time.perf_counter() - t0) * 1000
    skipped: Counter[str] = Counter(walk.skipped)
    fallbacks: Counter[str] = Counter()

    prev = conn.execute(
        "SELECT r.id, r.rev, r.fingerprint, r.chunker, r.embedder FROM workspaces w"
        " JOIN revisions r ON r.id = w.current_rev_id WHERE w.root = ?",
        (ws,),
    ).fetchone()
    prev_files: dict[str, tuple[int, int, int, str]] = {}
    if prev is not None and not full:
        for fid, path, size, mtime_ns, fhash in conn.execute(
            "SELECT f.id, f.path, f.size, f.mtime_ns, f.file_hash FROM rev_file rf"
            " JOIN file_versions f ON f.id = rf.file_id WHERE rf.rev_id = ? AND f.chunker = ?",
            (prev[0], CHUNKER_VERSION),
        ):
            prev_files[path] = (fid, size, mtime_ns, fhash)

    report = IndexReport(workspace=ws, index_rev="", fingerprint="")
    report.files_seen = len(walk.files)
    members: list[tuple[int | None, str, str]] = []  # (file_id or None=pending, path, hash)
    pending: list[dict[str, Any]] = []
    t1 = time.perf_counter()
    total = len(walk.files)

    def flush() -> None:
        if pending:
            _write_batch(conn, ws, pending)
            pending_ids = {f["path"]: f["file_id"] for f in pending}
            for i, (fid, path, fh) in enumerate(members):
                if fid is None and path in pending_ids:
                    members[i] = (pending_ids[path], path, fh)
            pending.clear()

    # Files whose size+mtime match the previous revision are reused without being read,
    # and so are files skipped last time for their content (binary, encoding). A file
    # that could not be read (permissions) is tried again on every run: making it readable
    # changes neither its size nor its modification time.
    recorded_skips = {
        path: (size, mtime_ns, reason)
        for path, size, mtime_ns, reason in conn.execute(
            "SELECT path, size, mtime_ns, reason FROM skipped_files WHERE workspace = ?", (ws,)
        )
    }
    known_skips = {
        path: skip for path, skip in recorded_skips.items() if skip[2] in CONTENT_SKIPS and not full
    }
    to_read = []
    for wf in walk.files:
        old = prev_files.get(wf.path)
        ks = known_skips.get(wf.path)
        if ks is not None and ks[0] == wf.size and ks[1] == wf.mtime_ns:
            continue
        if old is None or old[1] != wf.size or old[2] != wf.mtime_ns:
            to_read.append(wf)
    new_skips: list[tuple[str, str, int, int, str]] = []
    known: dict[str, list[str]] = {}
    if 0 < len(to_read) <= 200:
        for wf in to_read:
            for (fh,) in conn.execute(
                "SELECT file_hash FROM file_versions WHERE workspace = ? AND path = ?"
                " AND chunker = ?",
                (ws, wf.path, CHUNKER_VERSION),
            ):
                known.setdefault(wf.path, []).append(fh)
    elif to_read:
        for path, fh in conn.execute(
            "SELECT path, file_hash FROM file_versions WHERE workspace = ? AND chunker = ?",
            (ws, CHUNKER_VERSION),
        ):
            known.setdefault(path, []).append(fh)
    jobs = [
        (wf.abspath, wf.path, ws, tuple(known.get(wf.path, ())), opts, walk.root_id)
        for wf in to_read
    ]
    results = _results(jobs, opts)

    for done, wf in enumerate(walk.files, 1):
        if progress_callback is not None:
            progress_callback(done, total, wf.path)
        if should_stop is not None and done % 64 == 0 and should_stop():
            # Before the commit: the previous revision stays current; file versions
            # already written are reused by the next run (found by their hash).
            raise IndexInterrupted(f"stopped after reading {done}/{total} files")
        ks = known_skips.get(wf.path)
        if ks is not None and ks[0] == wf.size and ks[1] == wf.mtime_ns:
            skipped[ks[2]] += 1
            continue
        old = prev_files.get(wf.path)
        if old is not None and old[1] == wf.size and old[2] == wf.mtime_ns:
            members.append((old[0], wf.path, old[3]))
            report.files_reused += 1
            continue
        res = next(results)
        if "skip" in res:
            skipped[res["skip"]] += 1
            if res["skip"] in CONTENT_SKIPS:
                new_skips.append((ws, wf.path, wf.size, wf.mtime_ns, res["skip"]))
            continue
        fhash = res["hash"]
        if res["known"]:
            # Same content (touched, or left by an interrupted run): keep its chunks.
            # The worker found this version in the store ("known"), so the row exists.
            row = cast(
                tuple[int],
                conn.execute(
                    "SELECT id FROM file_versions WHERE workspace=? AND path=? AND file_hash=?"
                    " AND chunker=?",
                    (ws, wf.path, fhash, CHUNKER_VERSION),
                ).fetchone(),
            )
            with conn:
                conn.execute(
                    "UPDATE file_versions SET size=?, mtime_ns=? WHERE id=?",
                    (wf.size, wf.mtime_ns, row[0]),
                )
            members.append((int(row[0]), wf.path, fhash))
            report.files_reused += 1
            continue
        if res["method"].startswith("fallback:"):
            fallbacks[f"{res['language']}:{res['method'][9:]}"] += 1
        pending.append(
            {
                "path": wf.path,
                "hash": fhash,
                "language": res["language"],
                "method": res["method"],
                "generated": res["generated"],
                "cli_options": res["cli_options"],
                "size": wf.size,
                "mtime_ns": wf.mtime_ns,
                "chunks": res["chunks"],
                "tokens": res["tokens"],
            }
        )
        members.append((None, wf.path, fhash))
        report.files_indexed += 1
        report.chunks_new += len(res["chunks"])
        if len(pending) >= opts.batch_files:
            flush()
    flush()
    walked = {wf.path for wf in walk.files}
    # Rows of files gone or read again (a full run reads every file: its skips replace all).
    read_again = {wf.path for wf in to_read}
    gone = [p for p in recorded_skips if p not in walked or p in read_again]
    if new_skips or gone:
        with conn:
            conn.executemany(
                "DELETE FROM skipped_files WHERE workspace = ? AND path = ?",
                [(ws, p) for p in gone],
            )
            conn.executemany("INSERT OR REPLACE INTO skipped_files VALUES(?,?,?,?,?)", new_skips)
    timings["chunk_and_store"] = (time.perf_counter() - t1) * 1000

    fingerprint = _fingerprint([(p, h) for _, p, h in members], embedder.identity)
    report.fingerprint = fingerprint
    report.files_skipped = dict(skipped)
    report.parse_fallbacks = dict(fallbacks)
    t2 = time.perf_counter()
    file_ids = sorted({int(fid) for fid, _, _ in members if fid is not None})

    if prev is not None and prev[2] == fingerprint:
        # Nothing changed: the current revision stays; only refresh its freshness stamp.
        with conn:
            conn.execute(
                "UPDATE revisions SET walk_count=?, walk_max_mtime_ns=? WHERE id=?",
                (len(walk.files), walk.max_mtime_ns, prev[0]),
            )
        report.index_rev = prev[1]
        report.unchanged = True
        report.chunks = int(scalar(conn, "SELECT chunks FROM revisions WHERE id=?", (prev[0],)))
    else:
        vtbl = vec_table_for(conn, embedder.identity, embedder.dim, create=True)
        with conn:  # the one transaction that makes the new revision visible
            n_chunks = 0
            if file_ids:
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS _fids(id INTEGER PRIMARY KEY)")
                conn.execute("DELETE FROM _fids")
                conn.executemany("INSERT INTO _fids(id) VALUES(?)", [(i,) for i in file_ids])
                n_chunks = int(
                    scalar(
                        conn,
                        "SELECT coalesce(sum(n_chunks), 0) FROM file_versions"
                        " WHERE id IN (SELECT id FROM _fids)",
                    )
                )
                missing = int(
                    scalar(
                        conn,
                        "SELECT coalesce(sum(f.n_chunks), 0) FROM file_versions f WHERE f.id IN"
                        " (SELECT id FROM _fids) AND NOT EXISTS (SELECT 1 FROM file_vec v WHERE"
                        " v.file_id = f.id AND v.tbl = ?)",
                        (vtbl,),
                    )
                )
            else:
                missing = 0
            conn.execute(
                "INSERT INTO revisions(rev, workspace, fingerprint, chunker, embedder, created_ns,"
                " files, chunks, walk_count, walk_max_mtime_ns, vec_missing)"
                " VALUES('pending', ?,?,?,?,?,?,?,?,?,?)",
                (
                    ws,
                    fingerprint,
                    CHUNKER_VERSION,
                    embedder.identity,
                    time.time_ns(),
                    len(file_ids),
                    n_chunks,
                    len(walk.files),
                    walk.max_mtime_ns,
                    missing,
                ),
            )
            rev_id = conn.last_insert_rowid()
            rev = f"rev-{rev_id:06d}"
            conn.execute("UPDATE revisions SET rev=? WHERE id=?", (rev, rev_id))
            conn.executemany(
                "INSERT INTO rev_file(rev_id, file_id) VALUES(?, ?)",
                [(rev_id, i) for i in file_ids],
            )
            conn.execute(
                "INSERT INTO workspaces(root, current_rev_id) VALUES(?, ?)"
                " ON CONFLICT(root) DO UPDATE SET current_rev_id=excluded.current_rev_id",
                (ws, rev_id),
            )
            if prev is not None:
                reason = _drift_reason(prev_files, members, prev[3], prev[4], embedder.identity)
                conn.execute(
                    "INSERT INTO drift(workspace, rev, previous_fingerprint, new_fingerprint,"
                    " reason, created_ns) VALUES(?,?,?,?,?,?)",
                    (ws, rev, prev[2], fingerprint, reason, time.time_ns()),
                )
                report.drift_written = True
        report.index_rev = rev
        report.chunks = n_chunks
        gc(conn, ws, keep=opts.keep_revisions)
    timings["commit"] = (time.perf_counter() - t2) * 1000
    timings["lexical_total"] = (time.perf_counter() - t0) * 1000
    if opts.fill_vectors:
        t3 = time.perf_counter()
        try:
            report.vectors_embedded = fill_vectors(
                conn,
                embedder,
                workspace=ws,
                progress_callback=vector_progress,
                should_stop=should_stop,
            )
        except EmbeddingError as exc:
            # The revision is committed and answers lexically; its chunks stay counted
            # as missing vectors, which the lane reports, until a run fills them.
            report.vectors_error = str(exc)
            _log.warning("code.embed.failed", error=str(exc))
        timings["vectors"] = (time.perf_counter() - t3) * 1000
    report.vectors_missing = int(
        scalar(conn, "SELECT vec_missing FROM revisions WHERE rev=?", (report.index_rev,)) or 0
    )
    if report.chunks_new:
        # A run that wrote a sizeable share of the chunks leaves the text index in one
        # segment (fts.compact); a one-file edit does not pay for that.
        t4 = time.perf_counter()
        total = int(scalar(conn, "SELECT coalesce(max(id), 0) FROM chunks") or 0)
        if fts.compact(conn, "chunks_fts", changed_rows=report.chunks_new, total_rows=total):
            timings["fts_merge"] = (time.perf_counter() - t4) * 1000
        files = int(scalar(conn, "SELECT coalesce(max(id), 0) FROM file_versions") or 0)
        fts.compact(conn, "files_fts", changed_rows=report.files_indexed, total_rows=files)
    timings["total"] = (time.perf_counter() - t0) * 1000
    report.timings_ms = {k: round(v, 2) for k, v in timings.items()}
    return report


def _drift_reason(
    prev_files: dict[str, tuple[int, int, int, str]],
    members: list[tuple[int | None, str, str]],
    prev_chunker: str,
    prev_embedder: str,
    embedder_identity: str,
) -> str:
    now = {p: h for _, p, h in members}
    added = sum(1 for p in now if p not in prev_files)
    removed = sum(1 for p in prev_files if p not in now)
    changed = sum(1 for p, h in now.items() if p in prev_files and prev_files[p][3] != h)
    parts = [f"files added={added} changed={changed} removed={removed}"]
    if prev_chunker != CHUNKER_VERSION:
        parts.append(f"chunker {prev_chunker} -> {CHUNKER_VERSION}")
    if prev_embedder != embedder_identity:
        parts.append(f"embedder {prev_embedder} -> {embedder_identity}")
    return "; ".join(parts)


def _fill_log(
    embedder: Embedder, done: int, total: int, started: float, **extra: object
) -> dict[str, object]:
    secs = time.perf_counter() - started
    return {
        "embedder": type(embedder).__name__,
        "chunks_done": done,
        "chunks_total": total,
        "seconds": round(secs, 2),
        "chunks_per_s": round(done / secs, 2) if secs > 0 else 0.0,
        **extra,
    }


def fill_vectors(  # noqa: C901 - one loop: gather, embed a batch, commit it, report, check for a stop
    conn: apsw.Connection,
    embedder: Embedder,
    *,
    workspace: str | None = None,
    batch_size: int | None = None,
    progress_callback: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
    log_every_s: float = 5.0,
) -> int:
    """Embed the chunks of every file of the current revision(s) that has no vectors yet.

    Chunks go to the embedder ``batch_size`` (default: ``embedder.batch_size``) at a time,
    each batch committed on its own; a file counts as embedded (``file_vec``) once its
    last chunk is. Between two batches it reports progress (``progress_callback`` with
    chunks done/total, a ``code.embed.progress`` log line every ``log_every_s``) and
    checks ``should_stop``: a stop raises ``IndexInterrupted`` after recording how many
    chunks still miss vectors, and the next run embeds only those (chunks that already
    have a vector are not sent again)."""
    bs = max(1, batch_size or embedder.batch_size)
    vtbl = vec_table_for(conn, embedder.identity, embedder.dim, create=True)
    quant = "vec_quantize_binary(?)" if is_binary(embedder.dim) else "?"
    ws_filter = "" if workspace is None else " AND w.root = ?"
    params: tuple[Any, ...] = (embedder.identity,) + (() if workspace is None else (workspace,))
    files = [
        (int(r[0]), int(r[1]))
        for r in conn.execute(
            "SELECT DISTINCT rf.file_id, f.n_chunks FROM workspaces w"  # noqa: S608 - constant SQL fragments only, values bound
            " JOIN revisions r ON r.id = w.current_rev_id AND r.embedder = ?"
            " JOIN rev_file rf ON rf.rev_id = w.current_rev_id"
            " JOIN file_versions f ON f.id = rf.file_id"
            f" WHERE 1=1{ws_filter}"
            " AND NOT EXISTS (SELECT 1 FROM file_vec v WHERE v.file_id = rf.file_id AND v.tbl = ?)"
            " ORDER BY rf.file_id",
            (*params, vtbl),
        )
    ]
    total = sum(n for _, n in files)
    done = 0
    embedded = 0
    batch: list[tuple[int, str, str, str]] = []
    complete: list[int] = []  # files whose every chunk is in ``batch`` or already stored
    started = last_log = time.perf_counter()
    if files:
        _log.info("code.embed.started", **_fill_log(embedder, 0, total, started))

    def update_missing() -> None:
        with conn:
            conn.execute(
                "UPDATE revisions SET vec_missing = (SELECT coalesce(sum(f.n_chunks), 0)"  # noqa: S608 - constant SQL fragments only, values bound
                " FROM rev_file rf JOIN file_versions f ON f.id = rf.file_id"
                " WHERE rf.rev_id = revisions.id AND NOT EXISTS"
                " (SELECT 1 FROM file_vec v WHERE v.file_id = f.id AND v.tbl = ?))"
                " WHERE id IN (SELECT current_rev_id FROM workspaces"
                + ("" if workspace is None else " WHERE root = ?")
                + ") AND embedder = ?",
                (vtbl,) + (() if workspace is None else (workspace,)) + (embedder.identity,),
            )

    def flush() -> None:
        nonlocal done, embedded, last_log
        if should_stop is not None and should_stop():
            update_missing()
            _log.info("code.embed.stopped", **_fill_log(embedder, done, total, started))
            raise IndexInterrupted(f"stopped after embedding {done}/{total} chunks")
        vecs: np.ndarray | list[np.ndarray] = (
            embedder.embed([f"{p} {s}\n{t}" for _, p, s, t in batch]) if batch else []
        )
        with conn:
            for (cid, *_), v in zip(batch, vecs, strict=True):
                blob = np.ascontiguousarray(v, dtype=np.float32).tobytes()
                conn.execute(f"DELETE FROM {vtbl} WHERE rowid = ?", (cid,))  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
                conn.execute(
                    f"INSERT INTO {vtbl}(rowid, embedding) VALUES(?, {quant})", (cid, blob)
                )
                conn.execute(f"INSERT OR REPLACE INTO {vtbl}_f(id, v) VALUES(?, ?)", (cid, blob))
            conn.executemany(
                "INSERT OR IGNORE INTO file_vec(file_id, tbl) VALUES(?, ?)",
                [(f, vtbl) for f in complete],
            )
            if batch:
                bitknn.bump_epoch(conn, vtbl)
        embedded += len(batch)
        done += len(batch)
        batch.clear()
        complete.clear()
        if progress_callback is not None:
            progress_callback(done, total, "")
        now = time.perf_counter()
        if now - last_log >= log_every_s:
            last_log = now
            _log.info("code.embed.progress", **_fill_log(embedder, done, total, started))

    for fid, _ in files:
        for cid, path, symbol, text, stored in cast(
            list[tuple[int, str, str, str, int]],
            conn.execute(
                f"SELECT c.id, c.path, c.symbol, c.text, EXISTS(SELECT 1 FROM {vtbl}_f v"  # noqa: S608 - vtbl is a checked vec_<hex> name (code.store)
                " WHERE v.id = c.id) FROM chunks c WHERE c.file_id = ? ORDER BY c.id",
                (fid,),
            ).fetchall(),
        ):
            if stored:  # embedded by a run that stopped before the file was complete
                done += 1
                continue
            batch.append((cid, path, symbol, text))
            if len(batch) >= bs:
                flush()
        complete.append(fid)
        if len(complete) >= 1000 and not batch:
            flush()  # files whose chunks were all stored already: record them now
    if batch or complete:
        flush()
    update_missing()
    if files:
        _log.info("code.embed.done", **_fill_log(embedder, done, total, started))
    return embedded


def gc(conn: apsw.Connection, workspace: str, *, keep: int = 2) -> int:
    """Drop revisions beyond the newest ``keep`` and every row only they referenced."""
    old = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM revisions WHERE workspace = ? AND id NOT IN"
            " (SELECT current_rev_id FROM workspaces WHERE root = ?)"
            " ORDER BY id DESC LIMIT -1 OFFSET ?",
            (workspace, workspace, max(0, keep - 1)),
        )
    ]
    with conn:
        for rid in old:
            conn.execute("DELETE FROM rev_file WHERE rev_id = ?", (rid,))
            conn.execute("DELETE FROM revisions WHERE id = ?", (rid,))
        dead = [
            r[0]
            for r in conn.execute(
                "SELECT f.id FROM file_versions f WHERE f.workspace = ? AND NOT EXISTS"
                " (SELECT 1 FROM rev_file rf WHERE rf.file_id = f.id)",
                (workspace,),
            )
        ]
        if not dead:
            return len(old)
        tables = vec_tables(conn)
        for fid in dead:
            ids = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE file_id = ?", (fid,))]
            for cid in ids:
                conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (cid,))
                for t in tables:
                    conn.execute(f"DELETE FROM {t} WHERE rowid = ?", (cid,))  # noqa: S608 - t is a checked vec_<hex> name (vec_tables)
                    conn.execute(f"DELETE FROM {t}_f WHERE id = ?", (cid,))  # noqa: S608 - likewise
            conn.execute("DELETE FROM files_fts WHERE rowid = ?", (fid,))
            conn.execute("DELETE FROM file_vec WHERE file_id = ?", (fid,))
            conn.execute("DELETE FROM chunks WHERE file_id = ?", (fid,))
            conn.execute("DELETE FROM file_versions WHERE id = ?", (fid,))
        for t in tables:
            bitknn.bump_epoch(conn, t)
    return len(old)
