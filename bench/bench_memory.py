"""Project memory and audit log benchmark.

Usage: python bench/bench_memory.py [--facts 10000] [--audit-events 100000] [--work DIR]

* remember and recall P50 / P95 with ``--facts`` current facts in one store (in process, the
  store's own code path: one SQLite transaction per write);
* a reclaim at capacity: the time of the write that crosses ``max_facts``, and the number of
  reclaims over the next ``max - target`` writes (must stay 1: once per crossing);
* consolidate (decay, near-duplicates, compaction) over ``--facts`` facts, dry run and real;
* ``AuditLog.verify`` over ``--audit-events`` events (the log is built with the real chain
  hash in one transaction; appends are timed separately, each committed with
  synchronous=FULL as the service does).

Values are sentences of words drawn from this repository's documentation (real text), with
a fixed seed.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from knowledge_server.audit import AuditEvent, AuditLog, chain_hash, input_hash
from knowledge_server.memory.policy import MemoryPolicy, reclaim_target
from knowledge_server.memory.store import MemoryStore, Scope
from knowledge_server.schema import immediate

REPO = Path(__file__).resolve().parent.parent
SCOPE = Scope("org-bench", "/srv/bench")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def vocabulary() -> list[str]:
    words: set[str] = set()
    for doc in (REPO / "docs").glob("*.md"):
        words.update(w.lower() for w in re.findall(r"[A-Za-z]{4,}", doc.read_text()))
    return sorted(words)


def sentence(rng: random.Random, vocab: list[str], n: int = 8) -> str:
    return " ".join(rng.choice(vocab) for _ in range(n))


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def fill(store: MemoryStore, n: int, rng: random.Random, vocab: list[str]) -> list[float]:
    times = []
    for i in range(n):
        value = sentence(rng, vocab)
        t0 = time.perf_counter()
        store.remember(
            SCOPE, "facts", f"room{i % 40}", f"key-{i}", value, round(rng.uniform(0.3, 1.0), 2)
        )
        times.append(ms(t0))
    return times


def bench_remember_recall(work: Path, facts: int, rng: random.Random, vocab: list[str]) -> None:
    policy = replace(MemoryPolicy(), max_facts=facts * 2, recall_facts_limit=10)
    store = MemoryStore(work / "rr.sqlite", policy)
    fill(store, facts, rng, vocab)
    writes: list[float] = []
    kinds = {"new": 0, "confirm": 0, "contradict": 0}
    for i in range(1000):
        pick = rng.random()
        if pick < 0.5:
            key, value, kind = f"extra-{i}", sentence(rng, vocab), "new"
        else:
            key = f"key-{rng.randrange(facts)}"
            current = store.timeline(SCOPE, "facts", f"room{int(key[4:]) % 40}", key)[0]
            value = current[-1].value if pick < 0.75 and current else sentence(rng, vocab)
            kind = "confirm" if pick < 0.75 else "contradict"
        category = f"room{i % 40}" if kind == "new" else f"room{int(key[4:]) % 40}"
        t0 = time.perf_counter()
        w = store.remember(SCOPE, "facts", category, key, value, 0.7)
        writes.append(ms(t0))
        kinds[kind] += 1
        assert w.outcome in ("created", "confirmed", "superseded")
    reads: list[float] = []
    cut = 0
    for _ in range(1000):
        query = sentence(rng, vocab, 2)
        t0 = time.perf_counter()
        r = store.recall(SCOPE, "facts", query)
        reads.append(ms(t0))
        cut += r.cut.omitted > 0
    live = store.count(SCOPE, "facts")
    print(
        f"remember at {facts} facts ({live} entries after): P50 {pct(writes, 50):.2f} ms,"
        f" P95 {pct(writes, 95):.2f} ms over 1000 writes {kinds}"
    )
    print(
        f"recall (2-word query, budget 10) at {live} entries: P50 {pct(reads, 50):.2f} ms,"
        f" P95 {pct(reads, 95):.2f} ms over 1000 queries, {cut} cut by the budget"
    )
    store.close()


def bench_reclaim(work: Path, facts: int, rng: random.Random, vocab: list[str]) -> None:
    policy = replace(MemoryPolicy(), max_facts=facts, reclaim_headroom_pct=0.25)
    target = reclaim_target(facts, 0.25)
    store = MemoryStore(work / "reclaim.sqlite", policy)
    fill(store, facts, rng, vocab)
    assert store.reclaims == 0 and store.count(SCOPE, "facts") == facts
    t0 = time.perf_counter()
    w = store.remember(SCOPE, "facts", "room0", "crossing", sentence(rng, vocab), 0.7)
    crossing = ms(t0)
    after = store.count(SCOPE, "facts")
    archived = store.count(SCOPE, "facts", archived=True)
    following: list[float] = []
    for i in range(facts - target - 1):
        t0 = time.perf_counter()
        store.remember(SCOPE, "facts", "room1", f"after-{i}", sentence(rng, vocab), 0.7)
        following.append(ms(t0))
    runs_between = store.reclaims
    store.remember(SCOPE, "facts", "room1", "next-crossing", sentence(rng, vocab), 0.7)
    print(
        f"reclaim at max_facts={facts}: the crossing write took {crossing:.1f} ms and archived"
        f" {w.reclaimed} entries ({after} live, {archived} archived; target {target});"
        f" {len(following)} following writes P50 {pct(following, 50):.2f} ms, P95"
        f" {pct(following, 95):.2f} ms, reclaims so far {runs_between};"
        f" the next crossing makes it {store.reclaims}"
    )
    assert runs_between == 1 and store.reclaims == 2
    store.close()


def bench_consolidate(work: Path, facts: int, rng: random.Random, vocab: list[str]) -> None:
    policy = replace(MemoryPolicy(), max_facts=facts * 2, similarity_threshold=0.7)
    store = MemoryStore(work / "consolidate.sqlite", policy)
    # a tenth of the facts are near-duplicates of others (one word changed)
    for i in range(facts):
        if i % 10 == 9:
            base = store.recall(SCOPE, "facts", "", category=f"room{i % 40}", limit=1)
            words = (base.entries[0].value if base.entries else sentence(rng, vocab)).split()
            words[0] = rng.choice(vocab)
            value = " ".join(words)
        else:
            value = sentence(rng, vocab)
        store.remember(SCOPE, "facts", f"room{i % 40}", f"key-{i}", value, 0.2 + (i % 8) / 10)
    t0 = time.perf_counter()
    dry = store.consolidate(SCOPE, ["facts"], dry_run=True)
    dry_ms = ms(t0)
    t0 = time.perf_counter()
    real = store.consolidate(SCOPE, ["facts"])
    real_ms = ms(t0)
    assert (dry.merged, dry.compacted) == (real.merged, real.compacted)
    print(
        f"consolidate {facts} facts: dry run {dry_ms:.0f} ms, real {real_ms:.0f} ms;"
        f" merged {real.merged}, compacted {real.compacted}, decayed {real.decayed}"
    )
    store.close()


def bench_audit(work: Path, events: int) -> None:
    log = AuditLog(work / "audit.sqlite")
    appends = []
    for i in range(1000):
        t0 = time.perf_counter()
        log.append(
            principal="bench",
            org="org",
            operation="memory.remember",
            targets=[f"mem:{i}"],
            input={"i": i},
        )
        appends.append(ms(t0))
    seq, prev = log.head()
    at = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    rows = []
    for s in range(seq + 1, events + 1):
        e = AuditEvent(
            s, at, "bench", "org", "index", (f"/srv/{s}",), input_hash(s), "ok", prev, ""
        )
        h = chain_hash(prev, e.body())
        rows.append((s, at, "bench", "org", "index", f'["/srv/{s}"]', e.input_hash, "ok", prev, h))
        prev = h
    conn = log._conn  # built in one transaction: the appends' fsync per event is measured above
    with immediate(conn):
        conn.executemany(
            "INSERT INTO events (seq, at, principal, org, operation, targets, input_hash,"
            " outcome, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
    t0 = time.perf_counter()
    result = log.verify(expect=log.head())
    verify_s = ms(t0) / 1000
    assert result.ok and result.checked == events
    print(
        f"audit append (synchronous=FULL, one commit each): P50 {pct(appends, 50):.2f} ms,"
        f" P95 {pct(appends, 95):.2f} ms; verify {result.checked} events: {verify_s:.2f} s"
        f" ({result.checked / verify_s:,.0f} events/s)"
    )
    log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", type=int, default=10_000)
    ap.add_argument("--audit-events", type=int, default=100_000)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(4)
    vocab = vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print(f"vocabulary: {len(vocab)} words from docs/")
        bench_remember_recall(work, args.facts, rng, vocab)
        bench_reclaim(work, args.facts, rng, vocab)
        bench_consolidate(work, args.facts, rng, vocab)
        bench_audit(work, args.audit_events)


if __name__ == "__main__":
    main()
