"""Skill catalog: ``SKILL.md`` files with a YAML front matter (``name``, ``description``,
optional ``when_to_use`` / ``whenToUse``) found recursively under a list of root folders.

Loading is tolerant: a file whose front matter is missing or malformed is reported as a
:class:`CatalogProblem` (path + reason) and skipped; it never stops the catalog.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from ..plain import printable
from ..redact import redact
from ..regular import NotRegularFile, TooLarge, read_regular
from ..workspaces import is_under

SKILL_FILE = "SKILL.md"
# A skill folder is small; a huge SKILL.md is more likely an accident than a skill.
MAX_SKILL_BYTES = 1_000_000
# Folders never worth descending into while looking for skills.
_SKIP_DIRS = {".git", "node_modules", "__pycache__", ".venv", "venv"}


@dataclass(slots=True, frozen=True)
class Skill:
    name: str
    path: str
    description: str
    when_to_use: str | None
    content_hash: str


@dataclass(slots=True, frozen=True)
class CatalogProblem:
    path: str
    reason: str


@dataclass(slots=True)
class Catalog:
    skills: list[Skill] = field(default_factory=list)
    problems: list[CatalogProblem] = field(default_factory=list)

    def by_name(self) -> dict[str, Skill]:
        """One skill per name (the first in path order): which names are skills. Two
        roots may each hold a skill of one name; ``skills`` lists both."""
        out: dict[str, Skill] = {}
        for s in sorted(self.skills, key=lambda s: (s.name, s.path)):
            out.setdefault(s.name, s)
        return out

    def by_path(self) -> dict[str, str]:
        """Each skill's name by its normalised path: which skill a read file is."""
        return {os.path.normpath(s.path): s.name for s in self.skills}

    def fingerprint(self) -> str:
        """Changes whenever a skill file is added, removed or edited."""
        h = hashlib.sha256()
        for s in sorted(self.skills, key=lambda s: (s.name, s.path)):
            h.update(f"{s.name}\0{s.path}\0{s.content_hash}\n".encode())
        return "sha256:" + h.hexdigest()


def default_roots(workspaces: Sequence[str] = ()) -> list[str]:
    """``~/.claude/skills`` (honouring ``CLAUDE_CONFIG_DIR``) plus ``<workspace>/.claude/skills``."""
    base = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")
    roots = [os.path.join(base, "skills")]
    roots.extend(os.path.join(w, ".claude", "skills") for w in workspaces)
    return roots


def content_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _front_matter(text: str) -> tuple[dict[str, object] | None, str]:
    """The parsed front matter, or ``None`` and the reason it cannot be used."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None, "no front matter (the file must start with '---')"
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            block = "\n".join(lines[1:i])
            break
    else:
        return None, "front matter is not closed by '---'"
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        return None, f"front matter is not valid YAML{where}"
    except (ValueError, RecursionError, OverflowError):
        # A value the YAML types refuse (``updated: 2024-02-30``, ``!!int abc``) or nesting
        # past the stack: one file's problem, never the whole catalog's.
        return None, "front matter holds a value YAML cannot read"
    if not isinstance(data, dict):
        return None, "front matter is not a mapping"
    return data, ""


# Most items of a list a text field may be written as (``description: [a, b]``).
_MAX_TEXT_ITEMS = 64


def _text(value: object) -> str | None:
    """A text field: a string, a number or a short list of them. Anything else (a mapping,
    nested lists, aliases that multiply a value a billion times once written out) is no
    text: None, and the file is reported."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) > _MAX_TEXT_ITEMS or not all(
            isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value
        ):
            return None
        value = "\n".join(str(v) for v in value)
    elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return None
    out = str(value).strip()
    return out or None


# A skill's name is an identifier agents and hand-off packages quote: letters, digits and a
# few joiners ("pdf-processing", "plugin:skill"), never braces, quotes, slashes or line breaks.
_NAME = re.compile(r"[\w.:@+-]+")


def load_skill(path: str | os.PathLike[str]) -> Skill | CatalogProblem:
    p = str(path)
    try:
        data = read_regular(p, MAX_SKILL_BYTES)
    except TooLarge as exc:
        return CatalogProblem(p, f"file too large ({exc.size} bytes)")
    except NotRegularFile:
        return CatalogProblem(p, "not a regular file")
    except OSError as exc:
        return CatalogProblem(p, f"unreadable ({type(exc).__name__})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return CatalogProblem(p, "not UTF-8")
    fm, reason = _front_matter(text)
    if fm is None:
        return CatalogProblem(p, reason)
    name = _text(fm.get("name"))
    if not name:
        return CatalogProblem(p, "front matter has no 'name'")
    if not _NAME.fullmatch(name) or len(name) > 200:
        return CatalogProblem(
            p, "'name' must be one short token of letters, digits and - _ . : @ +"
        )
    description = _text(fm.get("description"))
    if not description:
        return CatalogProblem(p, "front matter has no 'description'")
    when = _text(fm.get("when_to_use", fm.get("whenToUse")))
    # Untrusted text, shown by every client (an SDK's caller prints it as it comes): a
    # control character (an escape that moves a terminal's cursor or hides text) is kept
    # as its escape, ``\x1b``; line breaks and tabs stay.
    return Skill(
        name=name,
        path=os.path.abspath(p),
        description=printable(redact(description), lines=True),
        when_to_use=printable(redact(when), lines=True) if when else None,
        content_hash=content_hash(data),
    )


def _walk(root: str) -> Iterable[str]:
    if os.path.isfile(root):
        if os.path.basename(root) == SKILL_FILE:
            yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        if SKILL_FILE in filenames:
            yield os.path.join(dirpath, SKILL_FILE)


def load_catalog(roots: Sequence[str | os.PathLike[str]] | None = None) -> Catalog:
    """Every ``SKILL.md`` under ``roots`` (missing roots are simply empty).

    A name is unique within one root: when two files under one root declare it, the
    first path in sorted order wins and the other is reported. Two roots (two workspaces'
    ``.claude/skills``, or a workspace's and ``~/.claude/skills``) may each hold a skill of
    one name: both are kept, each seen by the callers whose scope holds its file, so one
    tenant's catalog never hides another's skill.
    """
    cat = Catalog()
    visited: set[str] = set()
    for root in roots if roots is not None else default_roots():
        r = os.path.abspath(os.path.expanduser(str(root)))
        if not os.path.exists(r):
            continue
        real_root = os.path.realpath(r)
        seen: dict[str, str] = {}
        for path in _walk(r):
            real = os.path.realpath(path)
            if not is_under(real, real_root):
                # Folder links are not followed (``_walk``), nor is a file link leaving its
                # root: its skill would be listed under a path (a workspace) it is not in.
                cat.problems.append(CatalogProblem(path, "a link to a file outside its root"))
                continue
            if real in visited:
                continue
            visited.add(real)
            got = load_skill(path)
            if isinstance(got, Skill):
                # Listed under the path it really lies in: a root that is itself a link
                # (a workspace's skills folder pointing into another tenant's) names the
                # workspace the file is in, not the one the link is in.
                got = replace(got, path=real)
            if isinstance(got, CatalogProblem):
                cat.problems.append(got)
            elif got.name in seen:
                cat.problems.append(
                    CatalogProblem(
                        got.path, f"duplicate skill name {got.name!r} (kept {seen[got.name]})"
                    )
                )
            else:
                seen[got.name] = got.path
                cat.skills.append(got)
    cat.skills.sort(key=lambda s: s.name)
    return cat


def skill_name_from_path(
    path: str, catalog: dict[str, Skill], paths: dict[str, str] | None = None
) -> str | None:
    """The skill a ``.../SKILL.md`` path refers to: catalog path match (``paths``, the
    catalog's ``by_path()``, holds every skill where ``catalog`` has one per name), else
    folder name."""
    if not path or os.path.basename(path.replace("\\", "/")) != SKILL_FILE:
        return None
    norm = os.path.normpath(path)
    if paths is None:
        paths = {os.path.normpath(s.path): s.name for s in catalog.values()}
    if norm in paths:
        return paths[norm]
    folder = Path(path.replace("\\", "/")).parent.name
    return folder or None


__all__ = [
    "SKILL_FILE",
    "Catalog",
    "CatalogProblem",
    "Skill",
    "content_hash",
    "default_roots",
    "load_catalog",
    "load_skill",
    "skill_name_from_path",
]
