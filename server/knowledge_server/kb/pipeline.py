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


# A private key is the one secret that spans lines, and so may span blocks: a converter
# may join its lines into one paragraph (Markdown), or cut it with a page's footer in
# between (PDF). After a text block that opens a key without closing it, the text blocks
# up to its END line are the key's when that stretch reads as key material (most of its
# characters in long base64 words; a footer or a short last line are a small part) and is
# no longer than a key; without an END line, each next text block that reads as key
# material. A sentence that names a key's first line ("a key file starts with -----BEGIN
# ...-----") is prose, not key material, so the sections after it stay.
_KEY_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_KEY_WORD = re.compile(r"[A-Za-z0-9+/=]{16,}")
_BASE64 = re.compile(r"[A-Za-z0-9+/=]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_KEY_MAX_CHARS = 16_384  # longer than a PEM key of 8,192 bits, encrypted or not
_KEY_REST = "[REDACTED:private-key]"


def _key_word(word: str) -> bool:
    """A long base64 word that is not hexadecimal alone (a commit id, a checksum): a key's
    body mixes cases and digits."""
    return _KEY_WORD.fullmatch(word) is not None and _HEX.fullmatch(word) is None


def _key_like(text: str) -> bool:
    """At least half of ``text``'s characters (spaces aside) are in long base64 words."""
    words = text.split()
    total = sum(len(w) for w in words)
    return total > 0 and 2 * sum(len(w) for w in words if _key_word(w)) >= total


def _key_only(text: str) -> bool:
    """``text`` is base64 words alone, one of them long: the body of a key, nothing else."""
    words = text.split()
    return any(_key_word(w) for w in words) and all(_BASE64.fullmatch(w) for w in words)


def _open_key(text: str) -> tuple[str, bool] | None:
    """What follows the last BEGIN line of ``text`` when no END line closes it, and
    whether that BEGIN line stands on a line of its own (not a sentence naming it)."""
    begins = list(_KEY_BEGIN.finditer(text))
    if not begins or _KEY_END.search(text, begins[-1].end()):
        return None
    begin = begins[-1]
    alone = not text[: begin.start()].rsplit("\n", 1)[-1].strip()
    return text[begin.end() :], alone


def _key_blocks(blocks: tuple[convert.Block, ...], at: int, text: str) -> dict[int, str]:
    """The blocks after ``blocks[at]`` (a text block whose ``text`` opens a key) that are
    the key's, as their redacted text. The stretch to the END line stops at a block that
    is not text or opens a key of its own."""
    found = _open_key(text)
    if found is None:
        return {}
    opened, alone = found
    stretch = [opened]
    size = len(opened)
    for j in range(at + 1, len(blocks)):
        block = blocks[j]
        if block.kind != "text" or size > _KEY_MAX_CHARS:
            break
        end = _KEY_END.search(block.text)
        if _KEY_BEGIN.search(block.text, 0, end.start() if end else len(block.text)):
            break  # another key begins before this one ends: this one was a mention
        if end is not None:
            stretch.append(block.text[: end.start()])
            if not _key_like(" ".join(stretch)):
                break
            out = {k: _KEY_REST for k in range(at + 1, j)}
            out[j] = _KEY_REST + block.text[end.end() :]
            return out
        stretch.append(block.text)
        size += len(block.text)
    out = {}  # no END line near: the next blocks while each is key material alone
    if _key_only(opened) or (alone and not opened.strip()):
        for j in range(at + 1, min(len(blocks), at + 1 + _KEY_MAX_CHARS // 16)):
            if blocks[j].kind != "text" or not _key_only(blocks[j].text):
                break
            out[j] = _KEY_REST
    return out


def redacted(document: convert.Document) -> tuple[convert.Document, int]:
    """``document`` with every secret ``knowledge_server.redact`` recognises in its title,
    headings, text and FAQ entries replaced by ``[REDACTED:<kind>]``, and how many were;
    before chunking, so a secret is whole when it is looked for (chunks cut long ones) and
    counted once (a heading repeats in every chunk of its section). What is embedded,
    indexed, retrieved and quoted to a model never holds one."""
    title, count = redact_counted(document.title)
    blocks = []
    of_key: dict[int, str] = {}  # blocks that are the rest of a key an earlier one began
    for i, block in enumerate(document.blocks):
        text = of_key.get(i, block.text)  # the rest of a key: counted with its BEGIN line
        if block.kind == "text" and text != _KEY_REST:  # what follows an END may open one
            of_key.update(_key_blocks(document.blocks, i, text))
        clean, n = redact_counted(text)
        question, n_question = redact_counted(block.question)
        count += n + n_question
        blocks.append(
            replace(block, text=clean, question=question)
            if clean != block.text or question != block.question
            else block
        )
    return replace(document, title=title, blocks=tuple(blocks)), count
