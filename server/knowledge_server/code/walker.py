"""Workspace walker: which files of a workspace the code lane may read.

Honours ``.gitignore`` files at every level and ``.git/info/exclude``, never enters
``.git``, and refuses secret files by name before opening them. Binary and
undecodable files are detected when read (:func:`read_text`), oversized ones from
``stat`` alone, so the walk itself never reads file contents.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pathspec

from knowledge_server.redact import SECRET_FILE_PATTERNS, SOURCE_FILE_EXCEPTIONS

__all__ = [
    "RootOutside",
    "WalkResult",
    "WalkedFile",
    "is_secret_name",
    "read_text",
    "walk_workspace",
]

_SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class WalkedFile:
    path: str  # relative POSIX path
    abspath: str
    size: int
    mtime_ns: int


@dataclass(slots=True)
class WalkResult:
    root: str
    files: list[WalkedFile] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    # The walked root folder's (device, inode): every later read checks it opens the same
    # folder (``read_text``), not one swapped in under the root's name since.
    root_id: tuple[int, int] | None = None

    @property
    def max_mtime_ns(self) -> int:
        return max((f.mtime_ns for f in self.files), default=0)


# One compiled alternation instead of a fnmatch call per pattern per file.
_SECRET_RE = re.compile("|".join(fnmatch.translate(p.lower()) for p in SECRET_FILE_PATTERNS))
_SOURCE_RE = re.compile("|".join(fnmatch.translate(p.lower()) for p in SOURCE_FILE_EXCEPTIONS))


def is_secret_name(name: str) -> bool:
    low = name.lower()
    return _SECRET_RE.match(low) is not None and _SOURCE_RE.match(low) is None


class _Spec:
    """A gitignore spec plus one combined regex that rules out most paths at once
    (checking each pattern separately dominated the walk)."""

    __slots__ = ("any_re", "spec")

    def __init__(self, spec: pathspec.GitIgnoreSpec) -> None:
        self.spec = spec
        parts = [
            "(?:" + regex.pattern.replace("(?P<ps_d>", "(") + ")"
            for p in spec.patterns
            if (regex := getattr(p, "regex", None)) is not None and p.include is not None
        ]
        self.any_re = re.compile("|".join(parts)) if parts else None


# The most of an ignore file read (git's own are a few kilobytes).
MAX_IGNORE_BYTES = 1024 * 1024


def _load_spec(dir_fd: int, *names: str) -> _Spec | None:
    """The patterns of the ignore file ``names`` (folders, then the file) below the folder
    ``dir_fd``: a regular file inside the workspace only. A link (to a file outside, which
    would decide what is indexed) or a FIFO (which would block the run while it holds the
    writer's lock) is not read."""
    try:
        fd = _open_at(dir_fd, names, os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_IGNORE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = data.decode("utf-8", errors="replace").splitlines()
    lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return _Spec(pathspec.GitIgnoreSpec.from_lines(lines)) if lines else None


def _ignored(specs: list[tuple[str, _Spec]], rel: str, is_dir: bool) -> bool:
    # The deepest .gitignore with an opinion wins, as in git (a nested "!x" re-includes).
    for base, sp in reversed(specs):
        sub = rel[len(base) + 1 :] if base else rel
        if is_dir:
            sub += "/"
        if sp.any_re is None or sp.any_re.match(sub) is None:
            continue
        res = sp.spec.check_file(sub)
        if res.include is not None:
            return bool(res.include)
    return False


def _entry_stat(entry: os.DirEntry[str], result: WalkResult) -> os.stat_result | None:
    """The entry's own status (a link's, not its target's), or None, counted as skipped,
    for a name that is not printable or an entry that cannot be read."""
    if not entry.name.isprintable():
        # A line break or control character in a name would break the one-line
        # ``path:start-end`` addresses every answer quotes (and could forge lines of its
        # own in the evidence agents read).
        result.skipped["unprintable_name"] += 1
        return None
    try:
        return entry.stat(follow_symlinks=False)
    except OSError:
        result.skipped["unreadable"] += 1
        return None


# Folders deeper than this below the root are not walked (``too_deep``): real trees are far
# shallower, and the walk recurses once per level.
MAX_DEPTH = 200


class RootOutside(Exception):
    """The folder opened as the root lies outside the caller's workspaces (``within``):
    its name was pointed elsewhere since it was checked."""


def _real_path(fd: int, path: str) -> str:
    """Where the open folder ``fd`` really is: its path as the kernel knows it, or the
    real path of ``path`` when that is still the same folder."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = os.path.realpath(path)
        st, now = os.fstat(fd), os.stat(real)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            raise RootOutside(path) from None
        return real


def walk_workspace(  # noqa: C901 - one branch per kind of entry skipped (link, ignored, secret, too large)
    root: str,
    *,
    max_file_bytes: int = 1024 * 1024,
    skip_secret_files: bool = True,
    extra_ignore: tuple[str, ...] = (),
    within: Callable[[str], bool] | None = None,
) -> WalkResult:
    """All candidate files under ``root`` in sorted order, plus skip counts by reason.

    The root is opened once and every folder below it is read through descriptors opened
    relative to their parent's with ``O_NOFOLLOW``: a folder renamed or swapped for a link
    during the walk is not followed. ``within`` (the caller's scope, given the real path)
    is asked about the folder actually opened, so a root re-pointed since it was checked
    is refused (``RootOutside``)."""
    root = os.path.abspath(root)
    result = WalkResult(root=root)
    try:
        root_fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    except OSError:  # gone or unreadable: nothing to walk, as a folder that cannot be listed
        result.skipped["unreadable"] += 1
        return result
    try:
        if within is not None and not within(_real_path(root_fd, root)):
            raise RootOutside(root)
        st = os.fstat(root_fd)
        result.root_id = (st.st_dev, st.st_ino)
        specs: list[tuple[str, _Spec]] = []
        if extra_ignore:
            specs.append(("", _Spec(pathspec.GitIgnoreSpec.from_lines(list(extra_ignore)))))
        exclude = _load_spec(root_fd, ".git", "info", "exclude")
        if exclude is not None:
            specs.append(("", exclude))

        def descend(dir_fd: int, name: str, rel: str, st: os.stat_result, depth: int) -> None:
            if _ignored(specs, rel, True):
                result.skipped["gitignored"] += 1
                return
            if depth >= MAX_DEPTH:
                result.skipped["too_deep"] += 1
                return
            below = _open_folder(dir_fd, name, st)
            if below is None:
                result.skipped["unreadable"] += 1
                return
            try:
                visit(below, rel, depth + 1)
            finally:
                os.close(below)

        def visit(dir_fd: int, dir_rel: str, depth: int) -> None:
            pushed = False
            gi = _load_spec(dir_fd, ".gitignore")
            if gi is not None:
                specs.append((dir_rel, gi))
                pushed = True
            try:
                entries = sorted(os.scandir(dir_fd), key=lambda e: e.name)
            except OSError:
                result.skipped["unreadable"] += 1
                entries = []
            for entry in entries:
                name = entry.name
                rel = f"{dir_rel}/{name}" if dir_rel else name
                st = _entry_stat(entry, result)
                if st is None:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    # Links may leave the workspace or loop; the target is indexed where it lives.
                    result.skipped["symlink"] += 1
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if name != ".git":
                        descend(dir_fd, name, rel, st, depth)
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if _ignored(specs, rel, False):
                    result.skipped["gitignored"] += 1
                    continue
                if skip_secret_files and is_secret_name(name):
                    result.skipped["secret"] += 1
                    continue
                if st.st_size > max_file_bytes:
                    result.skipped["oversized"] += 1
                    continue
                result.files.append(
                    WalkedFile(rel, os.path.join(root, rel), st.st_size, st.st_mtime_ns)
                )
            if pushed:
                specs.pop()

        visit(root_fd, "", 0)
    finally:
        os.close(root_fd)
    return result


def _open_folder(dir_fd: int, name: str, seen: os.stat_result) -> int | None:
    """The folder ``name`` of ``dir_fd``, not followed if it is a link now, and only if it
    is still the folder the listing saw (a folder swapped since is not entered)."""
    try:
        fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        return None
    return fd


def _open_at(dir_fd: int, names: tuple[str, ...], flags: int = 0) -> int:
    """Open ``names`` (folders, then a file) below the folder ``dir_fd``, each component
    relative to its parent's descriptor with ``O_NOFOLLOW``; ``flags`` are added to the
    last one's."""
    fd = dir_fd
    try:
        for name in names[:-1]:
            below = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            if fd != dir_fd:
                os.close(fd)
            fd = below
        return os.open(names[-1], os.O_RDONLY | _NOFOLLOW | flags, dir_fd=fd)
    finally:
        if fd != dir_fd:
            os.close(fd)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _open_beneath(
    root: str, abspath: str, flags: int = 0, root_id: tuple[int, int] | None = None
) -> int:
    """Open ``abspath`` for reading by walking down from ``root`` one component at a time,
    each opened relative to its parent's descriptor with ``O_NOFOLLOW``: a link at any
    depth (a folder swapped for a link since the walk, not only the last component) is
    not followed, so the file opened is the one inside ``root``. ``flags`` are added to
    the last component's (``O_NONBLOCK``: a FIFO opens without waiting for a writer).
    ``root_id``: the (device, inode) the walk found at ``root``; a different folder under
    that name now (the root re-pointed since) is refused."""
    rel = os.path.relpath(abspath, root)
    parts = rel.split(os.sep)
    if rel == "." or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a path below the root", abspath)
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        if root_id is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != root_id:
                raise OSError(errno.EXDEV, "the root is another folder than the one walked", root)
        return _open_at(fd, tuple(parts), flags)
    finally:
        os.close(fd)


def read_text(
    abspath: str, beneath: str | None = None, root_id: tuple[int, int] | None = None
) -> tuple[str | None, bytes, str]:
    """(text, raw bytes, skip reason). ``text`` is None for binary/undecodable files.

    Walked files are never links, and one made a link since the walk is not followed
    (``O_NOFOLLOW``). With ``beneath`` (the walked root) no folder on the way is followed
    either, and with ``root_id`` (``WalkResult.root_id``) the root must be the folder the
    walk read (:func:`_open_beneath`)."""
    try:
        if beneath is not None:
            fd = _open_beneath(beneath, abspath, os.O_NONBLOCK, root_id)
        else:
            fd = os.open(abspath, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            # Swapped for a FIFO or a device since the walk: not read (it could block
            # the run, or never end).
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None, b"", "unreadable"
            raw = fh.read()
    except OSError:
        return None, b"", "unreadable"
    if b"\x00" in raw[:_SNIFF_BYTES]:
        return None, raw, "binary"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None, raw, "encoding"
    return text, raw, ""
