"""Store and ingestion: idempotence, incremental appends, truncation, rotation, read-only readers."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.episodes import EpisodeStore, ingest, ingest_sample_if_empty, watch
from knowledge_server.episodes.store import InvalidQuery


def _line(sid: str, i: int, text: str, **extra: object) -> str:
    obj = {
        "session_id": sid,
        "seq": i,
        "time": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
        "role": "user",
        "text": text,
        "cwd": "/work/proj",
    }
    obj.update(extra)
    return json.dumps(obj) + "\n"


@pytest.fixture()
def store(tmp_path: Path):
    s = EpisodeStore(str(tmp_path / "db"))
    yield s
    s.close()


def test_real_logs_ingest_idempotent(store: EpisodeStore, shared_data: Path) -> None:
    rep = ingest(store, [str(shared_data / "sessions")])
    assert not rep.errors
    assert rep.files_changed == rep.files_seen >= 20
    assert rep.events_added > 400 and rep.sessions > 20
    assert all(n > 0 for n in rep.per_file_events.values())
    assert any(loc.endswith("edge_cases.jsonl:13") for loc in rep.malformed)
    rev = store.index_rev()
    assert rev.startswith("episodes:")
    again = ingest(store, [str(shared_data / "sessions")])
    assert again.files_changed == 0 and again.events_added == 0
    assert store.index_rev() == rev
    assert store.counts()["indexed_docs"] == rep.events_added


def test_copy_of_real_file_reingests_after_touch(
    store: EpisodeStore, shared_data: Path, tmp_path: Path
) -> None:
    src = shared_data / "sessions/agent-sessions/stage0/agents/codex/small.jsonl"
    dst = tmp_path / "logs" / "rollout.jsonl"
    dst.parent.mkdir()
    shutil.copy(src, dst)
    first = ingest(store, [str(dst)])
    os.utime(dst, (1, 1))  # mtime change only: nothing new to read
    second = ingest(store, [str(dst)])
    assert first.events_added > 0 and second.events_added == 0 and second.events_duplicate == 0


def test_incremental_append_and_partial_line(store: EpisodeStore, tmp_path: Path) -> None:
    p = tmp_path / "live.jsonl"
    p.write_text("".join(_line("live1", i, f"step {i} alpha") for i in range(1, 6)))
    assert ingest(store, [str(p)]).events_added == 5
    rev1 = store.index_rev()
    with open(p, "a") as fh:
        fh.write(_line("live1", 6, "step six bravo"))
        fh.write(_line("live1", 7, "step seven charlie")[:25])  # writer is mid-line
    rep = ingest(store, [str(p)])
    assert rep.events_added == 1 and rep.files_reimported == 0
    assert store.index_rev() != rev1
    assert not store.search("charlie")
    with open(p, "a") as fh:
        fh.write(_line("live1", 7, "step seven charlie")[25:])
    assert ingest(store, [str(p)]).events_added == 1
    assert [h.seq for h in store.search("charlie")] == [7]
    assert store.counts()["indexed_docs"] == 7


def test_unterminated_valid_last_line_then_append(store: EpisodeStore, tmp_path: Path) -> None:
    p = tmp_path / "g.jsonl"
    p.write_text(_line("g", 1, "one")[:-1].replace('"seq": 1, ', ""))  # valid JSON, no newline
    ingest(store, [str(p)])
    with open(p, "a") as fh:
        fh.write("\n" + _line("g", 2, "two").replace('"seq": 2, ', ""))
    ingest(store, [str(p)])
    fresh = EpisodeStore(str(tmp_path / "db2"))
    ingest(fresh, [str(p)])
    ids = sorted(e.id for e in store.iter_events_meta())
    assert ids == sorted(e.id for e in fresh.iter_events_meta()) and len(ids) == 2
    fresh.close()


def test_truncation_and_rotation_reimport_without_duplicates(
    store: EpisodeStore, tmp_path: Path
) -> None:
    p = tmp_path / "rot.jsonl"
    p.write_text("".join(_line("r1", i, f"old event {i}") for i in range(1, 11)))
    ingest(store, [str(p)])
    assert store.counts()["indexed_docs"] == 10
    # Truncate to fewer lines: the file shrank -> re-import from scratch.
    p.write_text("".join(_line("r1", i, f"old event {i}") for i in range(1, 4)))
    rep = ingest(store, [str(p)])
    assert rep.files_reimported == 1
    assert store.counts()["indexed_docs"] == 3
    # Rotation: same size class but different head -> re-import, no duplicates.
    p.write_text("".join(_line("r2", i, f"new event {i}") for i in range(1, 6)))
    ingest(store, [str(p)])
    assert store.counts()["indexed_docs"] == 5
    assert {s.session_id: s.event_count for s in store.sessions()} == {"r1": 0, "r2": 5}
    # Rotation by rename (new inode) and a longer file: still no duplicates.
    q = tmp_path / "rot.new"
    q.write_text("".join(_line("r2", i, f"new event {i}") for i in range(1, 8)))
    os.replace(q, p)
    ingest(store, [str(p)])
    assert store.counts()["indexed_docs"] == 7


def test_read_only_reader_while_writing(store: EpisodeStore, tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text(_line("ro", 1, "first entry delta"))
    ingest(store, [str(p)])
    reader = EpisodeStore(store.path, read_only=True)
    assert [h.id for h in reader.search("delta")] == ["ep:ro:1"]
    with open(p, "a") as fh:
        fh.write(_line("ro", 2, "second entry delta"))
    ingest(store, [str(p)])
    assert len(reader.search("delta")) == 2
    with pytest.raises(apsw.ReadOnlyError):
        reader.conn.execute("DELETE FROM events")
    reader.close()


def test_get_event_counts_sessions_meta(store: EpisodeStore, tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl"
    p.write_text(
        _line("s1", 1, "hello there")
        + _line(
            "s1",
            2,
            "use skill",
            event_type="tool_use/Skill",
            tool_name="Skill",
            meta={"skill": "pdf"},
        )
        + _line("s1", 3, "boom", event_type="tool_result", is_error=True)
        + _line("s2", 1, "child work", cwd="/elsewhere", parent_session_id="s1", agent_id="a9")
    )
    ingest(store, [str(p)])
    ev = store.get_event("ep:s1:2", neighbours=1)
    assert ev is not None and ev.text == "use skill" and ev.meta == {"skill": "pdf"}
    assert [b.seq for b in ev.before] == [1] and [a.seq for a in ev.after] == [3]
    assert ev.session and ev.session.cwd == "/work/proj"
    assert store.get_event("ep:s1:99") is None
    with pytest.raises(InvalidQuery):
        store.get_event("nonsense")
    assert store.counts() == {"sessions": 2, "indexed_docs": 4, "live_sessions": 2}
    assert store.counts(["/work/proj"])["sessions"] == 1
    assert store.counts([])["sessions"] == 0
    by_id = {s.session_id: s for s in store.sessions()}
    assert by_id["s1"].outcome == "failure"  # ends with a failed tool result
    assert (
        by_id["s2"].parent_session_id == "s1"
        and by_id["s2"].agent_id == "a9"
        and by_id["s2"].is_sidechain
    )
    metas = list(store.iter_events_meta())
    assert [m.id for m in metas] == ["ep:s1:1", "ep:s1:2", "ep:s1:3", "ep:s2:1"]
    assert metas[1].tool_name == "Skill" and metas[1].meta["skill"] == "pdf" and metas[2].is_error
    assert not hasattr(metas[0], "text")


def test_progress_callback_and_sample(store: EpisodeStore) -> None:
    calls: list[tuple[int, int, str]] = []
    rep = ingest_sample_if_empty(store)
    assert rep is not None and rep.events_added == 30
    assert ingest_sample_if_empty(store) is None
    from knowledge_server.episodes import sample_path

    ingest(store, [sample_path()], progress_callback=lambda d, t, p: calls.append((d, t, p)))
    assert calls[0] == (0, 1, sample_path()) and calls[-1][:2] == (1, 1)
    assert store.sessions()[0].outcome == "success"


def test_watch_picks_up_appends(store: EpisodeStore, tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    p.write_text(_line("w", 1, "watch one"))
    stop = threading.Event()
    reports = []

    def cb(rep):  # type: ignore[no-untyped-def]
        reports.append(rep)
        if len(reports) == 1:
            with open(p, "a") as fh:
                fh.write(_line("w", 2, "watch two"))
        else:
            stop.set()

    t = threading.Thread(target=watch, args=(EpisodeStore(store.path), [str(p)], 0.05, stop, cb))
    t.start()
    t.join(timeout=20)
    stop.set()
    assert not t.is_alive()
    assert [r.events_added for r in reports[:2]] == [1, 1]


def test_garbage_files_never_crash(store: EpisodeStore, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage\n{not json}\n\x80\x81\n")
    (tmp_path / "mixed.jsonl").write_bytes(
        b'{"session_id": "m", "role": "user", "text": "kept before"}\n\xff\xff\n[1, 2]\n'
        b'{"session_id": "m", "role": "assistant", "text": "kept after"}\n'
    )
    rep = ingest(store, [str(tmp_path)])
    assert not rep.errors
    assert any(loc.endswith("mixed.jsonl:2") for loc in rep.malformed)
    assert any(loc.endswith("mixed.jsonl:3") for loc in rep.malformed)
    assert {h.seq for h in store.search("kept")} == {1000, 4000}


def test_codex_append_keeps_session_context(
    store: EpisodeStore, shared_data: Path, tmp_path: Path
) -> None:
    src = (shared_data / "sessions/agent-sessions/stage0/agents/codex/large.jsonl").read_bytes()
    lines = src.splitlines(keepends=True)
    p = tmp_path / "rollout.jsonl"
    p.write_bytes(b"".join(lines[:8]))
    ingest(store, [str(p)])
    p.write_bytes(src)
    ingest(store, [str(p)])
    fresh = EpisodeStore(str(tmp_path / "fresh"))
    ingest(fresh, [str(p)])
    assert [m.id for m in store.iter_events_meta()] == [m.id for m in fresh.iter_events_meta()]
    (s,) = store.sessions()
    assert s.session_id == "019b2ea4-aaaa-bbbb-cccc-58208e1f0000" and s.model == "gpt-5.2"
    fresh.close()


def test_deleted_file_events_are_removed(store: EpisodeStore, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(_line("da", 1, "vanishing text"))
    (logs / "b.jsonl").write_text(_line("db", 1, "staying text"))
    ingest(store, [str(logs)])
    rev = store.index_rev()
    (logs / "a.jsonl").unlink()
    rep = ingest(store, [str(logs)])
    assert rep.events_removed == 1 and store.index_rev() != rev
    assert [h.session_id for h in store.search("text")] == ["db"]


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="abcXYZ é\n", max_size=7000),
    st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=6), max_size=4),
    st.integers(20, 300),
)
def test_snippet_window_scan_finds_the_first_needle(text: str, needles: list[str], width: int):
    """The snippet is centred on the earliest needle, found case-insensitively, as a scan of
    the whole lower-cased text would find it (the window scan must not miss one that
    straddles two windows)."""
    from knowledge_server.episodes.store import _first_needle, make_snippet

    low = text.lower()
    hits = [i for i in (low.find(n) for n in needles) if i != -1]
    assert _first_needle(text, [n.lower() for n in needles]) == (min(hits) if hits else -1)
    snip = make_snippet(text, needles, width)
    if len(text) <= max(20, width):
        assert snip == text
    else:
        assert len(snip) == max(20, width)


def test_document_frequencies_follow_new_events(store: EpisodeStore, tmp_path: Path) -> None:
    """The remembered term counts that prune frequent words are those of the current index
    revision: a reader (another connection) sees counts grow after an ingest."""
    p = tmp_path / "s.jsonl"
    p.write_text("".join(_line("dfs", i, f"zebra step {i}") for i in range(1, 4)))
    ingest(store, [str(p)])
    reader = EpisodeStore(str(tmp_path / "db"), read_only=True)
    try:
        assert reader._doc_freqs(["zebra", "okapi"]) == {"zebra": 3, "okapi": 0}
        with open(p, "a") as fh:
            fh.write("".join(_line("dfs", i, f"zebra okapi {i}") for i in range(4, 6)))
        ingest(store, [str(p)])
        assert reader._doc_freqs(["zebra", "okapi"]) == {"zebra": 5, "okapi": 2}
        assert [h.seq for h in reader.search("okapi")] == [5, 4]
    finally:
        reader.close()


def test_hits_described_later_equal_search(store: EpisodeStore, tmp_path: Path) -> None:
    """The episodes lane ranks without texts and sessions and describes only the hits an
    answer keeps: ``describe(search_ranked(...))`` is ``search(...)``; a hit whose event
    is gone by then keeps an empty snippet and no session."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(
        "".join(_line("sa", i, f"checkout test failed at step {i} in parser") for i in range(8))
    )
    (logs / "b.jsonl").write_text(_line("sb", 1, "the parser test passed after the fix"))
    ingest(store, [str(logs)])
    whole = store.search("parser test", k=10, snippet_chars=40)
    ranked, needles = store.search_ranked("parser test", k=10)
    assert [h.id for h in ranked] == [h.id for h in whole]
    assert all(h.snippet == "" and h.session is None for h in ranked)
    assert store.describe(ranked, needles, 40) == whole
    (logs / "b.jsonl").unlink()
    ingest(store, [str(logs)])
    again = store.describe(ranked, needles, 40)
    gone = [h for h in again if h.session_id == "sb"]
    assert gone and all(h.snippet == "" and h.session is None for h in gone)
    assert [h for h in again if h.session_id == "sa"] == [h for h in whole if h.session_id == "sa"]
