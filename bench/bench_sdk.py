#!/usr/bin/env python3
"""The Python SDK's own cost per search answer: decoding the bytes the server sends.

Starts `knowledge serve` on a data directory (default: a fresh one that indexes this
repository's `server/` folder and the bundled sample logs), fetches the raw bytes of the
answers to a fixed list of questions over a plain gRPC channel, and times how the SDK turns
those bytes into its typed messages (the same function its clients use), next to protobuf's
own C decoder (upb) for reference. Prints median and P95 per answer, and the answer sizes.

Run it with another checkout's SDK first on PYTHONPATH to compare two versions side by side.

Usage: python bench/bench_sdk.py [--data DIR] [--rounds 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from served import served  # noqa: E402 - after the path above

QUESTIONS = [
    "where is the config loaded",
    "who fixed the failing test",
    "how is the licence verified",
    "where are tokens checked",
    "how does dispatch write the outbox package",
    "rate limit exceeded error",
]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def sdk_decoder() -> Callable[[bytes], object]:
    """The function the SDK's clients decode a SearchResponse with."""
    from knowledge_sdk import client
    from knowledge_sdk._gen.knowledge import v1

    legacy = getattr(client, "_de", None)  # older SDKs: a hand-written reader
    if legacy is not None:
        return legacy(v1.SearchResponse)  # type: ignore[no-any-return]
    return v1.SearchResponse.parse


def raw_answers(address: str) -> list[bytes]:
    from knowledge_server._gen.knowledge.v1 import search_pb2

    channel = grpc.insecure_channel(address)
    call = channel.unary_unary(
        "/knowledge.v1.KnowledgeService/Search",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )
    out = []
    for q in QUESTIONS:
        # Twenty items and room for them: answers of about 10 KB.
        req = search_pb2.SearchRequest(schema="knowledge.search/v1", query=q, limit=20)
        req.budget.max_tokens = 4000
        out.append(call(req, timeout=60))
    channel.close()
    return out


def timed(fn: Callable[[bytes], object], raw: list[bytes], rounds: int) -> list[float]:
    per_answer = []
    for _ in range(rounds):
        for b in raw:
            t0 = time.perf_counter()
            fn(b)
            per_answer.append((time.perf_counter() - t0) * 1000)
    return per_answer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="data directory (default: a new temporary one)")
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="kn-bench-sdk-"))
    with served(data, "--workspace", str(ROOT / "server")) as (_proc, address):
        # The first start indexes and ingests in the background: wait for code evidence.
        deadline = time.monotonic() + 300
        raw = raw_answers(address)
        while time.monotonic() < deadline and min(len(b) for b in raw) < 8000:
            time.sleep(2)
            raw = raw_answers(address)
        from knowledge_server._gen.knowledge.v1 import search_pb2

        sizes = sorted(len(b) for b in raw)
        print(
            f"{len(raw)} answers, {sizes[0]}-{sizes[-1]} bytes (median {statistics.median(sizes):.0f})"
        )
        for name, fn in (
            ("SDK decoder", sdk_decoder()),
            ("upb (reference)", search_pb2.SearchResponse.FromString),
        ):
            ms = timed(fn, raw, args.rounds)
            print(
                f"== {name}: p50={statistics.median(ms):.3f} ms  p95={pct(ms, 95):.3f} ms per answer"
                f"  ({len(ms)} decodes)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
