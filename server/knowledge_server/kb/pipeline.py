"""Conversion and chunking of a revision's sources: the one place the processing task
calls to turn a source into chunks for the retrieval index.

* ``convert_source(source) -> Document``: a stored file through the converters of
  ``kb/convert.py`` (Markdown, plain text, HTML, PDF with pages; Docling Serve when one is
  configured), or an FAQ entry as one FAQ block;
* ``chunk_document(document) -> list[SourceChunk]``: the structured chunker of
  ``kb/chunk.py`` (title, section path, page; an FAQ entry stays one chunk); the task
  numbers a revision's chunks with ``kb.index.port.index_chunks``.

``Chunk`` is the retrieval index's ``IndexChunk`` (``kb/index/port.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from knowledge_server.kb import chunk as chunking
from knowledge_server.kb import convert
from knowledge_server.kb.index.port import IndexChunk
from knowledge_server.redact import redact_counted

__all__ = [
    "SUPPORTED",
    "Chunk",
    "ConversionError",
    "SourceChunk",
    "SourceInput",
    "chunk_document",
    "convert_source",
    "media_type_of",
    "redacted",
]

# File suffix -> media type the local converters read.
SUPPORTED: dict[str, str] = {
    ".md": convert.MARKDOWN,
    ".markdown": convert.MARKDOWN,
    ".txt": convert.PLAIN,
    ".text": convert.PLAIN,
    ".html": convert.HTML,
    ".htm": convert.HTML,
    ".pdf": convert.PDF,
}

# Further types taken only when Docling Serve is configured (it converts them).
DOCLING_ONLY: dict[str, str] = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}

Chunk = IndexChunk
SourceChunk = chunking.Chunk
chunk_document = chunking.chunk_document

# The local converters alone (no Docling Serve): what a caller that names none gets.
LOCAL = convert.Converter()


class ConversionError(Exception):
    """A source could not be converted; ``category`` is what the task records
    (``unsupported_format``, ``unreadable``, ``too_large``, ``converter_timeout``,
    ``converter_unavailable``, ``converter_rejected``)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


# kb.convert's typed errors -> the task's failure categories.
_CATEGORIES: tuple[tuple[type[convert.ConversionError], str], ...] = (
    (convert.UnsupportedMediaType, "unsupported_format"),
    (convert.SourceTooLarge, "too_large"),
    (convert.ConversionMalformed, "unreadable"),
    (convert.ConversionTimeout, "converter_timeout"),
    (convert.ConverterUnavailable, "converter_unavailable"),
    (convert.ConversionRejected, "converter_rejected"),
)


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


def media_type_of(file_name: str, media_type: str = "", *, docling: bool = False) -> str | None:
    """The media type a file is converted as, or None when no converter takes it
    (``docling``: Docling Serve is configured, and takes ``DOCLING_ONLY`` too)."""
    table = {**SUPPORTED, **DOCLING_ONLY} if docling else SUPPORTED
    known = table.get(Path(file_name).suffix.lower())
    if known is not None:
        return known
    declared = media_type.split(";", 1)[0].strip().lower()
    if declared in table.values():
        return declared
    return None


def convert_source(
    source: SourceInput, title: str = "", converter: convert.Converter = LOCAL
) -> convert.Document:
    """``source`` as a structured document (see the module docstring), by ``converter``
    (the server's: its local converters, and Docling Serve when one is configured)."""
    try:
        if source.kind == "faq":
            entry = convert.FaqEntry(source.question, source.answer)
            return converter.convert_faq(title, [entry])
        if source.path is None:
            raise ConversionError("unreadable", "the source has no stored file")
        try:
            data = source.path.read_bytes()
        except OSError as exc:
            raise ConversionError(
                "unreadable", f"source file cannot be read ({exc.errno})"
            ) from None
        return converter.convert(
            convert.Source(
                name=source.file_name, data=data, media_type=source.media_type, title=title
            )
        )
    except convert.ConversionError as exc:
        category = next((c for t, c in _CATEGORIES if isinstance(exc, t)), "unreadable")
        raise ConversionError(category, str(exc)) from None


def redacted(chunks: Iterable[SourceChunk]) -> tuple[list[SourceChunk], int]:
    """``chunks`` with every recognised secret in their text, title and section headings
    replaced by ``[REDACTED:<kind>]`` (``knowledge_server.redact``), and how many were:
    what is embedded, indexed, retrieved and quoted to a model never holds one."""
    out: list[SourceChunk] = []
    count = 0
    for chunk in chunks:
        text, n = redact_counted(chunk.text)
        title, n_title = redact_counted(chunk.title)
        section = []
        for heading in chunk.section_path:
            clean, n_heading = redact_counted(heading)
            section.append(clean)
            n_title += n_heading
        count += n + n_title
        out.append(
            replace(chunk, text=text, title=title, section_path=tuple(section))
            if n or n_title
            else chunk
        )
    return out, count
