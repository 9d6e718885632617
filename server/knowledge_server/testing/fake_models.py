"""A deterministic local model server for retrieval tests and benchmarks: the three HTTP
APIs the knowledge base's Retrieve / Answer call, on one real port.

* ``POST /v1/embeddings`` (OpenAI-compatible): the hashing embedder's vectors
  (``code/embed.py``), ``dim`` dimensions;
* ``POST /v1/rerank`` (Cohere / Jina style) and ``POST /rerank`` (text-embeddings-inference):
  relevance = the share of the query's words (CJK: character bigrams) found in the
  document, so a paraphrase scores low and an unrelated text scores 0;
* ``POST /v1/chat/completions``: an answer made of the first sentence of evidence [1]
  and a citation marker, read from the prompt the server built.

Each endpoint ("embeddings", "rerank", "chat") has a fault mode, set in process
(``fake.faults["rerank"] = "hang"``) or over HTTP (``POST /_fake/faults {"rerank":
"503"}``): ``ok``, ``hang`` (no answer until the fake stops or the mode changes),
``503`` / ``500`` / ``400`` (that status), ``flaky`` (503 on every other call),
``slow:<ms>`` (answers after a delay). Chat has answer modes too: ``bad_markers`` (cites
a source that does not exist), ``no_markers``, ``half_emoji`` (a lone surrogate). ``calls`` counts requests per endpoint;
``GET /_fake/stats`` returns them.

    python -m knowledge_server.testing.fake_models --port 8099
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from knowledge_server.code.embed import HashingEmbedder

__all__ = ["FakeModelServer", "relevance"]

ENDPOINTS = ("embeddings", "rerank", "chat")
_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]+")
_STOP = frozenset(
    "a an and are as at be by do does for from how i in is it of on or the to was what when "
    "where which who why will with".split()
)
# A source in the answer prompt: its number and citation on the block's first line, then
# its text (knowledge_server.kb.retrieve.Retriever.answer).
_EVIDENCE = re.compile(r"^<evidence>\n\[(\d+)\] [^\n]*\n(.*?)\n</evidence>", re.S | re.M)


def _words(text: str) -> set[str]:
    out: set[str] = set()
    for word in _WORD.findall(text.lower()):
        cjk = _CJK.findall(word)
        if cjk:
            for run in cjk:
                out.update(run[i : i + 2] for i in range(max(1, len(run) - 1)))
            continue
        if word not in _STOP and len(word) > 1:
            out.add(word[:6])  # a crude stem: "refunds" and "refund" meet
    return out


def relevance(query: str, document: str) -> float:
    """Share of the query's words found in the document, in [0, 1]."""
    q = _words(query)
    if not q:
        return 0.0
    return round(len(q & _words(document)) / len(q), 6)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # Keep-alive, as model servers answer: the clients (httpx) reuse their connections.
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle's algorithm holds the
    # body for the client's delayed ACK on a kept-alive connection (bench/RESULTS.md, bench_kb_retrieve).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        return  # the fake never logs request bodies

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a budget ran out): nothing to answer

    def do_GET(self) -> None:
        owner = self.server.owner
        if self.path.rstrip("/") == "/_fake/stats":
            with owner.lock:
                self._send(200, {"calls": dict(owner.calls), "faults": dict(owner.faults)})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": "bad json"})
            return
        path = self.path.rstrip("/")
        if path == "/_fake/faults":
            with owner.lock:
                owner.faults.update({str(k): str(v) for k, v in req.items()})
                owner.changed.notify_all()
            self._send(200, {"faults": dict(owner.faults)})
            return
        endpoint = {
            "/v1/embeddings": "embeddings",
            "/v1/rerank": "rerank",
            "/rerank": "rerank",
            "/v1/chat/completions": "chat",
        }.get(path)
        if endpoint is None:
            self._send(404, {"error": "not found"})
            return
        with owner.lock:
            owner.calls[endpoint] += 1
            n = owner.calls[endpoint]
            owner.last_request[endpoint] = req
        if self._fault(endpoint, n):
            return
        try:
            if endpoint == "embeddings":
                self._embeddings(req)
            elif endpoint == "rerank":
                self._rerank(req, tei=path == "/rerank")
            else:
                self._chat(req)
        except (KeyError, TypeError, ValueError):
            self._send(400, {"error": "bad request"})

    def _fault(self, endpoint: str, n: int) -> bool:
        owner = self.server.owner
        mode = owner.faults.get(endpoint, "ok")
        if mode == "hang":
            with owner.lock:
                while owner.faults.get(endpoint) == "hang" and not owner.stopping:
                    owner.changed.wait(0.2)
            return self._fault(endpoint, n) if not owner.stopping else True
        if mode.startswith("slow:"):
            time.sleep(int(mode[5:]) / 1000.0)
            return False
        if mode == "flaky" and n % 2 == 1:
            self._send(503, {"error": "simulated"})
            return True
        if mode.isdigit():
            self._send(int(mode), {"error": "simulated"})
            return True
        return False

    def _embeddings(self, req: dict[str, Any]) -> None:
        texts = req["input"]
        if isinstance(texts, str):
            texts = [texts]
        rows = self.server.owner.embedder.embed([str(t) for t in texts])
        self._send(
            200,
            {
                "object": "list",
                "model": req.get("model"),
                "data": [
                    {"object": "embedding", "index": i, "embedding": [float(x) for x in row]}
                    for i, row in enumerate(rows)
                ],
            },
        )

    def _rerank(self, req: dict[str, Any], *, tei: bool) -> None:
        query = str(req["query"])
        docs = [str(d) for d in (req["texts"] if tei else req["documents"])]
        scored = sorted(
            ((i, relevance(query, d)) for i, d in enumerate(docs)), key=lambda p: (-p[1], p[0])
        )
        if tei:
            self._send(200, [{"index": i, "score": s} for i, s in scored])
            return
        top_n = int(req.get("top_n") or len(docs))
        self._send(
            200,
            {
                "model": req.get("model"),
                "results": [{"index": i, "relevance_score": s} for i, s in scored[:top_n]],
            },
        )

    def _chat(self, req: dict[str, Any]) -> None:
        owner = self.server.owner
        user = next(m["content"] for m in req["messages"] if m["role"] == "user")
        blocks = _EVIDENCE.findall(user)
        first = blocks[0][1].strip() if blocks else ""
        sentence = re.split(r"(?<=[.!?。])\s", first, maxsplit=1)[0][:300]
        mode = owner.answer_mode
        if mode == "no_markers":
            content = f"According to the knowledge base: {sentence}"
        elif mode == "bad_markers":
            content = f"According to the knowledge base: {sentence} [1] [{len(blocks) + 7}]"
        elif mode == "half_emoji":  # a reply cut inside a surrogate pair (valid JSON)
            content = f"According to the knowledge base: {sentence} [1] \ud83d"
        else:
            content = f"According to the knowledge base: {sentence} [1]"
        self._send(
            200,
            {
                "id": "fake-answer",
                "object": "chat.completion",
                "model": req.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FakeModelServer


class FakeModelServer:
    """``with FakeModelServer() as fake: fake.url`` -> ``http://127.0.0.1:<port>``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, dim: int = 256) -> None:
        self.embedder = HashingEmbedder(dim)
        self.dim = dim
        self.calls: Counter[str] = Counter()
        self.faults: dict[str, str] = {}
        self.answer_mode = "ok"
        self.last_request: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopping = False
        self._httpd = _Server((host, port), _Handler)
        self._httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def set_fault(self, endpoint: str, mode: str) -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        with self.lock:
            self.faults[endpoint] = mode
            self.changed.notify_all()

    def clear(self) -> None:
        """Every endpoint back to ``ok``, counters to zero."""
        with self.lock:
            self.faults.clear()
            self.calls.clear()
            self.answer_mode = "ok"
            self.changed.notify_all()

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Deterministic local embeddings, rerank and chat server (tests, benchmarks)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dim", type=int, default=256)
    args = parser.parse_args(argv)
    fake = FakeModelServer(args.host, args.port, dim=args.dim).start()
    print(fake.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
