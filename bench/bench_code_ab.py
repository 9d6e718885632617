#!/usr/bin/env python3
"""In-process code search latency of several checkouts side by side, on one index.

The machine's speed drifts by up to a third within an hour, so two versions are only
comparable when measured in one run, question by question. This script indexes the
standard library without its test suite (about 20,000 chunks, as ``bench_code.py``'s
latency section) once, then starts one worker process per ``--checkout`` (its ``server``
folder first on the import path) on that index, and sends every worker the same
questions, alternating which goes first. Each worker times ``CodeIndex.search`` as the
code lane calls it (hybrid, intent find_code, the lane's top-K of 30, no snippets; with
the store's copy in memory built first where the checkout has ``code.memory``, as a
serving process holds it) and
reports whether the labelled function is in the first 10 hits, so a speed-up that
changes the results shows. Wall time and the worker thread's CPU time are both printed:
when other work shares the cores, CPU time is the steadier of the two.

With ``--also DIR`` (repeatable) more workspaces are indexed into the same store, and
``--ask-in DIR`` (one of them) takes the questions from that workspace's docstrings and
scopes every search to it: a small workspace in a store that holds a larger one; the
standard library's own folder (``WORK/stdlib-no-tests``, with ``--work``) scopes them to
the large one. With ``--sql`` no worker builds the copy in memory: every search is
ranked by SQL, as for a store above ``code.memory.MAX_CHUNKS`` or while a copy is built.

Usage: python bench/bench_code_ab.py --checkout /path/to/main --checkout . [--queries 300]
                                     [--also DIR ... --ask-in DIR] [--sql]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_code import IGNORE, _cases, _copy_stdlib, _pct  # noqa: E402 - after the path above

WORKER = r"""
import json, sys, time
from knowledge_server.code import CodeIndex
from knowledge_server.logs import configure_logging
configure_logging(level="warning")  # stdout carries the answers
ix = CodeIndex(sys.argv[1])
try:  # as a serving process holds it (code.memory), where the checkout has one
    from knowledge_server.code import memory
except ImportError:
    memory = None
built = {}
if memory is not None and sys.argv[2] != "sql":
    t = time.perf_counter()
    mem = memory.warm(ix.conn, wait=True)
    built = {"build_s": time.perf_counter() - t, "mib": mem.nbytes / 2**20 if mem else 0}
print(json.dumps({"ready": True, **built}), flush=True)
for line in sys.stdin:
    q = json.loads(line)
    t, c = time.perf_counter(), time.thread_time()
    res = ix.search(q["query"], workspaces=q["workspaces"], limit=30, mode="hybrid", check_fresh=False,
                    describe_hits=False, intent="find_code")
    ms, cpu = (time.perf_counter() - t) * 1000, (time.thread_time() - c) * 1000
    rank = next((i + 1 for i, h in enumerate(res.hits[:10])
                 if h.path == q["path"] and h.start_line <= q["line"] <= h.end_line), 0)
    print(json.dumps({"ms": ms, "cpu": cpu, "rank": rank}), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--checkout", action="append", required=True, type=Path)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=1, help="passes over the questions")
    ap.add_argument("--work", type=Path, default=None, help="keep the index here")
    ap.add_argument("--also", action="append", default=[], type=Path, help="more workspaces")
    ap.add_argument("--ask-in", type=Path, default=None, help="ask in this workspace only")
    ap.add_argument(
        "--sql",
        action="store_true",
        help="no copy of the store in memory: every search ranked by SQL (a store above"
        " code.memory.MAX_CHUNKS, or one whose copy is being built)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-code-ab-"))
    work = args.work or tmp
    try:
        run(work, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _worker(checkout: Path, db: Path, sql: bool = False) -> subprocess.Popen[str]:
    """A worker process running ``checkout``'s code on ``db``, once it is ready (``sql``:
    without the store's copy in memory)."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve() / "server"))
    p = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), "sql" if sql else "memory"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    ready = json.loads(p.stdout.readline())
    if "build_s" in ready:
        print(
            f"{checkout}: copy in memory built in {ready['build_s']:.2f} s, {ready['mib']:.1f} MiB"
        )
    return p


def run(work: Path, args: argparse.Namespace) -> None:
    from knowledge_server.code import CodeIndex, IndexOptions

    root = work / "stdlib-no-tests"
    if not root.exists():
        _copy_stdlib(root, without=("test",))
    db = work / "code.sqlite"
    with CodeIndex(str(db), options=IndexOptions(extra_ignore=IGNORE)) as ix:
        rep = ix.index_workspace(str(root))
        chunks = rep.chunks or ix.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        others = {str(d.resolve()): ix.index_workspace(str(d.resolve())).chunks for d in args.also}
    asked = root if args.ask_in is None else args.ask_in.resolve()
    scope = None if args.ask_in is None else [str(asked)]
    cases = _cases(asked, args.queries, seed=11)
    names = [str(c) for c in args.checkout]
    workers = [_worker(c, db, args.sql) for c in args.checkout]
    lat: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    ranks: dict[str, list[int]] = {n: [] for n in names}

    def ask(i: int, case: object) -> None:
        p = workers[i]
        assert p.stdin is not None and p.stdout is not None
        q = {"query": case.query, "path": case.path, "line": case.line, "workspaces": scope}  # type: ignore[attr-defined]
        p.stdin.write(json.dumps(q) + "\n")
        p.stdin.flush()
        a = json.loads(p.stdout.readline())
        lat[names[i]].append(a["ms"])
        cpu[names[i]].append(a["cpu"])
        ranks[names[i]].append(a["rank"])

    # Warm up: the first questions fill per-revision memos and the page cache.
    for case in cases[:10]:
        for i in range(len(workers)):
            ask(i, case)
    for n in names:
        lat[n].clear()
        cpu[n].clear()
        ranks[n].clear()
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for k, case in enumerate(cases):
            order = list(range(len(workers)))
            if k % 2:
                order.reverse()
            for i in order:
                ask(i, case)
    for p in workers:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    print(
        f"{chunks} chunks (standard library without test/), {len(cases)} questions x"
        f" {args.rounds}, alternating, {time.perf_counter() - t0:.0f} s"
    )
    for d, n in others.items():
        print(f"also in the store: {d} ({n} chunks)")
    if scope:
        print(f"questions from and scoped to {asked}")
    print(
        f"{'checkout':<32} {'P50 ms':>7} {'P95 ms':>7} {'mean':>7}   {'CPU P50':>7} {'P95':>7}"
        f" {'mean':>7} {'R@10':>6} {'MRR':>6}"
    )
    for n in names:
        xs, cs, rs = lat[n], cpu[n], ranks[n]
        mrr = sum(1 / r for r in rs if r) / len(rs)
        r10 = sum(1 for r in rs if r) / len(rs)
        print(
            f"{n[-32:]:<32} {_pct(xs, 50):>7.2f} {_pct(xs, 95):>7.2f} {sum(xs) / len(xs):>7.2f}"
            f"   {_pct(cs, 50):>7.2f} {_pct(cs, 95):>7.2f} {sum(cs) / len(cs):>7.2f}"
            f" {r10:>6.3f} {mrr:>6.3f}"
        )


if __name__ == "__main__":
    main()
