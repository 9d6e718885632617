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
from dataclasses import dataclass, field

import pathspec

from knowledge_server.redact import SECRET_FILE_PATTERNS, SOURCE_FILE_EXCEPTIONS

__all__ = ["WalkResult", "WalkedFile", "is_secret_name", "read_text", "walk_workspace"]

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


def _load_spec(root: str, path: str) -> _Spec | None:
    """The patterns of the ignore file ``path`` below ``root``: a regular file inside the
    workspace only. A link (to a file outside, which would decide what is indexed) or a
    FIFO (which would block the run while it holds the writer's lock) is not read."""
    try:
        fd = _open_beneath(root, path, os.O_NONBLOCK)
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


def walk_workspace(  # noqa: C901 - one branch per kind of entry skipped (link, ignored, secret, too large)
    root: str,
    *,
    max_file_bytes: int = 1024 * 1024,
    skip_secret_files: bool = True,
    extra_ignore: tuple[str, ...] = (),
) -> WalkResult:
    """All candidate files under ``root`` in sorted order, plus skip counts by reason."""
    root = os.path.abspath(root)
    result = WalkResult(root=root)
    specs: list[tuple[str, _Spec]] = []
    if extra_ignore:
        specs.append(("", _Spec(pathspec.GitIgnoreSpec.from_lines(list(extra_ignore)))))
    exclude = _load_spec(root, os.path.join(root, ".git", "info", "exclude"))
    if exclude is not None:
        specs.append(("", exclude))

    def visit(dir_abs: str, dir_rel: str, depth: int) -> None:
        pushed = False
        gi = _load_spec(root, os.path.join(dir_abs, ".gitignore"))
        if gi is not None:
            specs.append((dir_rel, gi))
            pushed = True
        try:
            entries = sorted(os.scandir(dir_abs), key=lambda e: e.name)
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
                if name == ".git":
                    continue
                if _ignored(specs, rel, True):
                    result.skipped["gitignored"] += 1
                    continue
                if depth >= MAX_DEPTH:
                    result.skipped["too_deep"] += 1
                    continue
                visit(entry.path, rel, depth + 1)
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
            result.files.append(WalkedFile(rel, entry.path, st.st_size, st.st_mtime_ns))
        if pushed:
            specs.pop()

    visit(root, "", 0)
    return result


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _open_beneath(root: str, abspath: str, flags: int = 0) -> int:
    """Open ``abspath`` for reading by walking down from ``root`` one component at a time,
    each opened relative to its parent's descriptor with ``O_NOFOLLOW``: a link at any
    depth (a folder swapped for a link since the walk, not only the last component) is
    not followed, so the file opened is the one inside ``root``. ``flags`` are added to
    the last component's (``O_NONBLOCK``: a FIFO opens without waiting for a writer)."""
    rel = os.path.relpath(abspath, root)
    parts = rel.split(os.sep)
    if rel == "." or any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a path below the root", abspath)
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for name in parts[:-1]:
            below = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | flags, dir_fd=fd)
    finally:
        os.close(fd)


def read_text(abspath: str, beneath: str | None = None) -> tuple[str | None, bytes, str]:
    """(text, raw bytes, skip reason). ``text`` is None for binary/undecodable files.

    Walked files are never links, and one made a link since the walk is not followed
    (``O_NOFOLLOW``). With ``beneath`` (the walked root) no folder on the way is followed
    either (:func:`_open_beneath`)."""
    try:
        if beneath is not None:
            fd = _open_beneath(beneath, abspath, os.O_NONBLOCK)
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
