#!/usr/bin/env python3
"""Soak: 16 searching clients, a live ingest and a re-index against one server, for minutes.

Starts `knowledge serve` as a separate process on a free loopback port (``--workers 2``) over
a small data directory: this repository's own tree as the code workspace, and the bundled
sample log and the test fixtures' logs as the session logs (built in seconds; ``--data DIR``
keeps and reuses it). Then, together and until the time is up:

* 16 SDK clients (one connection each) search without pause, every question with a word of
  its own so that no answer comes from the cache;
* a live ingest appends records to a session log inside the ingested folder and calls
  IngestSessions every few seconds (``--ingest-every``);
* a re-index edits a file of the indexed workspace and calls IndexWorkspace about every 30 s
  (``--index-every``).

Every call is bounded by the clock and stops by itself. Printed: the errors by operation and
status code, P50 / P95 / P99 search latency per minute and overall, the server's resident
memory (its process and its serving workers, read from /proc) over time, and its growth from
the end of the first full minute to the end of the run. Target: 0 errors, growth under 5 %.

Usage: python bench/soak.py [--minutes 10] [--clients 16] [--data DIR] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_search import QUERIES, pct, unseen_word  # noqa: E402 - after the path above
from served import served  # noqa: E402 - after the path above

LIVE_SESSION = "soak-live"
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules"}


@dataclass
class Tally:
    """What the run saw, filled in by the tasks as calls complete."""

    t0: float
    minutes: int
    searches: list[list[float]] = field(default_factory=list)  # latencies (ms) per minute
    errors: Counter[str] = field(default_factory=Counter)  # "operation CODE" -> count
    ingests: list[float] = field(default_factory=list)  # ms per IngestSessions call
    indexes: list[float] = field(default_factory=list)  # ms per IndexWorkspace call
    events_appended: int = 0
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds, KiB)

    def __post_init__(self) -> None:
        self.searches = [[] for _ in range(self.minutes)]

    def minute(self) -> int:
        """The minute a call that completes now counts to (the last one takes the stragglers)."""
        return min(self.minutes - 1, int((time.perf_counter() - self.t0) // 60))

    def error(self, operation: str, exc: BaseException) -> None:
        code = getattr(exc, "code", None)
        self.errors[f"{operation} {getattr(code, 'name', type(exc).__name__)}"] += 1


def build_inputs(base: Path) -> tuple[Path, Path, Path]:
    """The workspace (a copy of this repository's tree) and the session logs (the bundled
    sample and the fixtures' logs), copied once under ``base``."""
    workspace, sessions, data = base / "workspace", base / "sessions", base / "data"
    if not workspace.exists():

        def ignore(_d: str, names: list[str]) -> set[str]:
            return {n for n in names if n in SKIP_DIRS or n.endswith(".pyc")}

        shutil.copytree(ROOT, workspace, ignore=ignore, symlinks=True)
    if not sessions.exists():
        logs = [ROOT / "server/knowledge_server/episodes/sample/sample_session.jsonl"]
        logs += sorted((ROOT / "tests" / "fixtures").glob("**/logs/**/*.jsonl"))
        for i, log in enumerate(logs):
            dst = sessions / f"{i:02d}-{log.parent.name}" / log.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, dst)
        (sessions / "live").mkdir(parents=True)
    data.mkdir(parents=True, exist_ok=True)
    return workspace, sessions, data


def server_rss_kib(pid: int) -> int:
    """Resident memory of the server process and its serving workers (its children started
    as spawned Python processes), from /proc; helpers such as multiprocessing's resource
    tracker and forkserver, and the short-lived indexing workers, are left out."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        own = int(entry.name) == pid
        worker = int(fields.get("PPid", "0").strip() or 0) == pid and "spawn_main" in cmdline
        if (own or worker) and "VmRSS" in fields:
            total += int(fields["VmRSS"].split()[0])
    return total


async def searcher(address: str, n: int, deadline: float, tally: Tally) -> None:
    from knowledge_sdk import AsyncKnowledgeClient

    i = 0
    async with AsyncKnowledgeClient(address, timeout=30) as kc:
        while time.perf_counter() < deadline:
            q = f"{QUERIES[(i + n) % len(QUERIES)]} {unseen_word(i, n)}"
            i += 1
            t = time.perf_counter()
            try:
                await kc.search(q)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, not raised
                tally.error("Search", exc)
                continue
            tally.searches[tally.minute()].append((time.perf_counter() - t) * 1000)


def live_record(seq: int, workspace: Path) -> dict[str, object]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record: dict[str, object] = {
        "session_id": LIVE_SESSION,
        "seq": seq,
        "time": now,
        "role": "user" if seq % 2 else "assistant",
        "text": f"soak record {seq}: checking the live ingest {unseen_word(seq, 7)}",
    }
    if seq == 1:
        record |= {"harness": "generic", "cwd": str(workspace), "title": "soak live session"}
    return record


async def ingester(
    address: str, sessions: Path, workspace: Path, every: float, deadline: float, tally: Tally
) -> None:
    """Append records to the live log, then IngestSessions over the whole sessions folder."""
    from knowledge_sdk import AsyncKnowledgeClient

    log = sessions / "live" / f"{LIVE_SESSION}.jsonl"
    seq = len(log.read_text().splitlines()) if log.exists() else 0
    async with AsyncKnowledgeClient(address, timeout=120) as kc:
        while time.perf_counter() < deadline:
            with log.open("a") as f:
                for _ in range(10):
                    seq += 1
                    f.write(json.dumps(live_record(seq, workspace)) + "\n")
            tally.events_appended += 10
            t = time.perf_counter()
            try:
                async for _ in kc.ingest_sessions([str(sessions)]):
                    pass
                tally.ingests.append((time.perf_counter() - t) * 1000)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, not raised
                tally.error("IngestSessions", exc)
            await asyncio.sleep(max(0.0, min(every, deadline - time.perf_counter())))


async def reindexer(
    address: str, workspace: Path, every: float, deadline: float, tally: Tally
) -> None:
    """Edit one file of the workspace, then IndexWorkspace over it."""
    from knowledge_sdk import AsyncKnowledgeClient

    touched = workspace / "bench" / "soak_touched.py"
    touched.parent.mkdir(parents=True, exist_ok=True)
    round_ = 0
    async with AsyncKnowledgeClient(address, timeout=300) as kc:
        while time.perf_counter() < deadline:
            await asyncio.sleep(max(0.0, min(every, deadline - time.perf_counter())))
            if time.perf_counter() >= deadline:
                break
            round_ += 1
            touched.write_text(
                f'"""Edited by the soak, round {round_}."""\n\n'
                f"def soak_round_{round_}() -> str:\n    return {unseen_word(round_, 9)!r}\n"
            )
            t = time.perf_counter()
            try:
                async for _ in kc.index_workspace(str(workspace)):
                    pass
                tally.indexes.append((time.perf_counter() - t) * 1000)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, not raised
                tally.error("IndexWorkspace", exc)


def fmt_lat(values: list[float]) -> str:
    if not values:
        return "no searches"
    return (
        f"{len(values):6d} searches  p50={statistics.median(values):6.1f}  "
        f"p95={pct(values, 95):6.1f}  p99={pct(values, 99):6.1f} ms"
    )


def rss_at(tally: Tally, seconds: float) -> int:
    """The last sample taken at or before ``seconds`` (the first one if none)."""
    taken = [kib for s, kib in tally.rss if s <= seconds]
    return taken[-1] if taken else tally.rss[0][1]


async def soak(
    address: str, pid: int, workspace: Path, sessions: Path, args: argparse.Namespace
) -> Tally:
    tally = Tally(t0=time.perf_counter(), minutes=args.minutes)
    deadline = tally.t0 + args.minutes * 60

    async def sample_rss() -> None:
        while time.perf_counter() < deadline:
            tally.rss.append((time.perf_counter() - tally.t0, server_rss_kib(pid)))
            await asyncio.sleep(args.rss_every)

    async def report_minutes() -> None:
        for m in range(args.minutes):
            await asyncio.sleep(max(0.0, tally.t0 + (m + 1) * 60 - time.perf_counter()))
            if m + 1 == args.minutes:
                return  # the last minute is printed once its stragglers are in
            print(
                f"minute {m + 1:3d}: {fmt_lat(tally.searches[m])}  "
                f"rss={server_rss_kib(pid) / 1024:7.1f} MiB  errors={sum(tally.errors.values())}",
                flush=True,
            )

    await asyncio.gather(
        sample_rss(),
        report_minutes(),
        ingester(address, sessions, workspace, args.ingest_every, deadline, tally),
        reindexer(address, workspace, args.index_every, deadline, tally),
        *(searcher(address, n, deadline, tally) for n in range(args.clients)),
    )
    tally.rss.append((time.perf_counter() - tally.t0, server_rss_kib(pid)))
    m = args.minutes
    print(
        f"minute {m:3d}: {fmt_lat(tally.searches[m - 1])}  "
        f"rss={tally.rss[-1][1] / 1024:7.1f} MiB  errors={sum(tally.errors.values())}"
    )
    return tally


async def prepare(address: str, workspace: Path, sessions: Path) -> None:
    """Index, ingest and derive once before the soak (quick when the data is kept)."""
    from knowledge_sdk import AsyncKnowledgeClient

    t = time.perf_counter()
    async with AsyncKnowledgeClient(address, timeout=600) as kc:
        async for _ in kc.index_workspace(str(workspace)):
            pass
        async for _ in kc.ingest_sessions([str(sessions)]):
            pass
        async for _ in kc.rebuild_derived():
            pass
        st = await kc.get_status()
    counts = {lane.lane: dict(lane.counts) for lane in st.lanes}
    print(
        f"prepared in {time.perf_counter() - t:.1f}s: episodes={counts.get('episodes')} "
        f"code={counts.get('code')} skills={counts.get('skills')}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=10, help="length of the soak (default 10)")
    ap.add_argument("--clients", type=int, default=16, help="searching clients (default 16)")
    ap.add_argument("--data", type=Path, help="reuse/keep this directory (data, workspace, logs)")
    ap.add_argument("--workers", type=int, default=2, help="serve --workers (default 2)")
    ap.add_argument("--ingest-every", type=float, default=5.0, help="seconds between ingests")
    ap.add_argument("--index-every", type=float, default=30.0, help="seconds between re-indexes")
    ap.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    args = ap.parse_args()
    if args.minutes < 2:
        ap.error("--minutes must be at least 2 (growth is measured from the end of minute 1)")
    base = args.data or Path(tempfile.mkdtemp(prefix="kn-soak-"))
    workspace, sessions, data = build_inputs(base)
    serve_args = ("--no-bootstrap", "--workspace", str(workspace), "--sessions", str(sessions))
    with served(data, *serve_args, "--workers", str(args.workers), stop_timeout=60) as (
        proc,
        address,
    ):
        assert address.startswith("127.0.0.1:"), address
        print(f"server {address} (pid {proc.pid}, --workers {args.workers}), data {base}")
        asyncio.run(prepare(address, workspace, sessions))
        print(
            f"soak: {args.minutes} min, {args.clients} searching clients, ingest every "
            f"{args.ingest_every:g}s, re-index every {args.index_every:g}s",
            flush=True,
        )
        tally = asyncio.run(soak(address, proc.pid, workspace, sessions, args))
        from knowledge_sdk import KnowledgeClient

        with KnowledgeClient(address) as kc:
            lanes = {lane.lane: dict(lane.counts) for lane in kc.get_status().lanes}
        print(f"after the soak: episodes={lanes.get('episodes')} code={lanes.get('code')}")
    every = [ms for minute in tally.searches for ms in minute]
    print(f"overall:    {fmt_lat(every)}  ({len(every) / (args.minutes * 60):.0f} searches/s)")
    print(
        f"ingest:     {len(tally.ingests)} IngestSessions calls, {tally.events_appended} records "
        f"appended, p50={statistics.median(tally.ingests or [0]):.0f} ms "
        f"max={max(tally.ingests or [0]):.0f} ms"
    )
    print(
        f"re-index:   {len(tally.indexes)} IndexWorkspace calls, "
        f"p50={statistics.median(tally.indexes or [0]):.0f} ms "
        f"max={max(tally.indexes or [0]):.0f} ms"
    )
    by_code = ", ".join(f"{k}: {v}" for k, v in sorted(tally.errors.items()))
    print(f"errors:     {sum(tally.errors.values())}" + (f" ({by_code})" if by_code else ""))
    print(
        "rss (MiB):  "
        + "  ".join(
            f"{s:.0f}s={kib / 1024:.1f}"
            for s, kib in tally.rss[:: max(1, round(30 / args.rss_every))]
        )
        + f"  end={tally.rss[-1][1] / 1024:.1f}"
    )
    first, last = rss_at(tally, 60), tally.rss[-1][1]
    print(
        f"rss growth: {first / 1024:.1f} MiB after minute 1 -> {last / 1024:.1f} MiB at the end: "
        f"{(last - first) / first * 100:+.1f}% (targets: 0 errors, growth under 5%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
