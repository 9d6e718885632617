"""No request holds the event loop beyond its own deadline, over a real server process.

The heavy request: a Search whose code lane embeds the question with an embedding
endpoint (the OpenAI-compatible provider) that takes seconds to answer, a slow path any
remote provider can take. The lane timeout is set high (60 s) so that only the caller's
deadline bounds the call. While that search runs with a short deadline, a second client
keeps sending cheap requests (GetStatus and episodes-only searches): they must all be
answered, none waiting anywhere near as long as the slow endpoint takes, and the heavy
call must end with DEADLINE_EXCEEDED soon after its deadline.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from knowledge_sdk import DeadlineExceeded, KnowledgeClient

from tests.conftest import serve_process, write_session_log

DIM = 16
SLOW_S = 5.0  # how long the embedding endpoint takes once it is slowed down
HEAVY_DEADLINE_S = 0.5
# Generous bounds for a shared machine; without the fix a cheap request waits the whole
# SLOW_S, and the loop answers nothing in between.
CHEAP_MAX_S = 1.0
DEADLINE_MARGIN_S = 1.0


@pytest.fixture
def embeddings() -> Iterator[tuple[str, threading.Event]]:
    """A local OpenAI-compatible embeddings endpoint; slow (SLOW_S) once the event is set."""
    slow = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if slow.is_set():
                time.sleep(SLOW_S)
            data = [
                {
                    "index": i,
                    "embedding": [b - 128.0 for b in hashlib.sha256(t.encode()).digest()][:DIM],
                }
                for i, t in enumerate(body["input"])
            ]
            out = json.dumps({"data": data, "model": body["model"]}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            except OSError:
                pass  # the server stopped waiting

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", slow
    finally:
        slow.clear()
        httpd.shutdown()
        httpd.server_close()


def _serve(tmp_path: Path, url: str) -> tuple[subprocess.Popen[str], str]:
    proc = serve_process(
        tmp_path / "data",
        stderr=subprocess.DEVNULL,
        env_extra={
            "KNOWLEDGE_LOG_LEVEL": "warning",
            "KNOWLEDGE_LANE_TIMEOUT_MS": "60000",
            "KNOWLEDGE_EMBEDDER": "openai",
            "KNOWLEDGE_EMBEDDER_URL": url,
            "KNOWLEDGE_EMBEDDER_MODEL": "test-embed",
            "KNOWLEDGE_EMBEDDER_DIM": str(DIM),
        },
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        proc.kill()
        pytest.fail(f"the server did not start: {line!r}")
    return proc, line.split()[-1]


def test_a_heavy_search_past_its_deadline_does_not_stall_other_callers(
    tmp_path: Path, embeddings: tuple[str, threading.Event]
) -> None:
    url, slow = embeddings
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    ws.mkdir()
    logs.mkdir()
    (ws / "retry.py").write_text("def retry_with_backoff(call):\n    return call()\n")
    write_session_log(logs / "s.jsonl", "sess-1", ws, "retry the flaky upload with backoff")
    proc, address = _serve(tmp_path, url)
    try:
        with KnowledgeClient(address, timeout=60) as kc:
            for _ in kc.index_workspace(str(ws)):
                pass
            for _ in kc.ingest_sessions([str(logs)]):
                pass
            # Both lanes answer, quickly, while the endpoint is fast.
            first = kc.search("retry with backoff", include=["episodes", "code"])
            assert first.lanes.code.items and first.lanes.episodes.items

        slow.set()
        heavy: dict[str, object] = {}

        def run_heavy() -> None:
            with KnowledgeClient(address) as client:
                started = time.monotonic()
                try:
                    client.search(
                        "where is the upload retried", include=["code"], timeout=HEAVY_DEADLINE_S
                    )
                    heavy["outcome"] = "answered"
                except DeadlineExceeded:
                    heavy["outcome"] = "deadline"
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    heavy["outcome"] = type(exc).__name__
                heavy["took"] = time.monotonic() - started

        cheap: list[float] = []
        with KnowledgeClient(address, timeout=30) as kc:
            thread = threading.Thread(target=run_heavy)
            thread.start()
            time.sleep(0.1)  # the heavy search is under way
            until = time.monotonic() + 2 * HEAVY_DEADLINE_S + 1.5
            n = 0
            while time.monotonic() < until:
                started = time.monotonic()
                if n % 2:
                    kc.get_status()
                else:
                    resp = kc.search(f"flaky upload {n}", include=["episodes"])
                    assert resp.lanes.episodes.items
                cheap.append(time.monotonic() - started)
                n += 1
            thread.join(timeout=SLOW_S * 4)
        assert heavy.get("outcome") == "deadline", heavy
        assert heavy["took"] < HEAVY_DEADLINE_S + DEADLINE_MARGIN_S, heavy  # type: ignore[operator]
        assert len(cheap) >= 10 and max(cheap) < CHEAP_MAX_S, (len(cheap), max(cheap))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
