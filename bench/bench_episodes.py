"""Episodes lane benchmark: ingestion throughput, incremental append latency, query latency.

Usage: python bench/bench_episodes.py [--data DIR] [--events 100000] [--before CHECKOUT]

The query corpus is grown to --events by replaying the real session logs: every imported
event is copied under a new session id ``<original id>~r<n>`` (cwd gets the same suffix so
workspace filters see distinct roots), replica after replica, until the target is reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from knowledge_server.episodes import EpisodeStore, discover, ingest
from knowledge_server.episodes.importers import import_full
from knowledge_server.episodes.model import Event, SessionMeta

REPO = Path(__file__).resolve().parent.parent


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[i]


def bench_ingest(sessions: Path, tmp: Path) -> None:
    files = discover([str(sessions)])
    runs = []
    for i in range(5):
        store = EpisodeStore(str(tmp / f"ingest{i}"))
        t0 = time.perf_counter()
        rep = ingest(store, [str(sessions)])
        runs.append((time.perf_counter() - t0, rep))
        store.close()
    best = min(r[0] for r in runs)
    rep = runs[0][1]
    lines = 0
    for path, fmt in files:
        if fmt in ("claude-code", "codex", "generic", "aider"):
            with open(path, "rb") as fh:
                lines += sum(1 for ln in fh if ln.strip())
    print("== ingestion (real logs, fresh store, best of 5)")
    print(
        f"files={len(files)} source records/lines={lines} events stored={rep.events_added} "
        f"sessions={rep.sessions} malformed={len(rep.malformed)} unknown={len(rep.unknown)}"
    )
    print(
        f"time={best * 1000:.1f} ms  throughput={lines / best:,.0f} records/s  {rep.events_added / best:,.0f} events/s"
    )


def bench_append(tmp: Path, repeats: int = 50) -> None:
    store = EpisodeStore(str(tmp / "append"))
    path = tmp / "live" / "session.jsonl"
    path.parent.mkdir()
    with open(path, "w") as fh:
        fh.writelines(
            json.dumps(
                {
                    "session_id": "live",
                    "seq": i,
                    "role": "user",
                    "time": "2026-01-01T00:00:00Z",
                    "text": f"warm-up line {i} about the build",
                }
            )
            + "\n"
            for i in range(1, 501)
        )
    ingest(store, [str(path)])
    lat = []
    for i in range(repeats):
        with open(path, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "session_id": "live",
                        "seq": 1000 + i,
                        "role": "assistant",
                        "time": "2026-01-01T00:01:00Z",
                        "text": f"appended line {i} fixing tests",
                    }
                )
                + "\n"
            )
        t0 = time.perf_counter()
        rep = ingest(store, [str(path)])
        lat.append((time.perf_counter() - t0) * 1000)
        assert rep.events_added == 1, rep
    print(
        f"== incremental append (1 line appended to a live 500-line JSONL, ingest(); {repeats} repeats)"
    )
    print(
        f"median={statistics.median(lat):.2f} ms  p95={pct(lat, 95):.2f} ms  max={max(lat):.2f} ms"
    )
    store.close()


def build_corpus(sessions: Path, tmp: Path, target: int) -> EpisodeStore:
    base = []
    metas = {}
    for path, fmt in discover([str(sessions)]):
        res = import_full(fmt, path)
        base.extend(res.events)
        metas.update(res.sessions)
    # The real logs hold no Russian or Chinese text: add two short events per replica so
    # the multilingual queries measure real matches, not empty ones.
    base.append(
        Event(
            "bench-multilingual",
            1,
            "assistant/message",
            "Я чинил доступ к базе MySQL: вернул пользователю права GRANT",
            None,
        )
    )
    base.append(
        Event("bench-multilingual", 2, "user/message", "会员退款多久到账？客户在问退款进度", None)
    )
    metas["bench-multilingual"] = SessionMeta("bench-multilingual", cwd="/srv/bench")
    store = EpisodeStore(str(tmp / "corpus"))
    t0 = time.perf_counter()
    n = 0
    rep = 0
    while n < target:
        rep += 1
        suffix = f"~r{rep}"
        events = [dataclasses.replace(e, session_id=e.session_id + suffix) for e in base]
        sess = {}
        for sid, m in metas.items():
            sess[sid + suffix] = dataclasses.replace(
                m, session_id=sid + suffix, cwd=(m.cwd + suffix) if m.cwd else None
            )
        store.apply_file(
            f"/replica/{rep}",
            "generic",
            reset=True,
            events=events,
            sessions=sess,
            state={
                "size": 0,
                "mtime": 0.0,
                "inode": 0,
                "offset": 0,
                "line": 0,
                "head_len": 0,
                "head_hash": "",
                "ctx": {},
            },
        )
        n += len(events)
    # What an ingest run does at its end: merge the text index's segments (fts.compact).
    t1 = time.perf_counter()
    merged = store.compact_fts(n)
    t2 = time.perf_counter()
    dt = t2 - t0
    print(
        f"== corpus: {len(base) - 2} events from the real logs (+2 ru/zh events) replayed {rep} times under session ids "
        f"'<id>~r<n>' (cwd '<cwd>~r<n>') -> {store.counts()['indexed_docs']} events, "
        f"{store.counts()['sessions']} sessions; bulk insert {n / dt:,.0f} events/s"
        + (f" (including {t2 - t1:.2f}s merging the text index)" if merged else "")
    )
    return store


QUERIES = [
    ("frequent", "the"),
    ("frequent", "file"),
    ("frequent", "error"),
    ("frequent", "test"),
    ("frequent", "file error"),
    ("mixed", "who fixed the failing tests"),
    ("mixed", "rate limit exceeded"),
    ("mixed", "add tests for the map tokens option"),
    ("rare", "MessageAbortedError"),
    ("rare", "orchestrator"),
    ("ru", "кто чинил доступ к MySQL"),
    ("zh", "会员退款多久到账？"),
    ("syntax", '"NEAR(file* -error)" ^col:x'),
]


def query_cases(store: EpisodeStore) -> list[tuple[str, str, dict[str, Any], str]]:
    """The queries asked, with their filters: plain, narrow workspaces, a workspace scope
    holding nearly every event ("/": the sessions with a cwd), an outcome, time windows."""
    cases: list[tuple[str, str, dict[str, Any], str]] = [(kind, q, {}, "") for kind, q in QUERIES]
    cases += [
        ("ws-filter", "file error", {"workspaces": ["/tmp~r7"]}, ""),
        ("ws-filter", "test", {"workspaces": ["/tmp~r3", "/path/to/Demo~r9"]}, ""),
        ("ws-wide", "who fixed the failing tests", {"workspaces": ["/"]}, ""),
        ("ws-wide", "rate limit exceeded", {"workspaces": ["/"]}, ""),
        ("ws-wide", "file error", {"workspaces": ["/"]}, ""),
        ("ws-wide", "MessageAbortedError", {"workspaces": ["/"]}, ""),
        ("outcome", "error", {"outcome": "failure"}, ""),
        ("ws-wide", "error", {"outcome": "failure", "workspaces": ["/"]}, "/, failure"),
        ("ws-filter", "error", {"outcome": "failure", "workspaces": ["/tmp~r7"]}, "failure"),
    ]
    # Time windows: the newest 1% of the events, and one after the newest event (empty).
    times = [r[0] for r in store.conn.execute("SELECT time FROM events ORDER BY time DESC")]
    if times:
        newest_1pc = datetime.fromtimestamp(times[len(times) // 100], UTC)
        after = datetime.fromtimestamp(times[0], UTC) + timedelta(days=1)
        cases += [
            ("window", "file error", {"since": newest_1pc}, "since: newest 1%"),
            ("window", "the", {"since": newest_1pc}, "since: newest 1%"),
            ("window", "file error", {"since": after}, "since: after the newest"),
            ("ws-window", "file error", {"since": newest_1pc, "workspaces": ["/"]}, "/, newest 1%"),
            ("ws-window", "the", {"since": newest_1pc, "workspaces": ["/"]}, "/, newest 1%"),
        ]
    return cases


def case_label(q: str, kw: dict[str, Any], note: str) -> str:
    return f"{q} ({note})" if note else (q if not kw else f"{q} {kw}")


def time_queries(store: EpisodeStore, repeats: int) -> list[dict[str, Any]]:
    """Each case: the first search (a scope's statistics counted in this process), then
    ``repeats`` more; hits and latencies (ms)."""
    out = []
    for kind, q, kw, note in query_cases(store):
        t0 = time.perf_counter()
        store.search(q, k=10, **kw)
        first = (time.perf_counter() - t0) * 1000
        lat = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            hits = store.search(q, k=10, **kw)
            lat.append((time.perf_counter() - t0) * 1000)
        out.append(
            {
                "kind": kind,
                "label": case_label(q, kw, note),
                "hits": len(hits),
                "first": first,
                "lat": lat,
            }
        )
    return out


def bench_queries(store: EpisodeStore, repeats: int) -> None:
    print(f"== queries (k=10, in-process, {repeats} runs each after a first one; ms)")
    print(f"{'kind':9s} {'query':42s} {'hits':>4s} {'first':>7s} {'p50':>7s} {'p95':>7s}")
    everything = []
    for c in time_queries(store, repeats):
        everything.extend(c["lat"])
        print(
            f"{c['kind']:9s} {c['label'][:42]:42s} {c['hits']:4d} {c['first']:7.2f} "
            f"{statistics.median(c['lat']):7.2f} {pct(c['lat'], 95):7.2f}"
        )
    print(
        f"ALL queries: p50={statistics.median(everything):.2f} ms  p95={pct(everything, 95):.2f} ms  "
        f"(target p95 <= 10 ms)"
    )


def compare(
    sessions: Path, tmp: Path, events: int, before: Path, repeats: int, rounds: int
) -> None:
    """The query cases asked of the corpus by this checkout's code and by ``before``'s (a
    process each, one round of each in turn), side by side. Each builds its own copy of the
    corpus (the same events): a store holds the schema steps of the code that wrote it,
    which older code refuses to open."""
    trees = {"before": before / "server", "this": REPO / "server"}
    envs = {name: {**os.environ, "PYTHONPATH": str(server)} for name, server in trees.items()}
    build = [sys.executable, __file__, "--data", str(sessions.parent), "--events", str(events)]
    for name, env in envs.items():
        subprocess.run([*build, "--build-store", str(tmp / name)], env=env, check=True)
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, env in envs.items():
            db = tmp / name / "corpus"
            done = subprocess.run(
                [sys.executable, __file__, "--query-store", str(db), "--repeats", str(repeats)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            runs[name].append(json.loads(done.stdout))
    print(
        f"== queries, before ({before}) vs this checkout: {rounds} rounds of a process each, in turn; ms"
    )
    print(f"{'kind':9s} {'query':42s} {'hits':>9s} {'first':>15s} {'p50':>15s} {'p95':>15s}")
    every: dict[str, list[float]] = {name: [] for name in trees}
    for i, case in enumerate(runs["this"][0]):
        cols = []
        for name in trees:
            lat = [x for r in runs[name] for x in r[i]["lat"]]
            every[name].extend(lat)
            first = statistics.median(r[i]["first"] for r in runs[name])
            cols.append((runs[name][0][i]["hits"], first, statistics.median(lat), pct(lat, 95)))
        (hb, fb, mb, pb), (ht, ft, mt, pt) = cols
        print(
            f"{case['kind']:9s} {case['label'][:42]:42s} {hb:4d}/{ht:<4d} {fb:7.2f}/{ft:<7.2f} "
            f"{mb:7.2f}/{mt:<7.2f} {pb:7.2f}/{pt:<7.2f}"
        )
    for name, lat in every.items():
        print(
            f"ALL queries, {name}: p50={statistics.median(lat):.2f} ms  p95={pct(lat, 95):.2f} ms"
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description="The episodes lane on the real session logs: ingestion, a live append, "
        "and query latency on a corpus grown to --events by replaying them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--data",
        default=os.environ.get("KNOWLEDGE_SHARED_DATA", str(REPO.parent / "shared" / "data")),
        help="the shared data folder (its sessions/ holds the logs)",
    )
    ap.add_argument("--events", type=int, default=100_000, help="events in the query corpus")
    ap.add_argument(
        "--repeats", type=int, default=30, help="runs of each query case after a first one"
    )
    ap.add_argument(
        "--before",
        type=Path,
        help="a checkout of the code to compare with: the corpus's queries are asked by it "
        "and by this checkout in turn, a process each (its server/ on PYTHONPATH)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --before's comparison")
    ap.add_argument("--query-store", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--build-store", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.query_store:  # one side of --before: the corpus's queries, as JSON
        store = EpisodeStore(str(args.query_store), read_only=True)
        print(json.dumps(time_queries(store, args.repeats)))
        store.close()
        return 0
    sessions = Path(args.data) / "sessions"
    if not sessions.is_dir():
        print(f"no session logs at {sessions}", file=sys.stderr)
        return 2
    if args.build_store:  # one side of --before: its corpus, written by its code
        args.build_store.mkdir(parents=True)
        build_corpus(sessions, args.build_store, args.events).close()
        return 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bench_ingest(sessions, tmp)
        bench_append(tmp)
        if args.before:
            compare(sessions, tmp, args.events, args.before, args.repeats, args.rounds)
        else:
            store = build_corpus(sessions, tmp, args.events)
            bench_queries(store, args.repeats)
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
