"""The one workspace rule (DESIGN §5): a path belongs to a root when it is the root or lies
under it. Every lane, the scope computation and dispatch use these helpers."""

from __future__ import annotations

import os
from collections.abc import Sequence

from knowledge_server.schema import prefix_upper


def normalise_workspace(path: str) -> str:
    """Absolute, normalised, ``~`` expanded (symlinks left alone)."""
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def is_under(path: str, root: str) -> bool:
    """``path`` is ``root`` or inside it (string rule on normalised paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def stored_cwd(path: str | None) -> str | None:
    """A session's directory as the stores keep it: normalised as ``in_scope`` reads it
    (``a/./b``, ``a/../b``, ``a//b`` and a trailing ``/`` folded). Logs are untrusted
    data: kept as written, ``/work/app/../other`` would lie in ``/work/app``'s range for
    the SQL rule (``under_sql``), while ``in_scope`` puts it in ``/work/other``."""
    return os.path.normpath(path) if path else path


def in_scope(path: str | None, scope: Sequence[str] | None) -> bool:
    """None = unrestricted; otherwise ``path`` equals a scope root or lies under one."""
    if scope is None:
        return True
    if not path:
        return False
    p = os.path.normpath(path)  # as stored_cwd stores it
    return any(is_under(p, os.path.normpath(r)) for r in scope)


def really_in_scope(path: str, scope: Sequence[str] | None) -> bool:
    """``in_scope`` for the file system: ``path`` is in scope by its string *and*, once every
    symlink is resolved (``os.path.realpath``, on both sides), still lies under one of
    the roots. A link inside a workspace that points elsewhere (``ws/etc -> /etc``, or
    into another tenant's workspace) passes the string rule and fails this one. The
    string rule stays: it is the workspace's identity, what search scopes filter on."""
    if scope is None:
        return True
    if not in_scope(path, scope) or "\x00" in path:
        # A NUL character names no file: the operating system refuses such a path.
        return False
    real = os.path.realpath(path)
    return any(is_under(real, os.path.realpath(r)) for r in scope)


def real_path_in_scope(real: str, scope: Sequence[str]) -> bool:
    """``real`` (a path with every link resolved, e.g. of an open folder) lies under the
    real path of one of the ``scope`` roots."""
    return any(is_under(real, os.path.realpath(r)) for r in scope)


def under_sql(column: str, roots: Sequence[str]) -> tuple[str, list[str]]:
    """SQL true where ``column`` (a path) ``is_under`` one of ``roots`` (normalised): equal
    to a root, or in the range of the strings starting with ``root + "/"``
    (``schema.prefix_upper``: up to ``root + "0"``, as "0" follows "/").

    A range, not ``LIKE 'root/%'``: an index on ``column`` answers it, and LIKE ignores
    ASCII case, where paths (and ``is_under``) do not."""
    parts: list[str] = []
    args: list[str] = []
    for root in roots:
        under = root.rstrip("/") + "/"  # "/" -> "/": every absolute path
        parts.append(f"({column} = ? OR ({column} >= ? AND {column} < ?))")
        args.extend([root, under, prefix_upper(under) or ""])
    return "(" + " OR ".join(parts) + ")", args
