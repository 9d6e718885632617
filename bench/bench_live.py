"""Live ingest: search latency with the session-log watcher on and off, side by side.

Usage: python bench/bench_live.py [--data DIR] [--searches 600] [--append-every 0.2]
       [--before TREE]

Two `knowledge serve` processes on the same machine, each with its own data directory
holding the same ingested copy of the real session logs (``DIR/sessions``), both with
``session_paths`` pointing at that copy: one with ``watch_sessions`` on, one with it off.
While the searches run, a writer appends a record to a log in the copy every
``--append-every`` seconds (a busy harness), which the watching server ingests as it goes
(its index revision moves, so its caches are invalidated too: the real cost of live
ingest). Searches alternate between the two servers, one client, queries drawn from the
logs' words, so both see the same machine at the same moment. Prints per server P50, P95,
P99, the CPU time its serving process used during the searches (its own threads: a watcher
in a child process is not counted) and how many events it held at the end; then for each
watching server the difference of its P95 from the other's with a 95% bootstrap interval
(an interval that holds 0: no difference this run can tell from noise).

``--before TREE``: one more server, watcher on, serving the code of another checkout
(``TREE/server`` and its siblings on PYTHONPATH), in the same rotation: before and
after a change in one run. ``--control``: one more server with the watcher off, whose
difference from the first shows how far two like servers differ in this run (where each
process lands on the machine's cores moves its tail; the bootstrap interval cannot see
that).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from knowledge_sdk import KnowledgeClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import served

REPO = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    i = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[i]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far (its own threads, not its
    children: a watcher process of its own is not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p95_diff(a: list[float], b: list[float], rng: random.Random) -> tuple[float, float, float]:
    """P95(a) - P95(b) and its 95% bootstrap interval (1000 resamples of each)."""
    draws = sorted(
        pct(rng.choices(a, k=len(a)), 95) - pct(rng.choices(b, k=len(b)), 95) for _ in range(1000)
    )
    return pct(a, 95) - pct(b, 95), draws[25], draws[974]


def words_of(root: Path, n: int, rng: random.Random) -> list[str]:
    vocab: set[str] = set()
    for f in root.rglob("*"):
        if f.is_file() and f.suffix in (".jsonl", ".json", ".md"):
            vocab.update(re.findall(r"[a-z]{5,12}", f.read_text(errors="ignore").lower()))
    pool = sorted(vocab)
    return [" ".join(rng.sample(pool, 2)) for _ in range(n)]


def appender(log: Path, every: float, stop: threading.Event, counter: list[int]) -> None:
    seq = 0
    while not stop.wait(every):
        seq += 1
        rec = {
            "session_id": "bench-live",
            "seq": seq,
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cwd": str(log.parent),
            "harness": "generic",
            "role": "assistant",
            "text": f"live bench record {seq} appended while searching",
        }
        with log.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        counter[0] = seq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--data",
        default=os.environ.get("KNOWLEDGE_SHARED_DATA", str(REPO.parent / "shared" / "data")),
    )
    ap.add_argument("--searches", type=int, default=600)
    ap.add_argument("--append-every", type=float, default=0.2)
    ap.add_argument("--before", default="", help="a checkout whose code a third server runs")
    ap.add_argument(
        "--control", action="store_true", help="a second server with the watcher off (noise floor)"
    )
    args = ap.parse_args()
    rng = random.Random(25)
    with tempfile.TemporaryDirectory() as tmp_s, ExitStack() as stack:
        tmp = Path(tmp_s)
        logs = tmp / "sessions"
        shutil.copytree(Path(args.data) / "sessions", logs)
        live_log = logs / "bench-live.jsonl"
        live_log.write_text("")
        queries = words_of(logs, args.searches, rng)
        common = {"KNOWLEDGE_SESSION_PATHS": str(logs), "KNOWLEDGE_WORKSPACES": str(logs)}
        setups = {
            "on": {**common, "KNOWLEDGE_WATCH_SESSIONS": "true"},
            "off": {**common, "KNOWLEDGE_WATCH_SESSIONS": "false"},
        }
        if args.before:
            tree = Path(args.before).resolve()
            path = os.pathsep.join(str(tree / d) for d in ("server", "sdk", "licensing", "bridge"))
            setups["on (before)"] = {**setups["on"], "PYTHONPATH": path}
        if args.control:
            setups["off (2)"] = setups["off"]
        pids: dict[str, int] = {}
        clients: dict[str, KnowledgeClient] = {}
        for i, (name, env) in enumerate(setups.items()):
            proc, address = stack.enter_context(served(tmp / f"d{i}", "--no-bootstrap", env=env))
            pids[name], clients[name] = proc.pid, KnowledgeClient(address)
        names = list(clients)
        for kc in clients.values():
            for _ in kc.ingest_sessions([str(logs)]):
                pass
            for q in queries[:50]:  # warm every server alike
                kc.search(q, include=["episodes"])
        times: dict[str, list[float]] = {name: [] for name in names}
        stop = threading.Event()
        appended = [0]
        writer = threading.Thread(
            target=appender, args=(live_log, args.append_every, stop, appended)
        )
        writer.start()
        cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        try:
            for i, q in enumerate(queries):
                k = i % len(names)
                for name in names[k:] + names[:k]:  # each server first as often
                    t0 = time.perf_counter()
                    clients[name].search(q, include=["episodes"])
                    times[name].append((time.perf_counter() - t0) * 1000)
        finally:
            stop.set()
            writer.join()
        cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
        time.sleep(1.5)
        docs = {
            name: kc.search(
                "appended while searching", include=["episodes"], limit=1
            ).lanes.episodes.counts.indexed_docs
            for name, kc in clients.items()
        }
        for kc in clients.values():
            kc.close()
    print(
        f"== live ingest: {args.searches} searches per server, rotating; "
        f"{appended[0]} records appended, one every {args.append_every} s"
    )
    print(
        "| watcher | P50 ms | P95 ms | P99 ms | mean ms | serving process CPU s "
        "| events indexed at the end |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in names:
        t = times[name]
        print(
            f"| {name} | {pct(t, 50):.2f} | {pct(t, 95):.2f} | {pct(t, 99):.2f} | "
            f"{statistics.mean(t):.2f} | {cpu[name]:.2f} | {docs[name]} |"
        )
    for name in names:
        if name != "off":
            d, lo, hi = p95_diff(times[name], times["off"], rng)
            print(f"P95 {name} - off: {d:+.2f} ms (95% interval {lo:+.2f} .. {hi:+.2f})")
    if "on (before)" in times:
        d, lo, hi = p95_diff(times["on"], times["on (before)"], rng)
        print(f"P95 on - on (before): {d:+.2f} ms (95% interval {lo:+.2f} .. {hi:+.2f})")


if __name__ == "__main__":
    main()
