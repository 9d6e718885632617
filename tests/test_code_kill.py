"""A SIGKILLed indexing run leaves the previous revision intact and searchable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from knowledge_server.code import CodeIndex, IndexOptions

CHILD = textwrap.dedent(
    """
    import sys, time
    from knowledge_server.code import CodeIndex, IndexOptions

    db, root = sys.argv[1], sys.argv[2]
    ix = CodeIndex(db, options=IndexOptions(batch_files=5, workers=1))

    def progress(done, total, path):
        print(done, total, flush=True)
        time.sleep(0.02)

    ix.index_workspace(root, progress_callback=progress)
    print("finished", flush=True)
    """
)


def _make_ws(root: Path, n: int, word: str) -> None:
    for i in range(n):
        (root / f"m{i:03d}.py").write_text(f"def {word}_{i}(x):\n    return x + {i}\n")


def test_sigkill_mid_run_keeps_previous_revision(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _make_ws(ws, 80, "original")
    db = str(tmp_path / "code.sqlite")
    with CodeIndex(db) as ix:
        first = ix.index_workspace(str(ws))
    _make_ws(ws, 80, "replacement")  # every file changes: the next run rewrites all chunks

    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, db, str(ws)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        done, _total = (int(x) for x in line.split())
        if done >= 40:  # several batches are written, the revision is not committed
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    with CodeIndex(db) as ix:
        assert ix.current_rev(str(ws)) == first.index_rev
        res = ix.search("original 7", mode="lexical", check_fresh=False)
        assert res.index_rev == first.index_rev
        assert res.hits and all(h.symbol.startswith("original_") for h in res.hits)
        assert ix.search("replacement", mode="lexical", check_fresh=False).hits == []
        hit = ix.search("original", mode="hybrid", check_fresh=False).hits[0]
        rec = ix.get_chunk(hit.chunk_id)
        assert rec is not None and rec.index_rev == first.index_rev
        # The next run completes, reusing what the killed run already wrote.
        rep = ix.index_workspace(str(ws), options=IndexOptions(workers=1))
        assert rep.index_rev > first.index_rev and rep.files_reused >= 35
        hits = ix.search("replacement", mode="lexical", check_fresh=False).hits
        assert hits and all(h.symbol.startswith("replacement_") for h in hits)
