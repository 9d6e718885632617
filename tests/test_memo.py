"""RevisionMemo: values remembered for one revision only (document frequencies, actor facts)."""

from __future__ import annotations

from knowledge_server.memo import RevisionMemo


def test_values_belong_to_their_revision_and_the_cap_bounds_them() -> None:
    memo: RevisionMemo[str, int] = RevisionMemo(cap=3)
    first = memo.at("rev-1")
    first["a"] = 1
    assert memo.at("rev-1") == {"a": 1}
    assert memo.at("rev-2") == {}  # another revision starts afresh
    older = first
    older["stale"] = 9  # a thread still holding the old revision's values
    assert "stale" not in memo.at("rev-2")
    current = memo.at("rev-2")
    current.update(b=1, c=2, d=3, e=4)
    assert memo.at("rev-2") == {}  # past the cap: emptied, not grown without bound
