"""Find session logs: the harnesses' standard locations plus explicit files or folders."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from knowledge_server.workspaces import is_under

from .importers import sniff_format

__all__ = ["default_roots", "discover", "files_under", "log_unit"]

_EXTS = (".jsonl", ".ndjson", ".md", ".json")
_SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv"}


def default_roots(home: str | None = None) -> list[str]:
    """Standard log folders that exist on this machine."""
    home = home or os.path.expanduser("~")
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    codex_home = os.environ.get("CODEX_HOME") or os.path.join(home, ".codex")
    claude_home = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude")
    roots = [
        os.path.join(claude_home, "projects"),
        os.path.join(codex_home, "sessions"),
        os.path.join(codex_home, "archived_sessions"),
        os.path.join(data_home, "opencode", "storage"),
    ]
    return [r for r in roots if os.path.isdir(r)]


def _inside(path: str, real_root: str) -> bool:
    """A symlinked file counts only when its target stays under the walked folder: a link
    to ``/etc/...`` or into another tenant's logs is not followed. (``os.walk`` never
    descends into linked folders.)"""
    return not os.path.islink(path) or is_under(os.path.realpath(path), real_root)


def _walk(root: str, real_root: str | None = None) -> Iterable[str]:
    real_root = real_root or os.path.realpath(root)
    # OpenCode storage: only session files are units; message/part files belong to them.
    if os.path.isdir(os.path.join(root, "session")) and os.path.isdir(
        os.path.join(root, "message")
    ):
        for dp, dn, fn in os.walk(os.path.join(root, "session")):
            dn.sort()
            for f in sorted(fn):
                if f.startswith("ses_") and f.endswith(".json"):
                    path = os.path.join(dp, f)
                    if _inside(path, real_root):
                        yield path
        return
    for dp, dn, fn in os.walk(root):
        dn[:] = sorted(
            d
            for d in dn
            if d not in _SKIP_DIRS
            and not (d in ("message", "part") and os.path.isdir(os.path.join(dp, "session")))
        )
        if os.path.isdir(os.path.join(dp, "session")) and os.path.isdir(
            os.path.join(dp, "message")
        ):
            yield from _walk(dp, real_root)
            dn[:] = []
            continue
        for f in sorted(fn):
            if f.endswith(_EXTS) and not f.endswith(".meta.json"):
                path = os.path.join(dp, f)
                if _inside(path, real_root):
                    yield path


def discover(
    paths: Sequence[str] | None = None, skipped: list[tuple[str, str]] | None = None
) -> list[tuple[str, str]]:
    """Return ``(absolute path, format)`` for every recognised log under ``paths``.

    ``None`` scans :func:`default_roots`. A file is taken as given (its format detected by
    content); a folder is walked. Each candidate file (a log type by name, or a file given
    explicitly) that is not recognised is appended to ``skipped`` as ``(path, reason)``.
    """
    roots = (
        default_roots()
        if paths is None
        else [os.path.abspath(os.path.expanduser(p)) for p in paths]
    )
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for root in roots:
        files = [root] if os.path.isfile(root) else list(_walk(root)) if os.path.isdir(root) else []
        for f in files:
            if f in seen:
                continue
            seen.add(f)
            if not os.path.isfile(f):
                # A FIFO or device named like a log: opening it would block the ingest
                # (and every other one, behind its writer lock) or read without end.
                if skipped is not None:
                    skipped.append((f, "not a regular file"))
                continue
            fmt, reason = sniff_format(f)
            if fmt:
                out.append((f, fmt))
            elif skipped is not None:
                skipped.append((f, reason))
    return out


def _in_opencode_storage(path: str, root: str) -> bool:
    """``path`` lies in an OpenCode storage folder (one with ``session/`` and ``message/``)
    at or under ``root``: its unit is a session, not the file."""
    d = os.path.dirname(path)
    while is_under(d, root):
        if os.path.isdir(os.path.join(d, "session")) and os.path.isdir(os.path.join(d, "message")):
            return True
        if d == root:
            break
        d = os.path.dirname(d)
    return False


def log_unit(path: str, root: str) -> str | None:
    """What a change to ``path`` under the watched ``root`` means for ingestion, by the
    rules :func:`discover` walks with: ``"file"`` (a log file to import on its own),
    ``"root"`` (a file of an OpenCode storage: rescan ``root``), or None (not a log:
    another extension, a skipped folder, or a link whose target leaves ``root``)."""
    if path == root:
        return "file"
    if not is_under(path, root):
        return None
    rel = os.path.relpath(path, root).split(os.sep)
    if any(part in _SKIP_DIRS for part in rel[:-1]):
        return None
    if not path.endswith(_EXTS) or path.endswith(".meta.json"):
        return None
    if _in_opencode_storage(path, root):
        return "root"
    return "file" if _inside(path, os.path.realpath(root)) else None


def files_under(folder: str, root: str) -> list[str]:
    """Every file in ``folder`` (under the watched ``root``) and its subfolders, but those
    in skipped folders, without following linked folders: what a folder that appeared in
    a watched one may hold (a folder moved in, or files written before the watcher
    followed a new folder). Each is still judged by :func:`log_unit`."""
    if folder == root or not is_under(folder, root) or os.path.islink(folder):
        return []
    if any(part in _SKIP_DIRS for part in os.path.relpath(folder, root).split(os.sep)):
        return []
    out: list[str] = []
    for dp, dn, fn in os.walk(folder):
        dn[:] = sorted(d for d in dn if d not in _SKIP_DIRS)
        out.extend(os.path.join(dp, f) for f in sorted(fn))
    return out
