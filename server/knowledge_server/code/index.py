"""``CodeIndex``: the code lane's public entry point over one ``code.sqlite``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Self

from . import indexer as _indexer
from . import search as _search
from .embed import Embedder, HashingEmbedder
from .model import (
    ChunkRecord,
    CodeHit,
    CodeSearchResult,
    Freshness,
    IndexOptions,
    IndexReport,
    ProgressCallback,
    StopCheck,
)
from .store import BUSY_MS, open_store

__all__ = ["CodeIndex"]


class CodeIndex:
    """Index workspaces and answer "where is it" queries at a committed ``index_rev``.

    One instance owns one connection; use one instance per thread. Several processes
    may open the same file: readers never block on, or see the middle of, a run.
    """

    BUSY_MS = BUSY_MS  # how long the connection waits for another one's lock

    def __init__(
        self, db_path: str, *, embedder: Embedder | None = None, options: IndexOptions | None = None
    ) -> None:
        self.db_path = os.path.abspath(db_path)
        self.embedder: Embedder = embedder if embedder is not None else HashingEmbedder()
        self.options = options or IndexOptions()
        self.conn = open_store(self.db_path)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def index_workspace(
        self,
        root: str,
        *,
        progress_callback: ProgressCallback | None = None,
        embedder: Embedder | None = None,
        options: IndexOptions | None = None,
        vector_progress: ProgressCallback | None = None,
        should_stop: StopCheck | None = None,
        full: bool = False,
        within: Callable[[str], bool] | None = None,
    ) -> IndexReport:
        return _indexer.index_workspace(
            self.conn,
            root,
            embedder=embedder or self.embedder,
            progress_callback=progress_callback,
            options=options or self.options,
            vector_progress=vector_progress,
            should_stop=should_stop,
            full=full,
            within=within,
        )

    def fill_vectors(
        self,
        root: str | None = None,
        *,
        embedder: Embedder | None = None,
        progress_callback: ProgressCallback | None = None,
        should_stop: StopCheck | None = None,
    ) -> int:
        ws = None if root is None else _indexer.normalise_root(root)
        return _indexer.fill_vectors(
            self.conn,
            embedder or self.embedder,
            workspace=ws,
            progress_callback=progress_callback,
            should_stop=should_stop,
        )

    def search(
        self,
        query: str,
        *,
        workspaces: Sequence[str] | None = None,
        path_prefixes: Sequence[str] | None = None,
        limit: int = 10,
        mode: str = "hybrid",
        snippet_chars: int = 300,
        check_fresh: bool = True,
        describe_hits: bool = True,
        intent: str = "",
    ) -> CodeSearchResult:
        """``mode``: "hybrid" (files ranked by code.rank, a semantic embedder's vectors
        voting), "lexical" (the same without vectors) or "vector" (similarity alone).
        ``intent``: the router's (find_code, find_knowledge ...; "knowledge" for a knowledge
        question as the caller stated it), for how file kinds weigh.
        ``describe_hits=False``: hits without snippets and "lex:" explanations (``describe``)."""
        if mode not in ("hybrid", "lexical", "vector"):
            raise ValueError(f"unknown search mode {mode!r}")
        ws = None if workspaces is None else [_indexer.normalise_root(w) for w in workspaces]
        fresh = {}
        if check_fresh:
            roots = (
                ws
                if ws is not None
                else [r[0] for r in self.conn.execute("SELECT root FROM workspaces ORDER BY root")]
            )
            fresh = {r: self.check_freshness(r) for r in roots}
        return _search.search(
            self.conn,
            query,
            embedder=self.embedder,
            workspaces=ws,
            path_prefixes=path_prefixes,
            limit=limit,
            mode=mode,
            snippet_chars=snippet_chars,
            freshness=fresh,
            describe_hits=describe_hits,
            intent=intent,
        )

    def describe(
        self, result: CodeSearchResult, hits: Sequence[CodeHit], snippet_chars: int
    ) -> list[CodeHit]:
        """``hits`` of ``result`` with their snippets and "lex:" explanations."""
        return _search.describe(self.conn, hits, result.terms, result.snippet_terms, snippet_chars)

    def get_chunk(self, chunk_id: str) -> ChunkRecord | None:
        chunk_id = chunk_id.removeprefix("chunk:")
        return _search.get_chunk(self.conn, chunk_id)

    def check_freshness(self, root: str) -> Freshness:
        return _search.check_freshness(
            self.conn,
            _indexer.normalise_root(root),
            db_key=self.db_path,
            options=self.options,
        )

    def current_rev(self, root: str) -> str | None:
        row = self.conn.execute(
            "SELECT r.rev FROM workspaces w JOIN revisions r ON r.id = w.current_rev_id"
            " WHERE w.root = ?",
            (_indexer.normalise_root(root),),
        ).fetchone()
        return None if row is None else str(row[0])

    def indexed_roots(self) -> list[str]:
        """The workspaces that have a current revision, in root order."""
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT root FROM workspaces WHERE current_rev_id IS NOT NULL ORDER BY root"
            )
        ]

    def document_chunks(self, root: str, languages: Sequence[str]) -> tuple[str, list[ChunkRecord]]:
        """The current revision of ``root`` and its chunks whose language is one of
        ``languages`` (compared in lower case), by path and line, read in one transaction;
        ("", []) when ``root`` has no current revision."""
        ws = _indexer.normalise_root(root)
        wanted = sorted({lang.lower() for lang in languages})
        with self.conn:
            row = self.conn.execute(
                "SELECT r.rev FROM workspaces w JOIN revisions r ON r.id = w.current_rev_id"
                " WHERE w.root = ?",
                (ws,),
            ).fetchone()
            if row is None or not wanted:
                return ("", []) if row is None else (str(row[0]), [])
            rev = str(row[0])
            marks = ",".join("?" * len(wanted))
            chunks = [
                ChunkRecord(
                    chunk_id=c[0],
                    workspace=c[1],
                    path=c[2],
                    start_line=int(c[3]),
                    end_line=int(c[4]),
                    source_kind=c[5],
                    symbol=c[6],
                    language=c[7],
                    content_hash=c[8],
                    text=c[9],
                    index_rev=rev,
                )
                for c in self.conn.execute(
                    "SELECT c.chunk_id, c.workspace, c.path, c.start_line, c.end_line,"  # noqa: S608 - only placeholders are interpolated, values bound
                    " c.source_kind, c.symbol, c.language, c.content_hash, c.text"
                    " FROM workspaces w JOIN rev_file rf ON rf.rev_id = w.current_rev_id"
                    " JOIN chunks c ON c.file_id = rf.file_id"
                    f" WHERE w.root = ? AND lower(c.language) IN ({marks})"
                    " ORDER BY c.path, c.start_line, c.chunk_id",
                    (ws, *wanted),
                )
            ]
        return rev, chunks

    def drift(self, root: str) -> list[dict[str, object]]:
        cols = ("rev", "previous_fingerprint", "new_fingerprint", "reason", "created_ns")
        return [
            dict(zip(cols, r, strict=True))
            for r in self.conn.execute(
                "SELECT rev, previous_fingerprint, new_fingerprint, reason, created_ns FROM drift"
                " WHERE workspace = ? ORDER BY id",
                (_indexer.normalise_root(root),),
            )
        ]

    def gc(self, root: str, *, keep: int = 2) -> int:
        return _indexer.gc(self.conn, _indexer.normalise_root(root), keep=keep)
