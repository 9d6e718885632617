"""``httpcall.post_json`` against a real local HTTP server: a model server that sends its
answer a byte at a time cannot hold the calling thread past the call's timeout (httpx's own
timeout bounds each read only), and ordinary and compressed answers read as before."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from knowledge_server import httpcall
from knowledge_server.httpcall import AnswerTooLarge, post_json, without_userinfo
from knowledge_server.kb.deps import HttpReranker, Permanent

ANSWER = json.dumps({"choices": [{"message": {"content": "x" * 20}}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = ANSWER
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path == "/gzip":
            body = gzip.compress(ANSWER)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path == "/trickle":  # one byte every 0.1 s: each read well within 0.5 s
            for b in body:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(0.1)
            return
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_answer_sent_a_byte_at_a_time_ends_the_call_at_its_timeout(server: str) -> None:
    """The trickled answer takes about 6 s in all; a call with a 0.5 s timeout ends with
    a timeout instead of waiting for it (a plain httpx post returns it whole)."""
    with httpx.Client() as client:
        with pytest.raises(httpx.TimeoutException):
            post_json(client, f"{server}/trickle", {"q": 1}, timeout=0.5)


def test_ordinary_and_compressed_answers_are_read_whole(server: str) -> None:
    with httpx.Client() as client:
        for path in ("/plain", "/gzip"):
            resp = post_json(client, f"{server}{path}", {"q": 1}, timeout=5)
            assert resp.status_code == 200
            assert resp.json()["choices"][0]["message"]["content"] == "x" * 20


def test_credentials_in_a_model_servers_url_are_never_kept_in_an_identity() -> None:
    assert without_userinfo("http://svc:S3cret@10.0.0.5:8080/v") == "http://10.0.0.5:8080/v"
    assert without_userinfo("https://models.internal:443") == "https://models.internal:443"
    reranker = HttpReranker("http://svc:S3cret@127.0.0.1:9", "rerank-m")
    try:
        assert "S3cret" not in reranker.identity and reranker.label == "v1:rerank-m"
    finally:
        reranker.close()


def test_an_answer_over_the_size_limit_is_malformed_not_retried(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer larger than the limit would be as large again: AnswerTooLarge, which the
    reranker reports as a permanent (not retried) malformed answer."""
    monkeypatch.setattr(httpcall, "MAX_ANSWER_BYTES", 10)
    with httpx.Client() as client:
        with pytest.raises(AnswerTooLarge):
            post_json(client, f"{server}/plain", {"q": 1}, timeout=5)
    reranker = HttpReranker(server, "m")
    try:
        with pytest.raises(Permanent, match="too large"):
            reranker.rerank_once("q", ["a"], 1, timeout=5)
    finally:
        reranker.close()
