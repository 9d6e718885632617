#!/usr/bin/env python3
"""Search over gRPC with metrics and tracing on against off, side by side; and the
TypeScript client's search round trip next to the Python SDK's.

`knowledge serve` processes on the same data directory (the one bench_search.py builds:
the standard library as the code workspace, the real session logs replayed to --events, the
real skills), one worker each:

* off: the defaults (no metrics, no tracing);
* off, again: a second one, the control: its difference from the first is the noise of
  the run;
* metrics: `--metrics-listen` alone;
* on: `--metrics-listen` and `--tracing-otlp-endpoint` pointing at an OTLP/gRPC sink in
  this process, which receives and counts the spans, with the default
  `tracing_sample_ratio`;
* on, every call: the same with `tracing_sample_ratio = 1`;
* with `--before DIR` (another checkout, e.g. `git archive` of an older commit): its "on"
  (its own default ratio) and "on, 10%" (`tracing_sample_ratio = 0.1`), served from DIR's
  code.

All get the same never-seen questions (a made-up word per question, so no cache answers)
from Python SDK clients, one call at a time, rotating the servers question by question; each
server's CPU time over the phase is read from /proc too (the figure least moved by the
machine's other work), split into its main thread's (the event loop, where calls run and
make their spans) and the other threads' (the batch span exporter, gRPC's). Latency is
also compared round by round against that round's off server. Then, unless `--no-clients`, against the off server, rounds alternate
the Python SDK and the TypeScript client (clients/typescript, built with `npm run build` if
needed; one node process per round running bench/ts_search.mjs).

Usage: python bench/bench_telemetry.py [--data DIR] [--rounds 6] [--requests 200]
       [--before DIR] [--no-clients]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_search import QUERIES, build, copy_workspace, pct, server_cpu_s, unseen_word  # noqa: E402 - after the path above
from served import served  # noqa: E402 - after the path above

TS_CLIENT = ROOT / "clients" / "typescript"


class _Sink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace collector that counts what it receives."""

    def __init__(self) -> None:
        self.spans = 0
        self.exports = 0

    def Export(self, request: Any, context: Any) -> Any:
        self.exports += 1
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not installed")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the server's main thread (its event loop, where calls run; the
    batch span processor and gRPC's threads are the others)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def question(i: int, tag: int) -> str:
    return f"{QUERIES[i % len(QUERIES)]} {unseen_word(i, tag)}"


def sdk_round(address: str, requests: int, tag: int) -> list[float]:
    from knowledge_sdk import KnowledgeClient

    out: list[float] = []
    with KnowledgeClient(address, timeout=30) as kc:
        kc.search("warm up")
        for i in range(requests):
            t = time.perf_counter()
            kc.search(question(i, tag))
            out.append((time.perf_counter() - t) * 1000)
    return out


def paired_round(addresses: dict[str, str], requests: int, tag: int) -> dict[str, list[float]]:
    """Each question to every server, one after the other, the order rotated every
    question, so all see the same phases of the machine."""
    from knowledge_sdk import KnowledgeClient

    names = list(addresses)
    clients = {name: KnowledgeClient(address, timeout=30) for name, address in addresses.items()}
    out: dict[str, list[float]] = {name: [] for name in names}
    try:
        for kc in clients.values():
            kc.search("warm up")
        for i in range(requests):
            q = question(i, tag)
            k = i % len(names)
            for name in names[k:] + names[:k]:
                t = time.perf_counter()
                clients[name].search(q)
                out[name].append((time.perf_counter() - t) * 1000)
    finally:
        for kc in clients.values():
            kc.close()
    return out


def ts_round(address: str, requests: int, tag: int) -> list[float]:
    questions = [question(i, tag) for i in range(requests)]
    result = subprocess.run(
        [tool("node"), str(ROOT / "bench" / "ts_search.mjs"), address],
        input=json.dumps(questions),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return [float(x) for x in json.loads(result.stdout)]


def summary(name: str, lat: list[float]) -> str:
    return f"{name}: n={len(lat)} p50={statistics.median(lat):.2f} ms p95={pct(lat, 95):.2f} ms"


def diff(a: float, b: float) -> str:
    return f"{(b - a) / a * 100:+.1f}%"


def report(
    lat: dict[str, list[float]],
    round_diffs: dict[str, list[tuple[float, float]]],
    pids: dict[str, int],
    cpu: dict[str, float],
    main_cpu: dict[str, float],
    searches: dict[str, int],
) -> None:
    """Each server's latency and CPU per search against the off server's."""
    servers = list(lat)
    per = {name: (server_cpu_s(pids[name]) - cpu[name]) / searches[name] * 1000 for name in servers}
    on_main = {
        name: (main_thread_cpu_s(pids[name]) - main_cpu[name]) / searches[name] * 1000
        for name in servers
    }
    base_p50, base_p95 = statistics.median(lat["off"]), pct(lat["off"], 95)
    for name in servers:
        p50, p95 = statistics.median(lat[name]), pct(lat[name], 95)
        versus = (
            ""
            if name == "off"
            else f"  vs off: p50 {diff(base_p50, p50)}, p95 {diff(base_p95, p95)},"
            f" CPU {diff(per['off'], per[name])}"
        )
        print(
            f"{summary(f'{name:15}', lat[name])}  server CPU {per[name]:.2f} ms/search"
            f" (loop thread {on_main[name]:.2f}, other threads"
            f" {per[name] - on_main[name]:.2f}){versus}"
        )
    print(
        "the same, per round against that round's off (the median over rounds, and the"
        " smallest and largest; a round's servers share its load):"
    )
    for name in servers[1:]:
        p50s = sorted(d[0] * 100 for d in round_diffs[name])
        p95s = sorted(d[1] * 100 for d in round_diffs[name])
        print(
            f"  {name:15}: p50 {statistics.median(p50s):+.1f}% ({p50s[0]:+.1f}..{p50s[-1]:+.1f}),"
            f" p95 {statistics.median(p95s):+.1f}% ({p95s[0]:+.1f}..{p95s[-1]:+.1f})"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=200, help="searches per server per round")
    ap.add_argument("--data", type=Path, help="reuse/keep this data directory")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--before", type=Path, help="a checkout to serve 'before' variants from")
    ap.add_argument("--no-clients", action="store_true", help="skip Python SDK vs TypeScript")
    args = ap.parse_args()
    base = args.data or Path(tempfile.mkdtemp(prefix="kn-bench-telemetry-"))
    data = base / "corpus"
    if not (data / "code.sqlite").exists():
        build(data, args.events, args.shared)
    workspace = copy_workspace(base / "workspace")
    if not args.no_clients and not (TS_CLIENT / "dist" / "src" / "index.js").exists():
        subprocess.run([tool("npm"), "run", "build"], cwd=TS_CLIENT, check=True)

    sink = _Sink()
    collector = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, collector)
    otlp_port = collector.add_insecure_port("127.0.0.1:0")
    collector.start()
    common = ("--no-bootstrap", "--workspace", str(workspace), "--workers", "1")
    otlp = ("--tracing-otlp-endpoint", f"http://127.0.0.1:{otlp_port}")
    code: dict[str, str] = {}  # this checkout's code (the bench's own PYTHONPATH)
    if args.before is not None:
        before = args.before.resolve()
        code_before = {
            "PYTHONPATH": ":".join(str(before / p) for p in ("server", "sdk", "licensing"))
        }
    # name -> (tracing arguments, sample ratio ("": the default), metrics, code)
    variants: dict[str, tuple[tuple[str, ...], str, bool, dict[str, str]]] = {
        "off": ((), "", False, code),
        "off, again": ((), "", False, code),
        "metrics": ((), "", True, code),
        "on": (otlp, "", True, code),
        "on, every call": (otlp, "1.0", True, code),
    }
    if args.before is not None:
        variants["before: on"] = (otlp, "", True, code_before)
        variants["before: on, 10%"] = (otlp, "0.1", True, code_before)
    servers = list(variants)
    metrics_ports: dict[str, int] = {}
    lat: dict[str, list[float]] = {name: [] for name in servers}
    round_diffs: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    try:
        with contextlib.ExitStack() as stack:
            procs = {}
            addresses = {}
            for name, (tracing_args, ratio, with_metrics, env) in variants.items():
                serve_args: tuple[str, ...] = (*common, *tracing_args)
                if with_metrics:
                    metrics_ports[name] = free_port()
                    serve_args += ("--metrics-listen", f"127.0.0.1:{metrics_ports[name]}")
                env = {**env, "KNOWLEDGE_TRACING_SAMPLE_RATIO": ratio} if ratio else env
                procs[name], addresses[name] = stack.enter_context(
                    served(data, *serve_args, env=env)
                )
            off = addresses["off"]
            pids = {name: proc.pid for name, proc in procs.items()}
            print(f"servers: {addresses} (metrics {metrics_ports}, OTLP sink :{otlp_port})")
            for name in servers:  # page cache and the lanes' memos, not measured
                sdk_round(addresses[name], args.requests, 999)
            print(
                "== Search, metrics and tracing off vs on: the same never-seen questions, "
                "one call at a time, rotating servers question by question"
            )
            cpu = {name: server_cpu_s(pid) for name, pid in pids.items()}
            main_cpu = {name: main_thread_cpu_s(pid) for name, pid in pids.items()}
            for r in range(args.rounds):
                row = paired_round(addresses, args.requests, 1000 + r)
                print(
                    f"round {r + 1}: "
                    + " | ".join(
                        f"{name} p50 {statistics.median(v):.2f} p95 {pct(v, 95):.2f}"
                        for name, v in row.items()
                    )
                    + " ms"
                )
                for name in servers:
                    lat[name].extend(row[name])
                    off50, off95 = statistics.median(row["off"]), pct(row["off"], 95)
                    round_diffs[name].append(
                        (statistics.median(row[name]) / off50 - 1, pct(row[name], 95) / off95 - 1)
                    )
            time.sleep(6)  # the batch span processor exports every 5 s: its cost is counted
            searches = {name: len(lat[name]) + args.rounds for name in servers}
            report(lat, round_diffs, pids, cpu, main_cpu, searches)
            for name, port in metrics_ports.items():
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                calls = [
                    line.rsplit(" ", 1)[-1]
                    for line in text.splitlines()
                    if line.startswith("knowledge_rpc_calls_total") and "Search" in line
                ]
                print(f"{name!r} server: Search calls counted {calls}")
            print(f"OTLP sink received {sink.spans} spans in {sink.exports} exports")
            if args.no_clients:
                return 0

            print("== Search round trip: Python SDK vs TypeScript client (against the off server)")
            clients: dict[str, list[float]] = {"python": [], "typescript": []}
            for r in range(args.rounds):
                order = ("python", "typescript") if r % 2 == 0 else ("typescript", "python")
                for name in order:
                    tag = 2000 + 10 * r + (0 if name == "python" else 1)
                    run = sdk_round if name == "python" else ts_round
                    clients[name].extend(run(off, args.requests, tag))
            print(summary("python SDK   ", clients["python"]))
            print(summary("typescript   ", clients["typescript"]))
            print(
                "typescript vs python: p50 "
                f"{diff(statistics.median(clients['python']), statistics.median(clients['typescript']))}, "
                f"p95 {diff(pct(clients['python'], 95), pct(clients['typescript'], 95))}"
            )
    finally:
        collector.stop(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
