#!/usr/bin/env python3
"""End-to-end Search over gRPC at scale: >=10k code chunks, >=100k episode events, the real skills.

Builds a data directory (the Python standard library as the code workspace; the real session
logs replayed under new session ids up to --events; the real SKILL.md catalog), starts
`knowledge serve` as a separate process on a free loopback port, and measures:

* one client, sequential: P50 / P95 / P99 latency;
* 16 concurrent clients (asyncio, one channel each): throughput and P95.

The server runs with ``--workers 2`` (one process per core here); every client has its own
connection, as separate agents would. Answers with a degraded lane are counted.

Usage: python bench/bench_search.py [--events 100000] [--requests 1000] [--workers N] [--data DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from served import served  # noqa: E402 - after the path above

QUERIES = [
    "who fixed the failing test",
    "where is the json decoder defined",
    "кто чинил доступ к MySQL",
    "会员退款多久到账？",
    "rate limit exceeded error",
    "how to parse email headers",
    "test driven development skill",
    "which agent ran git commit",
    "http client connection timeout",
    "where is the config loaded",
    "subprocess pipe deadlock",
    "file not found error",
    "the",
    "asyncio event loop policy",
    "who changed the sqlite schema",
    "orchestrator slash command",
]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


# (lane, empty_reason) -> answers; "" = the lane had items.
EMPTY: Counter[tuple[str, str]] = Counter()
ZERO_RESULTS = ("no_match", "index_empty", "not_indexed")


def zero_rates() -> str:
    """Per lane, the share of answers in which it had nothing to return (empty_reason)."""
    parts = []
    for lane in ("episodes", "code", "skills"):
        total = sum(n for (name, _), n in EMPTY.items() if name == lane)
        zero = sum(EMPTY[(lane, r)] for r in ZERO_RESULTS)
        parts.append(f"{lane} {zero / total * 100:.1f}%" if total else f"{lane} n/a")
    return ", ".join(parts)


def copy_workspace(dst: Path) -> Path:
    """The code workspace: the Python standard library without its test suite and
    site-packages (about 2,000 files, 20,000 chunks), copied so that the server's
    own walk of the workspace sees exactly what was indexed."""
    src = Path(sysconfig.get_paths()["stdlib"])

    def ignore(d: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in ("site-packages", "__pycache__") or n.endswith(".pyc")}
        if Path(d) == src:
            skip.add("test")
        return skip

    if not dst.exists():
        shutil.copytree(src, dst, ignore=ignore, symlinks=True)
    return dst


def build(data: Path, events: int, shared: Path) -> None:
    from bench_episodes import build_corpus
    from knowledge_server.code.index import CodeIndex
    from knowledge_server.code.model import IndexOptions
    from knowledge_server.derived.build import rebuild
    from knowledge_server.derived.store import DerivedStore
    from knowledge_server.episodes.store import EpisodeStore

    data.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store = build_corpus(shared / "sessions", data.parent, events)  # writes data.parent/"corpus"
    store.close()
    print(f"episodes corpus built in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    workspace = copy_workspace(data.parent / "workspace")
    with CodeIndex(str(data / "code.sqlite"), options=IndexOptions()) as idx:
        rep = idx.index_workspace(str(workspace))
    print(
        f"code: {rep.files_indexed} files, {rep.chunks} chunks indexed in {time.perf_counter() - t0:.1f}s (rev {rep.index_rev})"
    )
    t0 = time.perf_counter()
    ep = EpisodeStore(str(data), read_only=True)
    ds = DerivedStore(str(data))
    r = rebuild(ep, ds, [str(shared / "skills")])
    ep.close()
    ds.close()
    print(f"derived: {r.actors} actors, {r.skills} skills in {time.perf_counter() - t0:.1f}s")


def project_roots(data: Path, n: int) -> list[str]:
    """The ``n`` session directories with the most events (sessions run in them)."""
    import apsw

    conn = apsw.Connection(str(data / "episodes.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT cwd FROM sessions WHERE cwd IS NOT NULL GROUP BY cwd"
            " ORDER BY sum(event_count) DESC, cwd LIMIT ?",
            (n,),
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


DEGRADED: list[str] = []


def unseen_word(i: int, n: int) -> str:
    """'qz' + request number + client number spelled in letters: one token in no index."""

    def letters(k: int) -> str:
        out = ""
        while True:
            out = chr(ord("a") + k % 26) + out
            k //= 26
            if k == 0:
                return out

    return f"qz{letters(i)}j{letters(n)}"


def server_cpu_s(pid: int) -> float:
    """CPU seconds used so far by the server process and its workers (Linux /proc)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cpu_ticks() -> tuple[int, int] | None:
    """(ticks stolen by the hypervisor, all ticks) of the machine so far, from /proc/stat;
    None where there is none. On a shared virtual machine the cores lose time to other
    guests, and a phase measured then runs slower by as much."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in fields[1:9]]
    return values[7], sum(values)


def yardsticks_ms() -> tuple[float, float]:
    """Best of three runs of two fixed pieces of work: a pure-Python loop (about 17 ms on
    this machine at its fastest) and 2M random reads over 64 MB (memory-bound, like the
    index lookups of a search). The same work every time, on one core while the other
    idles: shared virtual machines vary by half or more within an hour without any steal,
    and these follow that only loosely (slow search phases were seen with either fast or
    slow yardsticks), so read them as a hint, not a correction factor."""
    import numpy as np

    table = np.arange(16_000_000, dtype=np.int32)
    picks = np.random.default_rng(1).integers(0, len(table), 2_000_000)
    loop = reads = math.inf
    for _ in range(3):
        t = time.process_time()
        total = 0
        for i in range(400_000):
            total += i % 7
        loop = min(loop, time.process_time() - t)
        t = time.process_time()
        int(table[picks].sum())
        reads = min(reads, time.process_time() - t)
    return loop * 1000, reads * 1000


def steal_share(before: tuple[int, int] | None) -> str:
    after = cpu_ticks()
    if before is None or after is None or after[1] == before[1]:
        return "n/a"
    return f"{(after[0] - before[0]) / (after[1] - before[1]) * 100:.1f}%"


async def run_clients(
    address: str,
    clients: int,
    requests: int,
    unique: bool = False,
    phase: int = 0,
    workspaces: tuple[str, ...] = (),
) -> tuple[list[float], float]:
    """``requests`` searches from ``clients`` SDK clients. With ``unique``, each question
    carries a made-up word from (request, client, ``phase``): give every phase its own
    number, or a phase repeats another's questions and answers some from the cache."""
    from knowledge_sdk import AsyncKnowledgeClient

    latencies: list[float] = []
    counter = iter(range(requests))

    async def worker(n: int) -> None:
        async with AsyncKnowledgeClient(address, timeout=30) as kc:
            await kc.search("warm up", include=["episodes", "code", "skills"])
            for i in counter:
                q = QUERIES[(i + n) % len(QUERIES)]
                if unique:
                    # A distinct made-up word per request, so every search misses the caches.
                    # Letters only: "zq12x3" would also add the tokens "x", "12" and "3", which
                    # occur everywhere and would make the question costlier than a real one.
                    q = f"{q} {unseen_word(i, n + 100 * phase)}"
                t = time.perf_counter()
                resp = await kc.search(q, workspaces=workspaces)
                latencies.append((time.perf_counter() - t) * 1000)
                # A lane that timed out under load would make a search cheap and wrong: count them.
                DEGRADED.extend(
                    n for n in ("episodes", "code", "skills") if getattr(resp.lanes, n).degraded
                )
                for lane in ("episodes", "code", "skills"):
                    EMPTY[(lane, getattr(resp.lanes, lane).empty_reason)] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(clients)))
    return latencies, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--data", type=Path, help="reuse/keep this data directory")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="serving processes (serve --workers; default 2 = the cores here)",
    )
    args = ap.parse_args()
    base = args.data or Path(tempfile.mkdtemp(prefix="kn-bench-search-"))
    data = base / "corpus"
    if not (data / "code.sqlite").exists():
        build(data, args.events, args.shared)
    workspace = copy_workspace(base / "workspace")
    scope = (str(workspace), *project_roots(data, 20))
    with served(
        data, "--no-bootstrap", "--workspace", str(workspace), "--workers", str(args.workers)
    ) as (proc, address):
        from knowledge_sdk import KnowledgeClient

        with KnowledgeClient(address) as kc:
            st = kc.get_status()
            counts = {lane.lane: dict(lane.counts) for lane in st.lanes}
            print(
                f"server {address}: episodes={counts.get('episodes')} code={counts.get('code')} skills={counts.get('skills', {}).get('skills')}"
            )
            r = kc.search("who fixed the failing test", trace=True)
            print(
                "lane timings of one search (ms):",
                {t.lane: t.ms for t in r.trace.lanes},
                "total",
                r.trace.total_ms,
            )
        lat, wall = asyncio.run(run_clients(address, 1, args.requests, unique=True, phase=1))
        print(
            f"== 1 client, {len(lat)} unique searches (no cache hits): p50={statistics.median(lat):.1f} ms  "
            f"p95={pct(lat, 95):.1f} ms  p99={pct(lat, 99):.1f} ms  ({len(lat) / wall:.0f} searches/s)"
        )
        cpu0, own0, ticks0 = server_cpu_s(proc.pid), time.process_time(), cpu_ticks()
        lat, wall = asyncio.run(run_clients(address, 16, args.requests * 2, unique=True, phase=2))
        cpu, own = server_cpu_s(proc.pid) - cpu0, time.process_time() - own0
        print(
            f"== 16 clients, {len(lat)} unique searches (no cache hits): throughput={len(lat) / wall:.0f} searches/s  "
            f"p50={statistics.median(lat):.1f} ms  p95={pct(lat, 95):.1f} ms  p99={pct(lat, 99):.1f} ms"
        )
        print(
            f"   server CPU per never-seen search: {cpu / len(lat) * 1000:.1f} ms over {args.workers} process(es) "
            f"-> {os.cpu_count()} cores bound it at ~{len(lat) / cpu * (os.cpu_count() or 1):.0f} searches/s"
        )
        # The clients share the cores: what they use is what the server cannot.
        print(
            f"   client CPU per search: {own / len(lat) * 1000:.1f} ms (the 16 SDK clients, this process)"
        )
        loop_ms, reads_ms = yardsticks_ms()
        print(
            f"   CPU time taken by the host (steal) during the phase: {steal_share(ticks0)}; "
            f"yardsticks after it: loop {loop_ms:.1f} ms, random reads {reads_ms:.1f} ms "
            "(lower is a faster machine)"
        )
        # A token scoped to some projects (the code workspace and 20 session directories):
        # every lane filters by workspace, through other query plans than unscoped searches.
        lat, wall = asyncio.run(
            run_clients(address, 16, args.requests, unique=True, phase=3, workspaces=scope)
        )
        print(
            f"== 16 clients, {len(lat)} unique searches scoped to {len(scope)} workspaces: "
            f"throughput={len(lat) / wall:.0f} searches/s  p50={statistics.median(lat):.1f} ms  "
            f"p95={pct(lat, 95):.1f} ms  p99={pct(lat, 99):.1f} ms"
        )
        lat, wall = asyncio.run(run_clients(address, 1, args.requests))
        print(
            f"== 1 client, {len(lat)} searches over {len(QUERIES)} recurring questions: p50={statistics.median(lat):.1f} ms  p95={pct(lat, 95):.1f} ms  "
            f"p99={pct(lat, 99):.1f} ms  ({len(lat) / wall:.0f} searches/s)"
        )
        lat, wall = asyncio.run(run_clients(address, 16, args.requests * 2))
        print(
            f"== 16 clients, {len(lat)} searches over {len(QUERIES)} recurring questions: throughput={len(lat) / wall:.0f} searches/s  p50={statistics.median(lat):.1f} ms  "
            f"p95={pct(lat, 95):.1f} ms  p99={pct(lat, 99):.1f} ms"
        )
    print(
        f"degraded lanes in all answers: {len(DEGRADED)} ({', '.join(sorted(set(DEGRADED))) or 'none'})"
    )
    print(
        "zero-result rate per lane (empty_reason no_match/index_empty/not_indexed):", zero_rates()
    )
    print(
        f"data directory: {data} (targets: p95 <= 30 ms with one client; >= 200 searches/s with 16 clients)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
