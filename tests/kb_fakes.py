"""A minimal in-memory stand-in for the knowledge base's retrieval index port
(``RetrievalIndex`` in ``knowledge_server/kb/index/port.py``), for tests of the metadata,
the workflow and the PROCESS queue until they run against the real implementations.

It keeps the port's contract as far as these tests rely on it (and the port's own
contract suite keeps the real implementations to the same): ``stage`` is an idempotent
replace of one revision's chunks, ``drop_revision`` answers how many it removed,
``revision_counts`` counts chunks per ``(org, revision_id)``, ``search`` returns only
chunks of the organisation and of the revision ids the caller passes (scored by shared
words), ``get_chunks`` only the organisation's. With ``path`` it is saved to a JSON file
after every write and read back on open, so a test can kill a server process and find
what was staged before.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FakeHit:
    chunk: Any
    score: float
    lexical_rank: int | None
    vector_rank: int | None


@dataclass(frozen=True)
class StoredChunk:
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


class MemoryIndex:
    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._path = path
        self._chunks: dict[tuple[str, str], list[StoredChunk]] = {}
        self.stage_calls = 0
        if path is not None and path.exists():
            for row in json.loads(path.read_text()):
                c = StoredChunk(
                    **{
                        **row,
                        "section_path": tuple(row["section_path"]),
                        "tags": tuple(row["tags"]),
                    }
                )
                self._chunks.setdefault((c.org, c.revision_id), []).append(c)

    def _save(self) -> None:
        if self._path is None:
            return
        rows = [c.__dict__ for chunks in self._chunks.values() for c in chunks]
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self._path)

    def stage(
        self, org: str, revision_id: str, chunks: Sequence[Any], vectors: Sequence[Sequence[float]]
    ) -> None:
        if len(chunks) != len(vectors):
            raise ValueError("one vector per chunk")
        stored = []
        for c in chunks:
            if c.org != org or c.revision_id != revision_id:
                raise ValueError("chunk of another org or revision")
            stored.append(
                StoredChunk(**{k: getattr(c, k) for k in StoredChunk.__dataclass_fields__})
            )
        with self._lock:
            self.stage_calls += 1
            self._chunks[(org, revision_id)] = stored
            self._save()

    def drop_revision(self, org: str, revision_id: str) -> int:
        with self._lock:
            n = len(self._chunks.pop((org, revision_id), []))
            self._save()
            return n

    def search(
        self,
        org: str,
        text: str,
        vector: Sequence[float] | None,
        *,
        revision_ids: Collection[str],
        k: int,
        tags: Collection[str] = (),
    ) -> list[FakeHit]:
        words = set(text.lower().split())
        scored = []
        with self._lock:
            for (c_org, rev), chunks in self._chunks.items():
                if c_org != org or rev not in revision_ids:
                    continue
                for c in chunks:
                    if tags and not set(tags) & set(c.tags):
                        continue
                    score = len(words & set(c.text.lower().split()))
                    if score:
                        scored.append((score, c))
        scored.sort(key=lambda sc: (-sc[0], sc[1].chunk_id))
        return [FakeHit(c, float(s), i + 1, None) for i, (s, c) in enumerate(scored[:k])]

    def revision_counts(self, org: str | None = None) -> dict[tuple[str, str], int]:
        with self._lock:
            return {key: len(v) for key, v in self._chunks.items() if org is None or key[0] == org}

    def get_chunks(self, org: str, chunk_ids: Collection[str]) -> list[StoredChunk]:
        wanted = set(chunk_ids)
        with self._lock:
            return [
                c
                for (c_org, _), cs in self._chunks.items()
                if c_org == org
                for c in cs
                if c.chunk_id in wanted
            ]

    def warm(self, org: str | None = None, *, wait: bool = False) -> None:
        """Nothing to prepare."""

    def close(self) -> None:
        pass
