"""The workspace rule in SQL (``under_sql``) and the episodes lane's scoped reads.

Isolation: a principal scoped to a root sees sessions at or under that root, in the
same way ``is_under`` decides it in Python, character for character (paths are case
sensitive). Cost: the rule is a range an index answers, and the session ranges of a
scope are merged in O(n log n)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import apsw
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.episodes import EpisodeStore, ingest
from knowledge_server.episodes.store import _merge_ranges
from knowledge_server.workspaces import is_under, under_sql

# Path pieces that stress LIKE-style matching: wildcards, escapes, case, the characters
# next to "/" in byte order, non-ASCII.
_PIECES = st.sampled_from(["a", "A", "b", "%", "_", "\\", ".", "-", "0", "é", "É", "x y", "🙂"])
_NAMES = st.lists(_PIECES, min_size=1, max_size=3).map("".join)
_PATHS = st.lists(_NAMES, max_size=4).map(lambda parts: "/" + "/".join(parts))


@settings(max_examples=400, deadline=None)
@given(roots=st.lists(_PATHS, min_size=1, max_size=3), paths=st.lists(_PATHS, max_size=8))
def test_under_sql_is_is_under(roots: list[str], paths: list[str]) -> None:
    """Isolation invariant: the SQL filter admits exactly the paths ``is_under`` admits."""
    roots = [os.path.normpath(r) for r in roots]
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE s(cwd TEXT)")
    conn.execute("CREATE INDEX s_cwd ON s(cwd)")
    for p in paths:
        conn.execute("INSERT INTO s VALUES(?)", (p,))
    cond, args = under_sql("cwd", roots)
    got = sorted(r[0] for r in conn.execute(f"SELECT cwd FROM s WHERE {cond}", args))
    want = sorted(p for p in paths if any(is_under(p, r) for r in roots))
    assert got == want


def test_under_sql_is_case_sensitive_and_literal() -> None:
    """LIKE ignored ASCII case and needed escaping: "/srv/A" is not under "/srv/a", and
    "_" or "%" in a root match only themselves."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE s(cwd TEXT)")
    paths = ["/srv/a", "/srv/a/x", "/srv/A/x", "/SRV/a", "/srv/ab", "/srv/a_b/x", "/srv/axb/x", "/"]
    for p in paths:
        conn.execute("INSERT INTO s VALUES(?)", (p,))

    def under(*roots: str) -> list[str]:
        cond, args = under_sql("cwd", roots)
        return sorted(r[0] for r in conn.execute(f"SELECT cwd FROM s WHERE {cond}", args))

    assert under("/srv/a") == ["/srv/a", "/srv/a/x"]
    assert under("/srv/a_b") == ["/srv/a_b/x"]
    assert under("/") == sorted(paths)


def _greedy(ranges: list[list[int]], most: int) -> list[tuple[int, int]]:
    """The reference: close the smallest gap (the first of equal ones) until few enough."""
    ranges = [list(r) for r in ranges]
    while len(ranges) > most:
        _, i = min((ranges[i + 1][0] - ranges[i][1], i) for i in range(len(ranges) - 1))
        ranges[i][1] = ranges[i + 1][1]
        del ranges[i + 1]
    return [(lo, hi) for lo, hi in ranges]


@settings(max_examples=500, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(2, 6), st.integers(0, 5)), max_size=60),
    most=st.integers(1, 12),
)
def test_range_merge_equals_closing_smallest_gaps(steps: list[tuple[int, int]], most: int) -> None:
    ranges, pos = [], 0
    for gap, width in steps:  # few distinct gaps: many ties
        ranges.append([pos + gap, pos + gap + width])
        pos += gap + width
    assert _merge_ranges(ranges, most) == _greedy(ranges, most)


def test_scoped_episode_search_reads_only_its_sessions(tmp_path: Path) -> None:
    """A scope of two sessions among 301 others: the search reads them through the cwd
    index (SQLite virtual-machine steps, counted: deterministic), not by scanning every
    session's cwd, and finds only theirs, not those of a path that differs in case."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for s in range(303):
        # s302 differs from the scope only in case: not under it (LIKE said it was).
        cwd = "/work/mine" if s < 2 else ("/WORK/mine/x" if s == 302 else f"/work/other{s:03d}")
        for i in range(3):
            lines.append(
                json.dumps(
                    {
                        "session_id": f"s{s:03d}",
                        "seq": i,
                        "time": f"2026-01-01T00:00:{i:02d}Z",
                        "role": "user",
                        "text": f"rotate the session cookie step {i}",
                        "cwd": cwd,
                    }
                )
            )
    (logs / "all.jsonl").write_text("\n".join(lines) + "\n")
    store = EpisodeStore(str(tmp_path / "db"))
    try:
        assert not ingest(store, [str(logs)]).errors
        steps = [0]

        def count() -> bool:
            steps[0] += 1
            return False

        store.conn.setprogresshandler(count, 100)
        hits = store.search("cookie", k=10, workspaces=["/work/mine"])
        assert {h.session_id for h in hits} == {"s000", "s001"}
        # 4 here; scanning every cwd with LIKE took 40 (and grows with the sessions).
        assert steps[0] <= 12, steps[0]
    finally:
        store.close()
