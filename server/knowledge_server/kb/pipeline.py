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

import re
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


# A private key is the one secret that spans lines, and so may span blocks (a PDF's lines,
# a key cut by a page): the blocks after one that opens a key without closing it are the
# key's while they hold key material alone (base64 lines, PEM header fields), up to its END
# line. A text that only names the BEGIN line ("a key file starts with -----BEGIN ...-----;
# never paste it") opens nothing, and a block that is not key material ends the key.
_KEY_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_LINE = re.compile(r"[A-Za-z0-9+/=]{8,}|[A-Za-z][A-Za-z-]*: .*")
_KEY_REST = "[REDACTED:private-key]"


def _key_material(text: str) -> bool:
    """Every line of ``text`` is a line of a key's body (blank lines aside)."""
    return all(_KEY_LINE.fullmatch(line.strip()) for line in text.splitlines() if line.strip())


def _opens_key(text: str) -> bool:
    """``text`` begins a private key that it does not end, and holds key material alone
    after its BEGIN line."""
    begins = list(_KEY_BEGIN.finditer(text))
    if not begins or _KEY_END.search(text, begins[-1].end()):
        return False
    return _key_material(text[begins[-1].end() :])


def redacted(document: convert.Document) -> tuple[convert.Document, int]:
    """``document`` with every secret ``knowledge_server.redact`` recognises in its title,
    headings, text and FAQ entries replaced by ``[REDACTED:<kind>]``, and how many were;
    before chunking, so a secret is whole when it is looked for (chunks cut long ones) and
    counted once (a heading repeats in every chunk of its section). What is embedded,
    indexed, retrieved and quoted to a model never holds one."""
    title, count = redact_counted(document.title)
    blocks = []
    in_key = False
    for block in document.blocks:
        text = block.text
        if in_key and block.kind == "text":  # the rest of a key an earlier block began
            end = _KEY_END.search(text)
            if end is not None and _key_material(text[: end.start()]):
                text = _KEY_REST + text[end.end() :]  # counted with its BEGIN line
                in_key = False
            elif end is None and _key_material(text):
                text = _KEY_REST
            else:
                in_key = False
        else:
            in_key = False
        if not in_key:
            in_key = block.kind == "text" and _opens_key(text)
        clean, n = redact_counted(text)
        question, n_question = redact_counted(block.question)
        count += n + n_question
        blocks.append(
            replace(block, text=clean, question=question)
            if clean != block.text or question != block.question
            else block
        )
    return replace(document, title=title, blocks=tuple(blocks)), count
