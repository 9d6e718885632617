"""Input type, vocabularies and deterministic identifiers of the document graph.

The graph never stores corpus text: facts point at a chunk (``chunk_id``, ``path``, lines) and
carry a hash of the quoted span plus its offsets inside the chunk. Identifiers are pure functions
of their inputs so two machines building from the same chunks agree byte for byte.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENTITY_KINDS",
    "NON_CODE_SOURCE_KINDS",
    "RELATION_KINDS",
    "STRUCTURAL_ENTITY_KINDS",
    "STRUCTURAL_RELATION_KINDS",
    "DocChunk",
    "chunk_markdown_file",
    "entity_id_for",
    "is_doc_chunk",
    "line_span",
    "norm_name",
    "quote_hash",
    "rel_id_for",
    "theme_id_for",
]

# Kinds the LLM may emit. Anything else is rejected and counted (``unknown_kind``).
ENTITY_KINDS: frozenset[str] = frozenset(
    {
        "concept",
        "standard",
        "component",
        "person",
        "organisation",
        "parameter",
        "operation",
        "data_structure",
    }
)
RELATION_KINDS: frozenset[str] = frozenset(
    {"requires", "extends", "replaces", "defines", "uses", "related_to"}
)
# Kinds only the structural extractor produces (front matter fields, links, document form).
STRUCTURAL_ENTITY_KINDS: frozenset[str] = frozenset(
    {
        "document",
        "category",
        "status",
        "doc_type",
        "section",
        "term",
        "identifier",
        "reference",
        "table_column",
    }
)
STRUCTURAL_RELATION_KINDS: frozenset[str] = frozenset(
    {
        "requires",
        "authored_by",
        "in_category",
        "has_status",
        "has_type",
        "links_to",
        "has_section",
        "defines",
        "cites",
        "references",
        "must",
        "must_not",
        "should",
        "should_not",
        "may",
    }
)

NON_CODE_SOURCE_KINDS: frozenset[str] = frozenset(
    {"doc", "docs", "document", "markdown", "text", "prose"}
)
_NON_CODE_LANGUAGES = frozenset({"markdown", "md", "text", "txt", "rst", "asciidoc", "org"})


@dataclass(frozen=True, slots=True)
class DocChunk:
    """One addressable piece of a document.

    ``text`` is the chunk's exact text; line ``start_line`` is its first line (1-based) and
    ``end_line`` its last, so the line of any character offset is derivable.
    """

    chunk_id: str
    path: str
    start_line: int
    end_line: int
    text: str
    language: str
    source_kind: str
    content_hash: str


def is_doc_chunk(chunk: DocChunk) -> bool:
    """True for non-code chunks; the graph never extracts from code."""
    return (
        chunk.source_kind.lower() in NON_CODE_SOURCE_KINDS
        or chunk.language.lower() in _NON_CODE_LANGUAGES
    )


_WS = re.compile(r"\s+")
_EDGE_PUNCT = " \t\r\n.,;:!?\"'`()[]{}<>*_"


def norm_name(name: str) -> str:
    """Lower-case, collapse whitespace, trim edge punctuation: the merge key of an entity."""
    return _WS.sub(" ", name).strip(_EDGE_PUNCT).lower()


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def entity_id_for(norm: str, kind: str) -> str:
    return _sha1(norm + "|" + kind)


def theme_id_for(seed_entity_id: str, member_ids: list[str] | tuple[str, ...] | set[str]) -> str:
    return _sha1(seed_entity_id + "|" + ",".join(sorted(member_ids)))


def rel_id_for(src_entity_id: str, kind: str, dst_entity_id: str) -> str:
    return _sha1(src_entity_id + "|" + kind + "|" + dst_entity_id)


def quote_hash(text: str) -> str:
    """Hash of a quoted span: proves which text a fact cites without copying it."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def line_span(chunk: DocChunk, char_start: int, char_end: int) -> tuple[int, int]:
    """File lines covered by ``chunk.text[char_start:char_end]``."""
    start = chunk.start_line + chunk.text.count("\n", 0, char_start)
    end = chunk.start_line + chunk.text.count("\n", 0, max(char_start, char_end - 1))
    return start, end


# --- a small Markdown chunker (heading sections) for tests, demos and the report -------------

_HEADING = re.compile(r"^#{1,6}\s")
_FENCE = re.compile(r"^\s*(```|~~~)")
MAX_SECTION_LINES = 80


def _make_chunk(relpath: str, start: int, lines: list[str]) -> DocChunk:
    text = "\n".join(lines)
    digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
    end = start + len(lines) - 1
    cid = "doc:" + _sha1(f"{relpath}:{start}:{end}:{digest}")[:20]
    return DocChunk(cid, relpath, start, end, text, "markdown", "doc", digest)


def chunk_markdown_file(root: str | Path, relpath: str) -> list[DocChunk]:
    """Split a Markdown file into front matter + heading sections (long ones in windows).

    Headings inside fenced code blocks do not start a section. Blank-only sections are dropped.
    """
    raw = (Path(root) / relpath).read_text(encoding="utf-8", errors="replace")
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sections: list[tuple[int, list[str]]] = []  # (first line number, lines)
    i = 0
    if lines and lines[0].strip() == "---":
        for j in range(1, len(lines)):
            if lines[j].strip() == "---":
                sections.append((1, lines[: j + 1]))
                i = j + 1
                break
    current: list[str] = []
    current_start = i + 1
    in_fence = False
    for k in range(i, len(lines)):
        line = lines[k]
        if _FENCE.match(line):
            in_fence = not in_fence
        if not in_fence and _HEADING.match(line) and current:
            sections.append((current_start, current))
            current, current_start = [], k + 1
        current.append(line)
    if current:
        sections.append((current_start, current))
    chunks: list[DocChunk] = []
    for start, sec in sections:
        for off in range(0, len(sec), MAX_SECTION_LINES):
            window = sec[off : off + MAX_SECTION_LINES]
            # Trim trailing blank lines so end_line points at real text.
            while window and not window[-1].strip():
                window = window[:-1]
            if window and any(w.strip() for w in window):
                chunks.append(_make_chunk(relpath, start + off, window))
    return chunks
