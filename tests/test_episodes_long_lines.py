"""Long JSONL lines are read, over-limit lines and unrecognised files are named, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from knowledge_server.episodes import EpisodeStore, ingest
from knowledge_server.episodes.importers import detect_format
from knowledge_server.episodes.importers.base import MAX_LINE_BYTES
from knowledge_server.lanes.episodes import EpisodesLane

SID = "5d1c0e9a-7b2f-4c3e-9a10-2f4b6c8d0e1f"


def _claude(i: int, role: str, content: str) -> str:
    return json.dumps(
        {
            "type": role,
            "sessionId": SID,
            "uuid": f"u-{i}",
            "parentUuid": f"u-{i - 1}" if i else None,
            "isSidechain": False,
            "timestamp": f"2026-03-01T10:00:{i:02d}Z",
            "cwd": "/work/proj",
            "message": {"role": role, "content": content},
        }
    )


def _generic(i: int, text: str) -> str:
    return json.dumps({"session_id": "g", "seq": i, "role": "user", "text": text})


@pytest.fixture()
def store(tmp_path: Path):
    s = EpisodeStore(str(tmp_path / "db"))
    yield s
    s.close()


def test_first_line_of_300_kib_is_ingested_and_searchable(
    store: EpisodeStore, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    first = _claude(0, "user", "quasarfrobnicate deploy the widget " + "lorem ipsum " * 26_000)
    assert len(first) > 300 * 1024
    path = logs / "agent-a1b2c3.jsonl"  # an agent log names its parent only in its records
    path.write_text(
        first + "\n" + _claude(1, "assistant", "widget deployed, zebracrossing done") + "\n",
        encoding="utf-8",
    )
    assert detect_format(str(path)) == "claude-code"
    rep = ingest(store, [str(logs)])
    assert rep.files_seen == 1 and not rep.skipped and not rep.oversized
    assert rep.events_added >= 2
    hits = store.search("quasarfrobnicate")
    assert hits and hits[0].session_id == f"{SID}/agent-a1b2c3"
    assert store.search("zebracrossing")


def test_unrecognised_file_is_named_with_its_reason(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "ok.jsonl").write_text(_generic(1, "kept line") + "\n", encoding="utf-8")
    (logs / "noise.jsonl").write_text("not json at all\n[1, 2]\n", encoding="utf-8")
    (logs / "notes.md").write_text("# notes\nnot a chat\n", encoding="utf-8")
    lane = EpisodesLane(tmp_path / "data")
    try:
        summary = lane.ingest_sync([str(logs)], lambda *a: None)
    finally:
        lane.close()
    assert summary.counters["files_seen"] == 1
    assert summary.counters["files_skipped"] == 2
    skipped = {p.message for p in summary.problems if p.code == "FILE_SKIPPED"}
    assert skipped == {
        f"{logs / 'noise.jsonl'}: empty, or no JSON object in its first lines",
        f"{logs / 'notes.md'}: no Aider chat header in the first MiB",
    }


def test_line_over_the_limit_is_counted_and_named_rest_ingested(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    huge = _generic(2, "x" * (MAX_LINE_BYTES + 10))
    path = logs / "big.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(huge + "\n")  # first line over the limit: the format comes from the others
        fh.write(_generic(3, "before the second huge line") + "\n")
        fh.write(huge + "\n")
        fh.write(_generic(5, "after the huge line") + "\n")
    lane = EpisodesLane(tmp_path / "data")
    try:
        summary = lane.ingest_sync([str(logs)], lambda *a: None)
        with lane.snapshot() as snap:
            assert snap.search("after huge line")
            assert snap.search("before second huge line")
    finally:
        lane.close()
    assert summary.counters["files_seen"] == 1 and summary.counters["files_skipped"] == 0
    assert summary.counters["events_added"] == 2
    assert summary.counters["lines_oversized"] == 2
    named = sorted(p.message for p in summary.problems if p.code == "LINE_TOO_LONG")
    assert [m.split(": ")[0] for m in named] == [f"{path}:1", f"{path}:3"]
    assert all("over the 16 MiB limit (skipped)" in m for m in named)


def test_file_of_only_an_over_limit_line_is_skipped_with_that_reason(
    store: EpisodeStore, tmp_path: Path
) -> None:
    path = tmp_path / "only.jsonl"
    path.write_text(_generic(1, "y" * (MAX_LINE_BYTES + 1)) + "\n", encoding="utf-8")
    rep = ingest(store, [str(path)])
    assert rep.files_seen == 0
    assert rep.skipped == [
        f"{path}: no JSON object in its first lines: 1 line(s) over the 16 MiB line limit"
    ]
