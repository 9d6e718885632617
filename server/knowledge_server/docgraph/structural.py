"""Structural extraction (no LLM): facts stated explicitly by a document's form.

* YAML front matter (the chunk starting at line 1 with ``---``): ``eip:`` / ``title:`` name the
  document, ``requires:`` lists required documents, ``author:`` persons, ``category:``,
  ``type:``, ``status:`` classify it;
* Markdown links to other Markdown documents (``[text](eip-1559.md)``, ``./other.md``).

Front matter is scanned line by line rather than with a YAML parser because every fact needs the
exact offsets of its value. Each fact's mention is the value (or the whole link) in the text.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter, defaultdict

from ..redact import redact
from .extract import ChunkResult, MentionFact, RelationFact
from .model import DocChunk, norm_name

__all__ = ["STRUCTURAL_VERSION", "document_entities", "extract_structural"]

STRUCTURAL_VERSION = "structural/1"

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):[ \t]*(.*?)[ \t]*$")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
_EIP_FILE = re.compile(r"^(?:eip|erc)-(\d+)\.md$", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_CLASSIFIERS = {
    "category": ("category", "in_category"),
    "type": ("doc_type", "has_type"),
    "status": ("status", "has_status"),
}

Span = tuple[int, int]
DocEntity = tuple[str, str, str, Span]  # name, kind, chunk_id, (char_start, char_end)


def _front_matter_fields(chunk: DocChunk) -> list[tuple[str, str, int]]:
    """``(key, value, value_offset)`` for each ``key: value`` line of a front matter chunk."""
    if chunk.start_line != 1 or not chunk.text.startswith("---"):
        return []
    out = []
    offset = 0
    for line in chunk.text.split("\n"):
        m = _FIELD.match(line)
        if m and m.group(2):
            out.append((m.group(1).lower(), m.group(2), offset + m.start(2)))
        offset += len(line) + 1
    return out


def _split_top_level(value: str) -> list[tuple[str, int]]:
    """Split on commas outside parentheses/angle brackets; returns (part, offset in value)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append((value[start:i], start))
            start = i + 1
    parts.append((value[start:], start))
    out = []
    for part, off in parts:
        stripped = part.strip()
        if stripped:
            out.append((stripped, off + part.index(stripped)))
    return out


def _person_name(part: str) -> str:
    name = re.sub(r"\([^)]*\)|<[^>]*>", "", part)
    return " ".join(name.split())


def document_entities(by_path: dict[str, list[DocChunk]]) -> dict[str, DocEntity]:
    """The entity naming each document: ``eip:`` -> standard, ``title:`` / first heading."""
    docs: dict[str, DocEntity] = {}
    for path, chunks in by_path.items():
        for chunk in chunks:
            for key, value, off in _front_matter_fields(chunk):
                if key == "eip" and value.isdigit():
                    docs[path] = (
                        f"EIP-{value}",
                        "standard",
                        chunk.chunk_id,
                        (off, off + len(value)),
                    )
                    break
                if key == "title" and path not in docs:
                    docs[path] = (value, "document", chunk.chunk_id, (off, off + len(value)))
            if path in docs and docs[path][1] == "standard":
                break
        if path in docs:
            continue
        for chunk in chunks:
            pos = 0
            for line in chunk.text.split("\n"):
                m = _HEADING.match(line)
                if m:
                    docs[path] = (
                        m.group(1),
                        "document",
                        chunk.chunk_id,
                        (pos + m.start(1), pos + m.end(1)),
                    )
                    break
                pos += len(line) + 1
            if path in docs:
                break
    return docs


def extract_structural(chunks: list[DocChunk]) -> ChunkResult:  # noqa: C901 - one branch per front-matter field and link form of the document format
    """Structural facts for a set of document chunks (built_by="structural")."""
    res = ChunkResult()
    c: Counter[str] = res.counters
    by_path: dict[str, list[DocChunk]] = defaultdict(list)
    for ch in sorted(chunks, key=lambda x: (x.path, x.start_line, x.chunk_id)):
        by_path[ch.path].append(ch)
    docs = document_entities(by_path)

    def mention(name: str, kind: str, chunk: DocChunk, span: Span) -> bool:
        if redact(name) != name or not norm_name(name):
            c["structural_rejected"] += 1
            return False
        res.mentions.append(MentionFact(name, kind, chunk.chunk_id, span[0], span[1], "structural"))
        return True

    def relate(
        src: tuple[str, str], dst: tuple[str, str], kind: str, chunk: DocChunk, span: Span
    ) -> None:
        if norm_name(src[0]) == norm_name(dst[0]) and src[1] == dst[1]:
            return
        res.relations.append(
            RelationFact(
                src[0], src[1], dst[0], dst[1], kind, chunk.chunk_id, span[0], span[1], "structural"
            )
        )

    for path, chunks_of in by_path.items():
        doc = docs.get(path)
        if doc is None:
            c["document_without_name"] += 1
        else:
            name, kind, cid, span = doc
            home = next(ch for ch in chunks_of if ch.chunk_id == cid)
            mention(name, kind, home, span)
        doc_key = (doc[0], doc[1]) if doc else None
        for chunk in chunks_of:
            for key, value, off in _front_matter_fields(chunk):
                if doc_key is None:
                    break
                if key == "requires":
                    for part, poff in _split_top_level(value):
                        span = (off + poff, off + poff + len(part))
                        target = (
                            (f"EIP-{part}", "standard") if part.isdigit() else (part, "document")
                        )
                        if mention(target[0], target[1], chunk, span):
                            relate(doc_key, target, "requires", chunk, span)
                elif key == "author":
                    for part, poff in _split_top_level(value):
                        person = _person_name(part)
                        if not person:
                            continue
                        start = off + poff + part.index(person.split(" ")[0])
                        span = (start, start + len(person))
                        if chunk.text[span[0] : span[1]] != person:
                            span = (off + poff, off + poff + len(part))  # odd spacing: whole part
                        if mention(person, "person", chunk, span):
                            relate(doc_key, (person, "person"), "authored_by", chunk, span)
                elif key in _CLASSIFIERS:
                    ekind, rkind = _CLASSIFIERS[key]
                    span = (off, off + len(value))
                    if mention(value, ekind, chunk, span):
                        relate(doc_key, (value, ekind), rkind, chunk, span)
            if doc_key is None:
                continue
            for m in _LINK.finditer(chunk.text):
                target_ref = m.group(2).split("#", 1)[0]
                if not target_ref.lower().endswith(".md") or "://" in target_ref:
                    continue
                target_path = posixpath.normpath(
                    posixpath.join(posixpath.dirname(path), target_ref)
                )
                base = posixpath.basename(target_path)
                eip = _EIP_FILE.match(base)
                if eip:
                    target = (f"EIP-{int(eip.group(1))}", "standard")
                elif target_path in docs:
                    target = (docs[target_path][0], docs[target_path][1])
                else:
                    c["link_target_unknown"] += 1
                    continue
                span = (m.start(), m.end())
                if mention(target[0], target[1], chunk, span):
                    relate(doc_key, target, "links_to", chunk, span)
    c["structural_mentions"] += len(res.mentions)
    c["structural_relations"] += len(res.relations)
    return res
