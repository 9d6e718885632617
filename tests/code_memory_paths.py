"""A code search asked both ways, for the tests that compare them: through SQL alone
(``code.memory`` patched out) and from the store's copy in memory, saying whether the
copy answered (``code.search._Held.of`` gave one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from knowledge_server.code import CodeIndex, memory
from knowledge_server.code import search as search_mod


def answers(idx: CodeIndex, q: str, **kw: Any) -> list[tuple[Any, ...]]:
    """Every hit's chunk, place, score, explanation and snippet."""
    res = idx.search(q, check_fresh=False, describe_hits=True, **kw)
    return [(h.chunk_id, h.path, h.start_line, h.score, tuple(h.why), h.snippet) for h in res.hits]


@contextmanager
def copy_answers() -> Iterator[list[bool]]:
    """Records, for each code search made meanwhile (in any thread), whether the copy in
    memory answered it."""
    real = search_mod._Held.of.__func__  # type: ignore[attr-defined]
    used: list[bool] = []

    def counted(cls: type, *a: Any) -> Any:
        held = real(cls, *a)
        used.append(held is not None)
        return held

    with pytest.MonkeyPatch.context() as m:
        m.setattr(search_mod._Held, "of", classmethod(counted))
        yield used


def both_ways(idx: CodeIndex, q: str, **kw: Any) -> tuple[list[Any], list[Any], bool]:
    """(the answer through SQL, the answer with the copy, whether the copy answered)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(memory, "ready", lambda conn, key: None)
        m.setattr(memory, "held", lambda filename: None)
        by_sql = answers(idx, q, **kw)
    with copy_answers() as used:
        got = answers(idx, q, **kw)
    return by_sql, got, used == [True]
