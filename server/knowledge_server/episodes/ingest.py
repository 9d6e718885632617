"""Ingestion: discover logs, import what changed, keep per-file state; plus a polling watcher."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from knowledge_server.errors import as_storage_full
from knowledge_server.workspaces import in_scope, is_under, stored_cwd

from .discover import default_roots, discover, files_under, log_unit
from .importers import INCREMENTAL_FORMATS, import_full, import_incremental, sniff_format
from .importers import opencode as _opencode
from .importers.base import ImportResult
from .model import IngestReport
from .store import EpisodeStore

__all__ = [
    "ingest",
    "ingest_changed",
    "ingest_file",
    "ingest_sample_if_empty",
    "sample_path",
    "watch",
]

HEAD_BYTES = 4096
ProgressCallback = Callable[[int, int, str], None]
Scope = Sequence[str] | None


Owners = Mapping[str, tuple[str | None, str | None]]


def _within(res: ImportResult, scope: Sequence[str], owners: Owners) -> int:
    """Keep only the sessions of ``res`` that belong to ``scope``; returns how many were
    dropped. A log is untrusted data: its ``cwd`` (or its session id, naming a session
    another workspace already holds) would otherwise put a scoped operator's text into
    another tenant's workspace. A session belongs where its stored cwd says (the first
    writer's, which a later file never replaces), else where this file's cwd says.
    ``owners``: the stored cwd and first file of the sessions the store holds."""
    ids = set(res.sessions) | {e.session_id for e in res.events}
    outside = set()
    for sid in ids:
        meta = res.sessions.get(sid)
        cwd = owners.get(sid, (None, None))[0] or (meta.cwd if meta is not None else None)
        if not in_scope(cwd, scope):
            outside.add(sid)
    if outside:
        res.sessions = {k: v for k, v in res.sessions.items() if k not in outside}
        res.events = [e for e in res.events if e.session_id not in outside]
    return len(outside)


def _conflicting(res: ImportResult, path: str, owners: Owners) -> int:
    """Leave out the sessions of ``res`` that another file holds for another directory
    tree; returns how many. A session belongs to the workspace of its first writer:
    another log naming the same session id from an unrelated directory, or without any
    (two projects' ``session.jsonl`` without a session id, a planted id), would otherwise
    put its text into that workspace (or, first, lend its text to the next file's), and
    its lines that collide on ``seq`` would be lost as duplicates. The session's own
    file, a file that replaced a vanished one (moved), a directory above or below the
    stored one (an agent that changed directory), and two files that both name no
    directory are the same session's."""
    other = set()
    for sid, meta in res.sessions.items():
        held, source = owners.get(sid, (None, None))
        if source is None or source == path or not os.path.lexists(source):
            continue
        cwd = stored_cwd(meta.cwd)
        if held and cwd and (is_under(cwd, held) or is_under(held, cwd)):
            continue
        if not held and not cwd:
            continue
        other.add(sid)
    if other:
        res.sessions = {k: v for k, v in res.sessions.items() if k not in other}
        res.events = [e for e in res.events if e.session_id not in other]
    return len(other)


def sample_path() -> str:
    """The example session shipped with the package (generic JSONL)."""
    return os.path.join(os.path.dirname(__file__), "sample", "sample_session.jsonl")


def _head(path: str, n: int) -> tuple[int, str]:
    with open(path, "rb") as fh:
        data = fh.read(n)
    return len(data), hashlib.sha256(data).hexdigest()


def ingest_file(
    store: EpisodeStore,
    path: str,
    fmt: str,
    report: IngestReport | None = None,
    scope: Scope = None,
) -> IngestReport:
    """Import one file (or OpenCode session) if it changed since the last run; with a
    ``scope`` (a scoped operator's workspaces) only its sessions that belong there."""
    report = report or IngestReport()
    report.files_seen += 1
    try:
        st = os.stat(path)
    except OSError as exc:
        report.errors.append(f"{path}: {type(exc).__name__}")
        return report
    prev = store.source_state(path)
    if fmt == "opencode":
        size, mtime = _opencode.fingerprint(path)
    else:
        size, mtime = st.st_size, st.st_mtime
    inode = st.st_ino
    if (
        prev
        and prev["format"] == fmt
        and prev["size"] == size
        and prev["mtime"] == mtime
        and prev["inode"] == inode
    ):
        return report
    append = False
    if (
        fmt in INCREMENTAL_FORMATS
        and prev
        and prev["format"] == fmt
        and prev["inode"] == inode
        and size >= prev["offset"]
        and prev["head_len"] <= size
    ):
        # Same file grown (or touched): its already-consumed head must be unchanged.
        append = _head(path, prev["head_len"])[1] == prev["head_hash"]
    try:
        if append and prev is not None:  # append implies prev
            res = import_incremental(
                fmt, path, prev["offset"], prev["line"], bool(prev["pending_newline"]), prev["ctx"]
            )
        else:
            res = import_full(fmt, path)
    except OSError as exc:
        report.errors.append(f"{path}: {type(exc).__name__}")
        return report
    # A scoped ingest first leaves out what lies outside its scope (a session another
    # workspace holds among it), then any ingest what another file holds elsewhere.
    # The sessions' stored workspace and first file, read once for both checks.
    ids = set(res.sessions) | {e.session_id for e in res.events}
    owners = store.session_owners(ids) if ids else {}
    left_out = _within(res, scope, owners) if scope is not None else 0
    report.sessions_out_of_scope += left_out
    report.sessions_conflicting += _conflicting(res, path, owners)
    head_len, head_hash = _head(path, HEAD_BYTES) if fmt != "opencode" else (0, "")
    state = {
        "size": size,
        "mtime": mtime,
        "inode": inode,
        "offset": res.end_offset,
        "line": res.end_line,
        "pending_newline": res.pending_newline,
        "head_len": head_len,
        "head_hash": head_hash,
        "ctx": res.ctx,
        "sessions_prev": prev["sessions"] if (prev and append) else [],
    }
    if left_out:
        # Read for a scope that left sessions out: recorded as not yet read whole, so the
        # next ingest (the server's own, another operator's) reads the file again from its
        # start instead of taking it as consumed.
        state.update(size=-1, head_hash="")
    added, dup, touched = store.apply_file(
        path, fmt, reset=not append, events=res.events, sessions=res.sessions, state=state
    )
    report.files_changed += 1
    if not append and prev:
        report.files_reimported += 1
    report.events_added += added
    report.events_duplicate += dup
    report.sessions_touched += len(touched)
    report.per_file_events[path] = report.per_file_events.get(path, 0) + added
    for p in res.problems:
        if p.kind == "oversized":
            report.oversized.append(f"{p.location}: {p.detail}")
        else:
            (report.malformed if p.kind == "malformed" else report.unknown).append(p.location)
    return report


def ingest(
    store: EpisodeStore,
    paths: Sequence[str] | None = None,
    progress_callback: ProgressCallback | None = None,
    scope: Scope = None,
) -> IngestReport:
    """Import every recognised log under ``paths`` (None = the standard locations).

    ``scope`` (None = unrestricted) keeps only the sessions whose workspace lies in it
    (see ``_within``), and ``report.sessions`` then counts the sessions in it.

    Idempotent and incremental: unchanged files are skipped, grown JSONL files are read
    from the stored byte offset, truncated or rotated files are re-imported from scratch.
    """
    report = IngestReport()
    skipped: list[tuple[str, str]] = []
    files = discover(paths, skipped)
    report.skipped.extend(f"{path}: {reason}" for path, reason in skipped)
    total = len(files)
    for i, (path, fmt) in enumerate(files):
        if progress_callback:
            progress_callback(i, total, path)
        try:
            ingest_file(store, path, fmt, report, scope)
        except Exception as exc:
            if as_storage_full(exc) is not None:
                raise  # a full disk stops every file alike
            report.errors.append(f"{path}: {type(exc).__name__}")
    if progress_callback:
        progress_callback(total, total, "")
    _forget_deleted(store, paths, report)
    store.compact_fts(report.events_added + report.events_removed)
    report.sessions = store.counts(scope)["sessions"]
    report.index_rev = store.index_rev()
    return report


def ingest_changed(
    store: EpisodeStore, changed: Sequence[str], roots: Sequence[str]
) -> IngestReport:
    """Ingest the files a watcher saw change under ``roots`` (absolute, as watched).

    Each changed log file is imported on its own with :func:`ingest_file` (a grown JSONL
    file is read from its stored offset); a deleted one's events are dropped; a change
    inside an OpenCode storage rescans that root (its unit is the session, spread over
    files). Which files count follows :func:`discover` (``discover.log_unit``): links whose
    target leaves the root are not followed. Runs as the server itself (unrestricted),
    like the start-up ingest of the same folders."""
    report = IngestReport()
    rescan: list[str] = []
    paths = set(changed)
    for path in changed:
        root = max((r for r in roots if is_under(path, r)), key=len, default=None)
        if root is not None and os.path.isdir(path):
            # A folder that appeared: its files too (a file written into a new folder
            # before the watch on it was set up is reported only through the folder).
            paths.update(files_under(path, root))
    for path in sorted(paths):
        root = max((r for r in roots if is_under(path, r)), key=len, default=None)
        unit = log_unit(path, root) if root is not None else None
        if unit is None or root is None:
            continue
        if unit == "root":
            if root not in rescan:
                rescan.append(root)
            continue
        if not os.path.lexists(path):
            if store.source_state(path) is not None:
                report.events_removed += store.forget_source(path)
                report.files_changed += 1
            continue
        if not os.path.isfile(path):
            continue  # a FIFO or device named like a log (see ``discover``)
        fmt, _reason = sniff_format(path)
        if fmt is None:
            continue
        try:
            ingest_file(store, path, fmt, report)
        except Exception as exc:
            if as_storage_full(exc) is not None:
                raise
            report.errors.append(f"{path}: {type(exc).__name__}")
    if rescan:
        report.merge(ingest(store, rescan))
    else:
        store.compact_fts(report.events_added + report.events_removed)
    report.index_rev = store.index_rev()
    return report


def _forget_deleted(store: EpisodeStore, paths: Sequence[str] | None, report: IngestReport) -> None:
    """Drop the events of files that were indexed from the scanned roots and no longer exist."""
    roots = (
        default_roots()
        if paths is None
        else [os.path.abspath(os.path.expanduser(p)) for p in paths]
    )
    for src in store.source_paths():
        if os.path.exists(src):
            continue
        if any(src == r or src.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            report.events_removed += store.forget_source(src)
            report.files_changed += 1


def ingest_sample_if_empty(store: EpisodeStore) -> IngestReport | None:
    """On a first run with no logs at all, index the shipped example so search has content."""
    if store.counts()["sessions"]:
        return None
    return ingest(store, [sample_path()])


def watch(
    store: EpisodeStore,
    paths: Sequence[str] | None,
    interval: float,
    stop_event: threading.Event,
    callback: Callable[[IngestReport], None] | None = None,
) -> None:
    """Poll ``paths`` every ``interval`` seconds until ``stop_event`` is set.

    ``callback`` receives each report that changed something (the first pass always).
    """
    first = True
    while not stop_event.is_set():
        report = ingest(store, paths)
        if callback and (first or report.files_changed):
            callback(report)
        first = False
        stop_event.wait(interval)
