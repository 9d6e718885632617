#!/usr/bin/env python3
"""How long one heavy request holds the server's event loop, per RPC.

Starts `knowledge serve` on a data directory that indexes a code tree (default: this
repository) and ingests the real session logs of the shared data folder, waits until both
lanes answer, then for each RPC fires its heaviest request (many-term questions at the
largest limit and budget, GetEpisode with 20 neighbours, Dispatch planning, GetStatus)
a number of times, one after another: first with no deadline, then with a short one
(``--deadline-ms``), counting the status codes. Meanwhile a second client calls the health check
(answered on the same event loop) back to back: its latency while the heavy request runs
is how long the loop was held. Prints, per RPC, the ticker's longest and P95 latency
during that RPC's window, and the heavy request's own median and longest latency.

Then the same for the code lane behind an embedding endpoint that has turned slow
(``--slow-embedder``, a local OpenAI-compatible one): searches with no deadline and with
a 500 ms one.

Several checkouts can be measured side by side on the same data: each `--checkout` runs
its own server (its `server/` and `sdk/` first on PYTHONPATH), one after the other.

Usage: python bench/loop_block.py [--checkout DIR ...] [--data DIR] [--rounds 20]
       [--deadline-ms 50] [--slow-embedder 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from knowledge_server._gen.knowledge.v1 import (  # noqa: E402 - after the path above
    dispatch_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)
from served import served  # noqa: E402 - after the path above

SESSIONS = Path("/work/shared/data/sessions")
PAUSE_S = 0.1  # between two heavy calls
EMBED_DIM = 16
# Many distinct terms: every lane's full-text query matches a large share of its rows.
TERMS = (
    "error test config server client request response file path index search query "
    "token session event tool result function class return import value string list "
    "data store write read lane chunk episode skill actor dispatch status build graph"
).split()


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


class Ticker:
    """Back-to-back health checks on their own channel; keeps (start, latency) pairs."""

    def __init__(self, address: str) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        self._channel = grpc.insecure_channel(address)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._req = health_pb2.HealthCheckRequest()
        self.ticks: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._stub.Check(self._req, timeout=30)
            self.ticks.append((t0, time.perf_counter() - t0))
            time.sleep(0.002)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._channel.close()

    def window(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the checks that overlapped [start, end]; first waits (up to a
        minute) for a check started after ``end`` to finish, so that a check still held
        by the server at ``end`` is counted with its whole wait."""
        limit = time.perf_counter() + 60
        while time.perf_counter() < limit and not any(t0 > end for t0, _ in self.ticks[-3:]):
            time.sleep(0.01)
        return [lat * 1000 for t0, lat in list(self.ticks) if t0 + lat >= start and t0 <= end]


def wait_ready(
    channel: grpc.Channel, lanes_needed: tuple[str, ...] = ("episodes", "code"), limit: float = 900
) -> None:
    from knowledge_server._gen.knowledge.v1 import index_service_pb2_grpc

    stub = index_service_pb2_grpc.IndexServiceStub(channel)
    deadline = time.monotonic() + limit
    previous: list[tuple[str, int]] = []
    while time.monotonic() < deadline:
        st = stub.GetStatus(index_service_pb2.GetStatusRequest(), timeout=30)
        lanes = {lane.lane: lane for lane in st.lanes}
        counted = {"episodes": "events", "code": "chunks"}
        state = [
            (lanes[n].index_rev, lanes[n].counts[counted[n]]) for n in lanes_needed if n in lanes
        ]
        # Ready: every lane has rows, and the same revisions as two seconds ago (the start
        # may still be re-indexing a changed tree, which would retire the ids fetched).
        if len(state) == len(lanes_needed) and all(rev and n for rev, n in state):
            if state == previous:
                return
            previous = state
        time.sleep(2)
    raise RuntimeError("the server did not finish indexing in time")


def heavy_search(i: int) -> search_pb2.SearchRequest:
    words = TERMS[i % len(TERMS) :] + TERMS[: i % len(TERMS)]
    req = search_pb2.SearchRequest(
        schema="knowledge.search/v1", query=" ".join(words) + f" r{i}", limit=50
    )
    req.budget.max_tokens = 20000
    req.budget.snippet_chars = 1000
    req.include.extend(["episodes", "code", "skills"])
    return req


def probes(channel: grpc.Channel) -> dict[str, Callable[[int, float], object]]:
    from knowledge_server._gen.knowledge.v1 import (
        index_service_pb2_grpc,
        knowledge_service_pb2_grpc,
    )

    know = knowledge_service_pb2_grpc.KnowledgeServiceStub(channel)
    index = index_service_pb2_grpc.IndexServiceStub(channel)
    first = know.Search(heavy_search(0), timeout=60)
    episode_ids = [it.id for it in first.lanes.episodes.items] or ["ep:none:1"]
    chunk_ids = [it.id for it in first.lanes.code.items] or ["none"]

    def dispatch(i: int, timeout: float) -> object:
        req = dispatch_pb2.DispatchRequest(schema="knowledge.dispatch/v1", dry_run=True)
        req.task.text = " ".join(TERMS) + f" fix the failing test r{i}"
        return know.Dispatch(req, timeout=timeout)

    return {
        "Search": lambda i, t: know.Search(heavy_search(i + 1), timeout=t),
        "Dispatch": dispatch,
        "GetEpisode": lambda i, t: know.GetEpisode(
            knowledge_service_pb2.GetEpisodeRequest(
                id=episode_ids[i % len(episode_ids)], neighbours=20
            ),
            timeout=t,
        ),
        "GetChunk": lambda i, t: know.GetChunk(
            knowledge_service_pb2.GetChunkRequest(id=chunk_ids[i % len(chunk_ids)]), timeout=t
        ),
        "GetStatus": lambda i, t: index.GetStatus(index_service_pb2.GetStatusRequest(), timeout=t),
    }


def run_calls(
    ticker: Ticker, name: str, call: Callable[[int, float], object], rounds: int, timeout: float
) -> None:
    """``rounds`` calls one after another, each followed by a pause (so each call's hold
    on the loop is seen on its own, not added to the next one's); prints one line."""
    own: list[float] = []
    codes: Counter[str] = Counter()
    start = time.perf_counter()
    for i in range(rounds):
        t0 = time.perf_counter()
        try:
            call(i + (rounds if timeout < 60 else 0), timeout)
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1  # type: ignore[attr-defined]
        own.append((time.perf_counter() - t0) * 1000)
        time.sleep(PAUSE_S)
    window = ticker.window(start, time.perf_counter())
    answers = " ".join(f"{k}={v}" for k, v in sorted(codes.items()))
    print(
        f"  {name:<11} ticker max {max(window):7.1f} ms  p95 {pct(window, 95):6.1f} ms"
        f"   request p50 {statistics.median(own):7.1f} ms  max {max(own):7.1f} ms"
        f"  ({answers}; {len(window)} ticks)"
    )


def label(timeout: float) -> str:
    return "no deadline" if timeout >= 60 else f"deadline {timeout * 1000:.0f} ms"


def measure(address: str, rounds: int, deadlines: list[float]) -> None:
    channel = grpc.insecure_channel(address)
    wait_ready(channel)
    calls = probes(channel)
    with Ticker(address) as ticker:
        time.sleep(0.5)
        idle = ticker.window(time.perf_counter() - 0.4, time.perf_counter())
        print(f"  {'idle':<11} ticker max {max(idle):7.1f} ms  p95 {pct(idle, 95):6.1f} ms")
        for timeout in deadlines:
            print(f"  -- {label(timeout)}")
            for name, call in calls.items():
                run_calls(ticker, name, call, rounds, timeout)
    channel.close()


class SlowEmbeddings:
    """A local OpenAI-compatible embeddings endpoint; each answer takes ``delay`` seconds
    once ``slow`` is set (a remote provider having a bad minute)."""

    def __init__(self, delay: float) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        slow = self.slow = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if slow.is_set():
                    time.sleep(delay)
                data = [
                    {"index": i, "embedding": list(hashlib.sha256(t.encode()).digest()[:EMBED_DIM])}
                    for i, t in enumerate(body["input"])
                ]
                out = json.dumps({"data": data, "model": body["model"]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass  # the server stopped waiting

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.slow.clear()
        self._httpd.shutdown()
        self._httpd.server_close()


def measure_slow_embedder(path: str, delay: float, rounds: int) -> None:
    """Code-lane searches while the embedding endpoint takes ``delay`` s per answer, with no
    deadline and with a 500 ms one (lane timeout 60 s: only the caller's deadline bounds
    them)."""
    from knowledge_server._gen.knowledge.v1 import knowledge_service_pb2_grpc

    endpoint = SlowEmbeddings(delay)
    data = Path(tempfile.mkdtemp(prefix="kn-bench-loop-embed-"))
    env = {
        "PYTHONPATH": path,
        "KNOWLEDGE_LANE_TIMEOUT_MS": "60000",
        "KNOWLEDGE_EMBEDDER": "openai",
        "KNOWLEDGE_EMBEDDER_URL": endpoint.url,
        "KNOWLEDGE_EMBEDDER_MODEL": "bench",
        "KNOWLEDGE_EMBEDDER_DIM": str(EMBED_DIM),
    }
    try:
        with served(data, "--workspace", str(ROOT / "bench"), env=env) as (_, address):
            channel = grpc.insecure_channel(address)
            wait_ready(channel, ("code",))
            know = knowledge_service_pb2_grpc.KnowledgeServiceStub(channel)

            def search(i: int, timeout: float) -> object:
                req = search_pb2.SearchRequest(
                    schema="knowledge.search/v1", query=f"start the server {i}"
                )
                req.include.append("code")
                return know.Search(req, timeout=timeout)

            endpoint.slow.set()
            with Ticker(address) as ticker:
                time.sleep(0.5)
                for timeout in (60.0, 0.5):
                    run_calls(ticker, f"Search/{label(timeout)}", search, rounds, timeout)
            channel.close()
    finally:
        endpoint.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", action="append", type=Path, help="repository to serve from")
    ap.add_argument("--data", type=Path, help="data directory (default: a new temporary one)")
    ap.add_argument("--workspace", type=Path, default=ROOT, help="code tree to index")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--slow-embedder",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="also search the code lane behind an embedding endpoint this slow (0: skip)",
    )
    ap.add_argument(
        "--deadline-ms",
        type=float,
        default=50,
        help="the callers' deadline in the second pass (the first sets none)",
    )
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="kn-bench-loop-"))
    sessions = ["--sessions", str(SESSIONS)] if SESSIONS.is_dir() else []
    for checkout in args.checkout or [ROOT]:
        path = os.pathsep.join(str(checkout / p) for p in ("server", "sdk", "licensing"))
        env = {"PYTHONPATH": path}
        print(f"== {checkout} (data {data})")
        with served(data, "--workspace", str(args.workspace), *sessions, env=env) as (_, address):
            measure(address, args.rounds, [60.0, args.deadline_ms / 1000])
        if args.slow_embedder:
            print(f"  -- code lane behind an embedding endpoint taking {args.slow_embedder:g} s")
            measure_slow_embedder(path, args.slow_embedder, 3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
