"""Value types of the code lane (plain dataclasses, no storage logic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

SourceKind = Literal["symbol", "section", "window"]
Capability = Literal["full", "degraded"]

ProgressCallback = Callable[[int, int, str], None]
"""(done, total, relative_path): once per walked file while indexing; once per embedded
batch while filling vectors (done/total chunks, path empty)."""

StopCheck = Callable[[], bool]
"""True once the run should stop (the server is shutting down)."""


class IndexInterrupted(Exception):
    """An indexing run stopped because it was asked to (``StopCheck``). What it committed
    stays: the new revision, if it was made, with the vectors embedded so far; the rest
    are counted as missing and filled by the next run."""


@dataclass(frozen=True, slots=True)
class IndexOptions:
    """Tunables of one indexing run. Defaults suit a typical source repository."""

    max_file_bytes: int = 1024 * 1024
    skip_secret_files: bool = True
    # Extra gitignore-style patterns applied at the workspace root (e.g. "site-packages/").
    extra_ignore: tuple[str, ...] = ()
    window_lines: int = 60
    window_overlap: int = 10
    # A class longer than this (lines or characters) is split into its members.
    max_symbol_lines: int = 150
    max_symbol_chars: int = 12_000
    # Markdown sections larger than this are cut into windows.
    max_section_lines: int = 120
    # Files whose chunks are written per transaction. Fewer, larger transactions give FTS5
    # fewer segments to merge; a crash loses at most this much work (never the revision).
    batch_files: int = 1000
    # Embed new chunks right after the lexical commit (False: call fill_vectors() later).
    fill_vectors: bool = True
    # Processes that read, chunk and tokenise files (0 = one per CPU, at most 4). Small
    # runs (few changed files) always stay in-process: a pool costs more than it saves.
    workers: int = 0
    # Older revisions kept (with their rows) after a successful commit.
    keep_revisions: int = 2


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrievable unit of a file, text already redacted."""

    chunk_id: str
    path: str
    start_line: int
    end_line: int
    source_kind: SourceKind
    symbol: str
    language: str
    content_hash: str
    text: str


@dataclass(slots=True)
class IndexReport:
    workspace: str
    index_rev: str
    fingerprint: str
    files_seen: int = 0
    files_indexed: int = 0
    files_reused: int = 0
    files_skipped: dict[str, int] = field(default_factory=dict)
    chunks: int = 0
    chunks_new: int = 0
    parse_fallbacks: dict[str, int] = field(default_factory=dict)
    drift_written: bool = False
    unchanged: bool = False
    vectors_embedded: int = 0
    vectors_missing: int = 0
    # Why vectors could not be filled (the provider failed after its retries), else "".
    vectors_error: str = ""
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Freshness:
    stale: bool
    verified_by: str = "mtime"
    index_rev: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CodeHit:
    id: str
    chunk_id: str
    workspace: str
    path: str
    start_line: int
    end_line: int
    source_kind: str
    symbol: str
    language: str
    score: float
    why: list[str]
    snippet: str
    index_rev: str
    provenance: str = "stated"
    # The chunk's row in the store, and whether the lexical lane found it: what
    # ``code.search.describe`` needs to add the snippet and the "lex:" explanation later.
    row_id: int = 0
    lexical: bool = False


@dataclass(frozen=True, slots=True)
class CodeSearchResult:
    # One workspace: its revision; several: "root=rev" pairs joined by ";".
    index_rev: str
    capability: Capability
    degradation_reason: str
    freshness: dict[str, Freshness]
    hits: list[CodeHit]
    # Query terms: all of them (for "lex:" explanations), and the ones snippets centre on.
    terms: tuple[str, ...] = ()
    snippet_terms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    chunk_id: str
    workspace: str
    path: str
    start_line: int
    end_line: int
    source_kind: str
    symbol: str
    language: str
    content_hash: str
    text: str
    index_rev: str
