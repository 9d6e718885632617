"""Live ingest: search latency with the session-log watcher on and off, side by side.

Usage: python bench/bench_live.py [--data DIR] [--searches 600] [--append-every 0.2]

Two `knowledge serve` processes on the same machine, each with its own data directory
holding the same ingested copy of the real session logs (``DIR/sessions``), both with
``session_paths`` pointing at that copy: one with ``watch_sessions`` on, one with it off.
While the searches run, a writer appends a record to a log in the copy every
``--append-every`` seconds (a busy harness), which the watching server ingests as it goes
(its index revision moves, so its caches are invalidated too: the real cost of live
ingest). Searches alternate between the two servers, one client, queries drawn from the
logs' words, so both see the same machine at the same moment. Prints P50/P95/P99 per
server and how many appended records the watching server took in.
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
    args = ap.parse_args()
    rng = random.Random(25)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        logs = tmp / "sessions"
        shutil.copytree(Path(args.data) / "sessions", logs)
        live_log = logs / "bench-live.jsonl"
        live_log.write_text("")
        queries = words_of(logs, args.searches, rng)
        common = {"KNOWLEDGE_SESSION_PATHS": str(logs), "KNOWLEDGE_WORKSPACES": str(logs)}
        with (
            served(
                tmp / "on", "--no-bootstrap", env={**common, "KNOWLEDGE_WATCH_SESSIONS": "true"}
            ) as (_p1, addr_on),
            served(
                tmp / "off", "--no-bootstrap", env={**common, "KNOWLEDGE_WATCH_SESSIONS": "false"}
            ) as (_p2, addr_off),
        ):
            clients = {"on": KnowledgeClient(addr_on), "off": KnowledgeClient(addr_off)}
            for kc in clients.values():
                for _ in kc.ingest_sessions([str(logs)]):
                    pass
                for q in queries[:50]:  # warm both alike
                    kc.search(q, include=["episodes"])
            times: dict[str, list[float]] = {"on": [], "off": []}
            stop = threading.Event()
            appended = [0]
            writer = threading.Thread(
                target=appender, args=(live_log, args.append_every, stop, appended)
            )
            writer.start()
            try:
                for i, q in enumerate(queries):
                    order = ("on", "off") if i % 2 == 0 else ("off", "on")
                    for name in order:
                        t0 = time.perf_counter()
                        clients[name].search(q, include=["episodes"])
                        times[name].append((time.perf_counter() - t0) * 1000)
            finally:
                stop.set()
                writer.join()
            time.sleep(1.0)
            seen = clients["on"].search("appended while searching", include=["episodes"], limit=1)
            took_in = seen.lanes.episodes.counts.indexed_docs
            off_docs = (
                clients["off"]
                .search("appended while searching", include=["episodes"], limit=1)
                .lanes.episodes.counts.indexed_docs
            )
            for kc in clients.values():
                kc.close()
    print(
        f"== live ingest: {args.searches} searches per server, alternating; "
        f"{appended[0]} records appended, one every {args.append_every} s"
    )
    print("| watcher | P50 ms | P95 ms | P99 ms | mean ms | events indexed at the end |")
    print("|---|---|---|---|---|---|")
    for name, docs in (("on", took_in), ("off", off_docs)):
        t = times[name]
        print(
            f"| {name} | {pct(t, 50):.2f} | {pct(t, 95):.2f} | {pct(t, 99):.2f} | "
            f"{statistics.mean(t):.2f} | {docs} |"
        )


if __name__ == "__main__":
    main()
