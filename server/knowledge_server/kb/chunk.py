"""Structure-aware chunking of a converted document.

A chunk belongs to one section and one page: it carries the document's title, its
section path (the headings above it, outermost first; a level-1 heading equal to the
title is left out), the page for paged formats, its text and its ordinal (0, 1, ... in
document order). Its ``kind`` is ``faq`` for an FAQ entry and ``text`` otherwise.

Sizes are counted with the service's token rule (``search.coordinator.count_tokens``:
ceil(UTF-8 bytes / 4), the rule answer budgets use). Consecutive text blocks of the same
section and page are packed into one chunk up to ``max_tokens``. When a section goes on
past that, the next chunk starts with the last words of the previous one, up to
``overlap_tokens`` (overlap never crosses a section or page boundary). A single block
over ``max_tokens`` is cut at word boundaries (inside a word only when one word is over
the limit, as in text without spaces), with the same overlap between its pieces.

An FAQ entry is always one chunk, whatever its size (``kb.convert`` bounds entries):
its text is the question on the first line, then the answer.

Deterministic: the same document and settings give the same chunks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from knowledge_server.kb.convert import Block, Document
from knowledge_server.search.coordinator import count_tokens

__all__ = ["Chunk", "ChunkSettings", "chunk_document"]


@dataclass(frozen=True)
class Chunk:
    ordinal: int
    kind: str
    title: str
    section_path: tuple[str, ...]
    page: int | None
    text: str


@dataclass(frozen=True)
class ChunkSettings:
    max_tokens: int = 400
    overlap_tokens: int = 40

    def __post_init__(self) -> None:
        if self.max_tokens < 16:
            raise ValueError("max_tokens must be at least 16")
        if not 0 <= self.overlap_tokens <= self.max_tokens // 2:
            raise ValueError("overlap_tokens must be between 0 and max_tokens / 2")


_PIECE = re.compile(r"\S+\s*")


def _cut_word(word: str, max_bytes: int) -> Iterator[str]:
    """A word longer than ``max_bytes`` in pieces of at most that many UTF-8 bytes."""
    start, size = 0, 0
    for i, ch in enumerate(word):
        n = len(ch.encode("utf-8"))
        if size + n > max_bytes and i > start:
            yield word[start:i]
            start, size = i, 0
        size += n
    if start < len(word):
        yield word[start:]


def _words(text: str, max_bytes: int) -> list[str]:
    out: list[str] = []
    for piece in _PIECE.findall(text):
        if len(piece.encode("utf-8")) > max_bytes:
            out.extend(_cut_word(piece, max_bytes))
        else:
            out.append(piece)
    return out


def _tail(text: str, overlap_tokens: int) -> str:
    """The last whole words of ``text`` within ``overlap_tokens``."""
    if overlap_tokens <= 0:
        return ""
    words = _words(text, overlap_tokens * 4)
    kept: list[str] = []
    size = 0
    for word in reversed(words):
        size += len(word.encode("utf-8"))
        if (size + 3) // 4 > overlap_tokens:
            break
        kept.append(word)
    return "".join(reversed(kept)).strip()


def _split_long(text: str, settings: ChunkSettings) -> Iterator[str]:
    """``text`` (over ``max_tokens``) in pieces within it, consecutive ones overlapping."""
    max_bytes = settings.max_tokens * 4
    words = _words(text, max_bytes // 2)
    piece: list[str] = []
    size = 0
    for word in words:
        n = len(word.encode("utf-8"))
        if piece and size + n > max_bytes:
            body = "".join(piece).strip()
            yield body
            carry = _tail(body, settings.overlap_tokens)
            piece = [carry + " "] if carry else []
            size = len(piece[0].encode("utf-8")) if piece else 0
        piece.append(word)
        size += n
    if piece:
        body = "".join(piece).strip()
        if body:
            yield body


class _Packer:
    """Packs text blocks of one section and page into chunks."""

    def __init__(self, title: str, settings: ChunkSettings) -> None:
        self.title = title
        self.settings = settings
        self.chunks: list[Chunk] = []
        self.parts: list[str] = []
        self.tokens = 0
        self.key: tuple[tuple[str, ...], int | None] = ((), None)
        self.has_new = False  # whether ``parts`` holds more than the overlap carried over

    def _emit(self, kind: str, text: str) -> None:
        section, page = self.key
        self.chunks.append(Chunk(len(self.chunks), kind, self.title, section, page, text))

    def flush(self, *, carry: bool) -> None:
        text = "\n\n".join(self.parts).strip()
        if text and self.has_new:
            self._emit("text", text)
        tail = _tail(text, self.settings.overlap_tokens) if carry and self.has_new else ""
        self.parts = [tail] if tail else []
        self.tokens = count_tokens(tail) if tail else 0
        self.has_new = False

    def add_text(self, key: tuple[tuple[str, ...], int | None], text: str) -> None:
        if key != self.key:
            self.flush(carry=False)
            self.key = key
        size = count_tokens(text)
        if size > self.settings.max_tokens:
            self.flush(carry=False)
            for piece in _split_long(text, self.settings):
                # Each piece already starts with the previous one's tail: what the last
                # flush carries over is only for the block after this one.
                self.parts, self.has_new = [piece], True
                self.flush(carry=True)
            return
        if self.has_new and self.tokens + size + 1 > self.settings.max_tokens:
            self.flush(carry=True)
        if self.parts and self.tokens + size + 1 > self.settings.max_tokens:
            self.parts, self.tokens = [], 0  # the carried overlap does not fit with it
        self.parts.append(text)
        self.tokens += size + 1
        self.has_new = True

    def add_faq(self, key: tuple[tuple[str, ...], int | None], block: Block) -> None:
        self.flush(carry=False)
        self.key = key
        self._emit("faq", f"{block.question}\n{block.text}")


def chunk_document(doc: Document, settings: ChunkSettings | None = None) -> list[Chunk]:
    settings = settings or ChunkSettings()
    packer = _Packer(doc.title, settings)
    headings: list[tuple[int, str]] = []
    for block in doc.blocks:
        if block.kind == "heading":
            headings = [h for h in headings if h[0] < block.level]
            headings.append((block.level, block.text))
            continue
        path = tuple(text for level, text in headings if not (level == 1 and text == doc.title))
        key = (path, block.page)
        if block.kind == "faq":
            packer.add_faq(key, block)
        elif block.text.strip():
            packer.add_text(key, block.text)
    packer.flush(carry=False)
    return packer.chunks
