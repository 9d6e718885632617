"""The OpenAI-compatible embedder end to end: a real local HTTP embeddings server, the real
indexer behind IndexWorkspace, and Search over gRPC on a real port."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from knowledge_sdk import AsyncKnowledgeClient
from structlog.testing import capture_logs

from tests.conftest import start_server

DIM = 32
KEY = "sk-e2e-do-not-log-7731"


def _vector(text: str) -> list[float]:
    """Deterministic and normalised: derived from the text's hash."""
    raw = np.frombuffer(hashlib.sha512(text.encode()).digest()[:DIM], dtype=np.uint8)
    v = raw.astype(np.float64) - 127.5
    return [float(x) for x in v / np.linalg.norm(v)]


MEANING_DIM = 256


def _meaning(text: str) -> list[float]:
    """A model that knows one meaning: texts about settings or configuration lie along one
    axis, plus a random direction a quarter as strong drawn from the text's hash; any other
    text is its random direction alone. It reads "those" as that meaning too: a stopword,
    which the lexical side drops, with a meaning to the model."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(MEANING_DIM)
    v /= np.linalg.norm(v)
    words = set(re.findall(r"\w+", text.lower()))
    if any(w in text.lower() for w in ("settings", "configuration", "toml")) or "those" in words:
        v = v * 0.25
        v[0] += 1.0
    return [float(x) for x in v / np.linalg.norm(v)]


class _Embeddings(BaseHTTPRequestHandler):
    calls: ClassVar[list[tuple[str, str | None, int]]] = []
    down = False
    model = staticmethod(_vector)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, self.headers.get("Authorization"), len(body["input"])))
        if type(self).down or self.path != "/v1/embeddings":
            out, status = b'{"error": {"message": "model not loaded"}}', 500
        else:
            data = [
                {"object": "embedding", "index": i, "embedding": type(self).model(t)}
                for i, t in enumerate(body["input"])
            ]
            out, status = json.dumps({"object": "list", "data": data}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


class _Meanings(_Embeddings):
    model = staticmethod(_meaning)


@pytest.fixture()
def embeddings_url() -> Iterator[str]:
    yield from _serve(_Embeddings)


@pytest.fixture()
def meanings_url() -> Iterator[str]:
    yield from _serve(_Meanings)


def _serve(handler: type[_Embeddings]) -> Iterator[str]:
    _Embeddings.calls, _Embeddings.down = [], False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _workspace(root: Path) -> Path:
    root.mkdir()
    (root / "settings.py").write_text(
        "import tomllib\n\n\ndef load_config(path):\n"
        '    """Read the TOML settings file."""\n'
        "    with open(path, 'rb') as f:\n        return tomllib.load(f)\n"
    )
    (root / "shop.py").write_text(
        "class Basket:\n    def __init__(self):\n        self.items = []\n\n"
        "    def add(self, sku, qty):\n        self.items.append((sku, qty))\n\n"
        "    def total(self, prices):\n        return sum(prices[s] * q for s, q in self.items)\n"
    )
    for i in range(12):
        (root / f"util_{i}.py").write_text(f"def helper_{i}(value):\n    return value * {i}\n")
    return root


async def test_openai_embedder_over_grpc(
    tmp_path: Path, embeddings_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index through IndexWorkspace with embedder=openai: progress in chunks, every chunk
    embedded in batches; Search answers with vector-backed hits at capability "full". With
    the provider down, Search still answers lexically and says why, an index run commits a
    lexical revision with EMBEDDING_FAILED, and the key never reaches a log line."""
    monkeypatch.setenv("E2E_EMBED_KEY", KEY)
    ws = _workspace(tmp_path / "ws")
    rs = await start_server(
        tmp_path,
        workspaces=[str(ws)],
        embedder="openai",
        embedder_url=embeddings_url,
        embedder_model="test-embed",
        embedder_dim=DIM,
        embedder_key_env="E2E_EMBED_KEY",
        embedder_batch=4,
        lane_timeout_ms=2000,
    )
    try:
        with capture_logs() as logs:
            async with AsyncKnowledgeClient(rs.address) as kc:
                events = [ev async for ev in kc.index_workspace(str(ws))]
                summary = events[-1].summary
                assert summary is not None and not summary.problems and not summary.stopped_by
                chunks = summary.counters["chunks"]
                assert chunks >= 14 and summary.counters["vectors_embedded"] == chunks
                assert summary.counters["vectors_missing"] == 0
                embed = [e.progress for e in events if e.progress and e.progress.phase == "embed"]
                assert embed and embed[-1].done == embed[-1].total == chunks
                sizes = [n for _, _, n in _Embeddings.calls]
                assert max(sizes) == 4 and sum(sizes) == chunks
                assert {auth for _, auth, _ in _Embeddings.calls} == {f"Bearer {KEY}"}

                resp = await kc.search("where is the config loaded", include=["code"])
                code = resp.lanes.code
                assert code.capability == "full" and not code.degraded
                assert code.items and any(
                    w.startswith("vec:") for item in code.items for w in item.why
                )
                assert any(item.path == "settings.py" for item in code.items)

                _Embeddings.down = True
                down = await kc.search("basket total of the prices", include=["code"])
                code = down.lanes.code
                assert code.items and code.items[0].path == "shop.py"
                assert code.degraded and code.capability == "degraded"
                assert "embedding provider unavailable" in code.degradation_reason
                assert "HTTP 500" in code.degradation_reason
                assert not any(w.startswith("vec:") for item in code.items for w in item.why)
                assert any(w.code == "KNOWLEDGE_LANE_DEGRADED" for w in down.warnings)

                (ws / "extra.py").write_text("def refund(order):\n    return -order.total\n")
                events = [ev async for ev in kc.index_workspace(str(ws))]
                summary = events[-1].summary
                assert summary is not None and summary.index_rev
                assert [p.code for p in summary.problems] == ["EMBEDDING_FAILED"]
                assert summary.stopped_by == "embedding_failed"
                assert "HTTP 500" in summary.problems[0].message
                assert summary.counters["vectors_missing"] >= 1
                lexical = await kc.search("refund order", include=["code"])
                assert lexical.lanes.code.items[0].path == "extra.py"
                assert lexical.lanes.code.capability == "degraded"
        assert any(ev["event"] == "code.embed.failed" for ev in logs)
        assert KEY not in repr(logs)
    finally:
        await rs.server.stop(0)
        rs.app.close()


async def test_meaning_without_the_words_passes_the_relevance_floor(
    tmp_path: Path, meanings_url: str
) -> None:
    """With a semantic embedder, a question none of whose words is in the code is answered
    by the file whose meaning stands out from the question's baseline (search.QUESTION_VEC_Z),
    over gRPC; a question that means nothing there still gets no items, and says no_match.
    Each item holds a word of the question or such a similarity (search.HIT_VEC_Z)."""
    ws = _workspace(tmp_path / "ws")
    for i in range(12, 40):  # more chunks unrelated to it, for the question's baseline
        (ws / f"util_{i}.py").write_text(f"def helper_{i}(value):\n    return value * {i}\n")
    rs = await start_server(
        tmp_path,
        workspaces=[str(ws)],
        embedder="openai",
        embedder_url=meanings_url,
        embedder_model="test-meaning",
        embedder_dim=MEANING_DIM,
        lane_timeout_ms=2000,
    )
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            events = [ev async for ev in kc.index_workspace(str(ws))]
            summary = events[-1].summary
            assert summary is not None and summary.counters["vectors_missing"] == 0
            # "configuration" is in no file (load_config is "load" and "config").
            resp = await kc.search("configuration", include=["code"], limit=30)
            code = resp.lanes.code
            assert code.capability == "full" and code.items
            assert code.items[0].path == "settings.py"
            assert any(w.startswith("vec:") for w in code.items[0].why)
            # The other files hold no word of it; only those whose similarity stands above
            # the question's baseline come back (without HIT_VEC_Z: 22 of the 41).
            others = {item.path for item in code.items} - {"settings.py"}
            assert len(others) <= 12, sorted(others)
            # A question of stopwords alone has no words to hold: only the files whose
            # similarity stands out answer it, not every file.
            meant = await kc.search("those", include=["code"], limit=30)
            assert meant.lanes.code.items and meant.lanes.code.items[0].path == "settings.py"
            assert len({item.path for item in meant.lanes.code.items}) <= 13
            nothing = await kc.search("zebra harbor tulip", include=["code"])
            assert not nothing.lanes.code.items
            assert nothing.lanes.code.empty_reason == "no_match"
            words = await kc.search("basket total of the prices", include=["code"])
            assert words.lanes.code.items[0].path == "shop.py"
    finally:
        await rs.server.stop(0)
        rs.app.close()
