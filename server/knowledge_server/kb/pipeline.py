"""Conversion and chunking of a revision's sources: the one place the processing task
calls to turn a source into chunks for the retrieval index.

Two functions make the interface the task uses:

* ``convert_source(source) -> list[Block]``: a file (or an FAQ entry) as structured
  blocks (headings with their level, text with its page for paged formats, FAQ entries);
* ``chunk_blocks(source, blocks, ...) -> list[Chunk]``: blocks as index chunks with
  title, section path and page; an FAQ entry is one chunk, question and answer together.

Markdown and plain text are converted here. The structured converters (HTML, PDF, Docling
Serve) and the structured chunker live in ``knowledge_server.kb.convert`` and
``knowledge_server.kb.chunk``; they are looked up by name (``importlib``) so this module
works with or without them, and ``SUPPORTED`` grows to the formats they convert.

``Chunk`` has exactly the fields of the retrieval index's ``IndexChunk``
(``kb/index/port.py``); :func:`index_chunk` builds the index's own class when it is
present.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "SUPPORTED",
    "Block",
    "Chunk",
    "ConversionError",
    "SourceInput",
    "chunk_blocks",
    "convert_source",
    "index_chunk",
    "media_type_of",
]

# File suffix -> media type converted here.
SUPPORTED: dict[str, str] = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".txt": "text/plain",
    ".text": "text/plain",
}

# A chunk's text stays below this many characters (a paragraph longer than it is split).
CHUNK_CHARS = 1500


class ConversionError(Exception):
    """A source could not be converted; ``category`` is what the task records
    (``unsupported_format``, ``unreadable``, ``converter_timeout``, ...)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


@dataclass(frozen=True)
class Block:
    """One structural unit of a converted source."""

    kind: str  # "heading" | "text" | "faq"
    text: str
    level: int = 0
    page: int | None = None
    question: str = ""
    answer: str = ""


@dataclass(frozen=True)
class SourceInput:
    """A source as the task hands it to conversion: a stored file or an FAQ entry."""

    source_id: str
    kind: str  # "file" | "faq"
    file_name: str
    media_type: str
    path: Path | None
    question: str = ""
    answer: str = ""


@dataclass(frozen=True)
class Chunk:
    """The fields of the retrieval index's ``IndexChunk``."""

    chunk_id: str
    org: str
    topic_id: str
    revision_id: str
    source_id: str
    ordinal: int
    kind: str
    title: str
    section_path: tuple[str, ...]
    page: int | None
    text: str
    tags: tuple[str, ...]


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None


_PORT = _optional("knowledge_server.kb.index.port")


def index_chunk(chunk: Chunk) -> Any:
    """``chunk`` as the retrieval index's ``IndexChunk`` when that module is present."""
    if _PORT is None:
        return chunk
    return _PORT.IndexChunk(**chunk.__dict__)


def media_type_of(file_name: str, media_type: str = "") -> str | None:
    """The media type a file is converted as, or None when no converter takes it."""
    suffix = Path(file_name).suffix.lower()
    known = SUPPORTED.get(suffix)
    if known is not None:
        return known
    if media_type in SUPPORTED.values():
        return media_type
    return None


_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConversionError("unreadable", f"source file cannot be read ({exc.errno})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConversionError("unreadable", "source file is not UTF-8 text") from None


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _markdown(text: str) -> list[Block]:
    text = _FRONT_MATTER.sub("", text.replace("\r\n", "\n"), count=1)
    blocks: list[Block] = []
    para: list[str] = []
    fence = False

    def flush() -> None:
        if para:
            body = "\n".join(para).strip()
            if body:
                blocks.append(Block("text", body))
            para.clear()

    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
            para.append(line)
            continue
        match = None if fence else _HEADING.match(line)
        if match:
            flush()
            blocks.append(Block("heading", match.group(2), level=len(match.group(1))))
        elif not fence and not line.strip():
            flush()
        else:
            para.append(line)
    flush()
    return blocks


def convert_source(source: SourceInput) -> list[Block]:
    """``source`` as blocks (see the module docstring)."""
    if source.kind == "faq":
        return [Block("faq", "", question=source.question, answer=source.answer)]
    if source.path is None:
        raise ConversionError("unreadable", "the source has no stored file")
    media = media_type_of(source.file_name, source.media_type)
    if media == "text/markdown":
        return _markdown(_read(source.path))
    if media == "text/plain":
        return [Block("text", p) for p in _paragraphs(_read(source.path))]
    raise ConversionError(
        "unsupported_format", f"no converter for {source.media_type or 'this file'}"
    )


def _split(text: str, limit: int) -> list[str]:
    if len(text) <= limit:
        return [text]
    out: list[str] = []
    rest = text
    while len(rest) > limit:
        cut = rest.rfind(" ", 0, limit)
        cut = cut if cut > limit // 2 else limit
        out.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        out.append(rest)
    return out


def chunk_blocks(
    source: SourceInput,
    blocks: Sequence[Block],
    *,
    org: str,
    topic_id: str,
    revision_id: str,
    title: str,
    tags: Sequence[str],
    start: int,
    limit: int = CHUNK_CHARS,
) -> list[Chunk]:
    """Chunks of one source, numbered from ``start`` (ordinals are unique in the
    revision). A chunk never crosses a heading; the section path is the headings above."""
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    doc_title = title
    buf: list[str] = []
    page: int | None = None

    def emit(kind: str, text: str, at_page: int | None) -> None:
        ordinal = start + len(chunks)
        chunks.append(
            Chunk(
                chunk_id=f"{revision_id}:{ordinal}",
                org=org,
                topic_id=topic_id,
                revision_id=revision_id,
                source_id=source.source_id,
                ordinal=ordinal,
                kind=kind,
                title=doc_title,
                section_path=tuple(name for _, name in path),
                page=at_page,
                text=text,
                tags=tuple(tags),
            )
        )

    def flush() -> None:
        if buf:
            for part in _split("\n\n".join(buf), limit):
                emit("text", part, page)
            buf.clear()

    for block in blocks:
        if block.kind == "faq":
            flush()
            emit("faq", f"Q: {block.question}\nA: {block.answer}", block.page)
        elif block.kind == "heading":
            flush()
            while path and path[-1][0] >= block.level:
                path.pop()
            path.append((block.level, block.text))
        else:
            if block.page != page:
                flush()
                page = block.page
            if buf and sum(len(b) for b in buf) + len(block.text) > limit:
                flush()
            buf.append(block.text)
    flush()
    return chunks
