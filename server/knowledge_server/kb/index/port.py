"""The knowledge base's retrieval index port: what processing writes and retrieval reads.

The index holds chunks of staged and published revisions alike; it does not know which
revisions are visible. The caller decides that: every ``search`` names the revisions it
may see (the organisation's published ones, read from the metadata store), so publishing
is one metadata transaction and a reader never sees a mix or a gap. Whatever the backend
answers, an implementation returns only rows whose organisation is the requested one and
whose revision is in ``revision_ids`` (``recheck``), and rows that carry the requested
tags.

The API is synchronous: callers on the event loop run it in a thread.

Scores: ``IndexHit.score`` is the reciprocal-rank-fusion score of the lexical (BM25) and
vector (cosine) lists, sum of ``1 / (RRF_K + rank)`` over the lists the chunk is in,
ranks from 1; higher is better. ``lexical_rank`` / ``vector_rank`` are the chunk's ranks
in each list, None when it is not in that list or when the backend fused the lists
itself without reporting them (Milvus ``hybrid_search``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from knowledge_server.kb.chunk import Chunk

__all__ = [
    "KINDS",
    "RRF_K",
    "IndexChunk",
    "IndexHit",
    "RetrievalIndex",
    "SearchIndex",
    "index_chunks",
    "recheck",
    "rrf",
    "validate_stage",
]

RRF_K = 60
KINDS = frozenset({"text", "faq"})


@dataclass(frozen=True)
class IndexChunk:
    chunk_id: str  # stable, unique within the organisation: f"{revision_id}:{ordinal}"
    org: str
    topic_id: str
    revision_id: str
    source_id: str
    ordinal: int
    kind: str  # "text" | "faq"
    title: str
    section_path: tuple[str, ...]
    page: int | None
    text: str
    tags: tuple[str, ...]  # tag codes recorded on the revision


@dataclass(frozen=True)
class IndexHit:
    chunk: IndexChunk
    score: float  # fused (RRF) score, higher is better
    lexical_rank: int | None
    vector_rank: int | None


@runtime_checkable
class SearchIndex(Protocol):
    """The read side of the retrieval index: what Retrieve calls."""

    def search(
        self,
        org: str,
        text: str,
        vector: Sequence[float] | None,
        *,
        revision_ids: Collection[str],
        k: int,
        tags: Collection[str] = (),
        any_tags: Collection[str] = (),
        timeout_s: float | None = None,
    ) -> list[IndexHit]:
        """The best ``k`` chunks of ``org`` in ``revision_ids`` for the question ``text``
        (BM25; empty text: no lexical list) and its embedding ``vector`` (None: no vector
        list), fused by RRF. A chunk must carry every tag of ``tags`` and at least one of
        ``any_tags`` when those are given. Never returns another organisation's row or a
        row of a revision not named.

        ``timeout_s``: how long a remote backend may take before the call fails (what
        is left of the caller's budget; None: the backend's own default). An embedded
        backend has nothing to wait for and ignores it."""
        ...


class RetrievalIndex(SearchIndex, Protocol):
    def stage(
        self,
        org: str,
        revision_id: str,
        chunks: Sequence[IndexChunk],
        vectors: Sequence[Sequence[float]],
    ) -> None:
        """Write a revision's chunks with their vectors (one per chunk, in order).
        Idempotent: staging a revision again replaces all its rows."""
        ...

    def drop_revision(self, org: str, revision_id: str) -> int:
        """Remove a revision's rows; returns how many there were (0 the second time)."""
        ...

    def revision_counts(self, org: str | None = None) -> dict[tuple[str, str], int]:
        """(org, revision_id) -> rows, for every revision with rows (of ``org`` only
        when given): what reconcile compares with the metadata store."""
        ...

    def get_chunks(self, org: str, chunk_ids: Collection[str]) -> list[IndexChunk]:
        """The chunks of ``org`` with these ids (unknown ids are left out), in the
        order of ``chunk_ids``."""
        ...

    def warm(self, org: str | None = None, *, wait: bool = False) -> None:
        """Prepare what searches of ``org`` (every organisation when None) hold in this
        process, in the background or, with ``wait``, before returning."""
        ...

    def close(self) -> None: ...


def index_chunks(
    *,
    org: str,
    topic_id: str,
    revision_id: str,
    tags: Sequence[str],
    sources: Iterable[tuple[str, Sequence[Chunk]]],
) -> list[IndexChunk]:
    """The index rows of one revision from its sources' chunks (``(source_id, chunks)``
    in the revision's source order), numbered 0, 1, ... across sources so that
    ``chunk_id`` = ``f"{revision_id}:{ordinal}"`` is unique within the revision."""
    out: list[IndexChunk] = []
    tag_tuple = tuple(tags)
    for source_id, chunks in sources:
        for chunk in chunks:
            n = len(out)
            out.append(
                IndexChunk(
                    chunk_id=f"{revision_id}:{n}",
                    org=org,
                    topic_id=topic_id,
                    revision_id=revision_id,
                    source_id=source_id,
                    ordinal=n,
                    kind=chunk.kind,
                    title=chunk.title,
                    section_path=chunk.section_path,
                    page=chunk.page,
                    text=chunk.text,
                    tags=tag_tuple,
                )
            )
    return out


def validate_stage(
    org: str,
    revision_id: str,
    chunks: Sequence[IndexChunk],
    vectors: Sequence[Sequence[float]],
    dim: int,
) -> None:
    """Refuse a staging call whose rows do not belong to ``(org, revision_id)``, repeat
    a chunk id, name an unknown kind, or whose vectors do not match the chunks."""
    if not org or not revision_id:
        raise ValueError("stage needs an organisation and a revision id")
    if len(vectors) != len(chunks):
        raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
    seen: set[str] = set()
    for chunk, vector in zip(chunks, vectors, strict=True):
        if chunk.org != org or chunk.revision_id != revision_id:
            raise ValueError(
                f"chunk {chunk.chunk_id!r} belongs to another organisation or revision"
            )
        if chunk.chunk_id in seen:
            raise ValueError(f"chunk id {chunk.chunk_id!r} is staged twice")
        seen.add(chunk.chunk_id)
        if chunk.kind not in KINDS:
            raise ValueError(f"chunk {chunk.chunk_id!r} has unknown kind {chunk.kind!r}")
        if len(vector) != dim:
            raise ValueError(f"chunk {chunk.chunk_id!r} has a {len(vector)}-d vector, not {dim}-d")


def rrf(
    lexical: Sequence[str], vector: Sequence[str]
) -> list[tuple[str, float, int | None, int | None]]:
    """Fuse two ranked lists of ids: (id, score, lexical rank, vector rank), best first;
    ties broken by the id so the order is deterministic."""
    ranks: dict[str, list[int | None]] = {}
    for rank, key in enumerate(lexical, 1):
        ranks.setdefault(key, [None, None])[0] = rank
    for rank, key in enumerate(vector, 1):
        ranks.setdefault(key, [None, None])[1] = rank
    fused = [
        (key, sum(1.0 / (RRF_K + r) for r in pair if r is not None), pair[0], pair[1])
        for key, pair in ranks.items()
    ]
    fused.sort(key=lambda item: (-item[1], item[0]))
    return fused


def recheck(
    chunk: IndexChunk,
    org: str,
    revision_ids: Collection[str],
    tags: Collection[str],
    any_tags: Collection[str],
) -> bool:
    """Whether a row the backend returned may be answered: its organisation, revision
    and tags are checked again here, whatever filter the backend was given."""
    if chunk.org != org or chunk.revision_id not in revision_ids:
        return False
    have = set(chunk.tags)
    if any(t not in have for t in tags):
        return False
    return not any_tags or any(t in have for t in any_tags)
