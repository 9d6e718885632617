"""Values remembered for one revision of a store (document frequencies, actor facts).

A search path asks ``memo.at(revision)`` for the dictionary of the revision it has just
read, and fills it as it goes. Asking with another revision starts a new dictionary, and
so does growing past ``cap`` entries. Threads may share a memo: the revision and its
dictionary are swapped as one tuple, so a thread that read an older revision only ever
writes into that revision's (discarded) dictionary, never into the current one.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["RevisionMemo"]

K = TypeVar("K")
V = TypeVar("V")


class RevisionMemo(Generic[K, V]):
    def __init__(self, cap: int = 50_000) -> None:
        self._cap = cap
        self._state: tuple[object, dict[K, V]] = (object(), {})

    def at(self, revision: object) -> dict[K, V]:
        current, values = self._state
        if current != revision or len(values) > self._cap:
            values = {}
            self._state = (revision, values)
        return values
