"""A full disk answers RESOURCE_EXHAUSTED / KNOWLEDGE_STORAGE_FULL (not INTERNAL), the
lane keeps it as GetStatus.last_error, and the server keeps serving searches.

The mapping is checked deterministically by failing the store writes (SQLITE_FULL,
ENOSPC); the "Faults" case fills a real 8 MiB tmpfs used as the data directory (needs
root to mount; skipped with the reason elsewhere)."""

from __future__ import annotations

import errno
import importlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from knowledge_sdk import AsyncKnowledgeClient, ResourceExhausted
from knowledge_server.code.index import CodeIndex
from knowledge_server.dispatch import outbox
from knowledge_server.errors import StorageFull, as_storage_full

from tests.conftest import start_server

CANARY = "quokkafullness"
# The module (the package re-exports its ``ingest`` function under the same name).
ingest_mod = importlib.import_module("knowledge_server.episodes.ingest")


def _log(path: Path, session_id: str, cwd: Path, events: int = 1, pad: int = 0) -> None:
    lines = []
    for seq in range(1, events + 1):
        text = f"{CANARY} deploy the service step {seq} " + f"{seq:06d}" * pad
        lines.append(
            json.dumps(
                {
                    "session_id": session_id,
                    "seq": seq,
                    "time": "2026-10-21T09:00:00Z",
                    "cwd": str(cwd),
                    "harness": "generic",
                    "role": "user",
                    "text": text,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


def _lane(st, name: str):  # type: ignore[no-untyped-def]
    return next(lane for lane in st.lanes if lane.lane == name)


def test_full_disk_errors_map_to_storage_full() -> None:
    for exc in (
        apsw.FullError("database or disk is full"),
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
    ):
        full = as_storage_full(exc)
        assert isinstance(full, StorageFull)
        assert full.reason == "KNOWLEDGE_STORAGE_FULL" and full.code.name == "RESOURCE_EXHAUSTED"
    try:
        try:
            raise apsw.FullError("database or disk is full")
        except apsw.FullError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert as_storage_full(outer) is not None
    for other in (OSError(errno.EACCES, "denied"), apsw.BusyError("busy"), ValueError("x")):
        assert as_storage_full(other) is None


async def test_store_write_on_a_full_disk_is_resource_exhausted_and_kept_in_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    ws.mkdir()
    logs.mkdir()
    (ws / "app.py").write_text("def deploy():\n    return 'quokka'\n")
    _log(logs / "a.jsonl", "sess-a", ws)
    rs = await start_server(tmp_path)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            async for _ in kc.ingest_sessions([str(logs)]):
                pass

            # Ingestion: SQLITE_FULL at the store write.
            def full_ingest(*_a: object, **_k: object) -> None:
                raise apsw.FullError("database or disk is full")

            monkeypatch.setattr(ingest_mod, "ingest_file", full_ingest)
            _log(logs / "b.jsonl", "sess-b", ws)
            with pytest.raises(ResourceExhausted) as info:
                async for _ in kc.ingest_sessions([str(logs)]):
                    pass
            assert info.value.reason == "KNOWLEDGE_STORAGE_FULL"
            assert "full" in info.value.message and "FullError" not in info.value.message
            err = _lane(await kc.get_status(), "episodes").last_error
            assert err.code == "KNOWLEDGE_STORAGE_FULL" and "ingest" in err.message

            # Indexing: ENOSPC from the code store.
            def full_index(*_a: object, **_k: object) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(CodeIndex, "index_workspace", full_index)
            with pytest.raises(ResourceExhausted) as info:
                async for _ in kc.index_workspace(str(ws)):
                    pass
            assert info.value.reason == "KNOWLEDGE_STORAGE_FULL"
            err = _lane(await kc.get_status(), "code").last_error
            assert err.code == "KNOWLEDGE_STORAGE_FULL" and "index" in err.message

            # Dispatch commit: ENOSPC writing the outbox package.
            def full_outbox(*_a: object, **_k: object) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr(outbox, "write_once", full_outbox)
            with pytest.raises(ResourceExhausted) as info:
                await kc.dispatch(
                    "deploy the service", actor_id="actor:generic:root_session:sess-a", commit=True
                )
            assert info.value.reason == "KNOWLEDGE_STORAGE_FULL"
            err = _lane(await kc.get_status(), "skills").last_error
            assert err.code == "KNOWLEDGE_STORAGE_FULL" and "dispatch" in err.message

            # Searches are still served.
            found = await kc.search(CANARY, include=["episodes"])
            assert found.lanes.episodes.items

            # Space again: the next ingestion succeeds and clears the error.
            monkeypatch.undo()
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
            st = await kc.get_status()
            last = _lane(st, "episodes").last_error
            assert last is None or last.code != "KNOWLEDGE_STORAGE_FULL"
    finally:
        await rs.server.stop(0)
        rs.app.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs mounted at tmp_path/data, unmounted afterwards."""
    mnt = tmp_path / "data"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; this machine runs the tests unprivileged")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder: Path) -> None:
    """Take every free block: large writes first, then small ones (unbuffered)."""
    for size in (16384, 512):
        with open(folder / f"filler{size}", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC


async def test_disk_full_on_a_small_filesystem(tmp_path: Path, small_fs: Path) -> None:
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    ws.mkdir()
    logs.mkdir()
    (ws / "app.py").write_text("def deploy():\n    return 'quokka'\n")
    _log(logs / "a.jsonl", "sess-a", ws)
    rs = await start_server(tmp_path)
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
            async for _ in kc.index_workspace(str(ws)):
                pass
            await kc.search(CANARY, include=["episodes", "code"])
            _fill(small_fs)
            big = tmp_path / "big"
            big.mkdir()
            _log(big / "b.jsonl", "sess-b", ws, events=400, pad=60)
            with pytest.raises(ResourceExhausted) as info:
                async for _ in kc.ingest_sessions([str(big)]):
                    pass
            assert info.value.reason == "KNOWLEDGE_STORAGE_FULL"
            for i in range(40):
                (ws / f"mod{i}.py").write_text(
                    "".join(f"def f{i}_{n}():\n    return {n} * {i}\n" for n in range(200))
                )
            with pytest.raises(ResourceExhausted) as info:
                async for _ in kc.index_workspace(str(ws)):
                    pass
            assert info.value.reason == "KNOWLEDGE_STORAGE_FULL"
            st = await kc.get_status()
            for lane in ("episodes", "code"):
                err = _lane(st, lane).last_error
                assert err.code == "KNOWLEDGE_STORAGE_FULL", (lane, err)
            # The server keeps serving searches over what it has.
            found = await kc.search(CANARY, include=["episodes"])
            assert found.lanes.episodes.items
    finally:
        await rs.server.stop(0)
        rs.app.close()
