"""Benchmark of the knowledge base's processing library and its two retrieval indexes.

On the real EIP corpus (``shared/data/docs/eips``, 93 documents, each a topic with two
revisions: the document as published, and a second revision with one more section), it
prints, for the embedded SQLite index and Milvus Lite side by side:

- convert + chunk throughput (documents/min, chunks/s; the same code for both);
- embedding throughput of the code lane's deterministic ``HashingEmbedder``;
- stage throughput (chunks/s, vectors included);
- search latency P50 / P95 (lexical, vector, hybrid) over the second revisions, at about
  10,000 chunks in the index (the corpus is staged again under other organisations
  until then);
- ``revision_counts`` and ``drop_revision`` at that size.

Run: ``python bench/bench_kb_index.py [--docs DIR] [--queries 200] [--target 10000]``.
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.kb.chunk import Chunk, ChunkSettings, chunk_document
from knowledge_server.kb.convert import Converter, Source
from knowledge_server.kb.index.milvus import MilvusRetrievalIndex
from knowledge_server.kb.index.port import IndexChunk, RetrievalIndex, index_chunks
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex

DIM = 256
ORG = "acme"


def _note(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _second_revision(text: str, n: int) -> str:
    return (
        text.rstrip()
        + f"\n\n## Revision notes\n\nSecond revision {n}: wording reviewed, examples checked.\n"
    )


def convert_corpus(files: Sequence[Path]) -> tuple[dict[str, list[list[Chunk]]], dict[str, float]]:
    """topic -> [chunks of revision 1, chunks of revision 2], and the timings."""
    converter = Converter()
    settings = ChunkSettings()
    out: dict[str, list[list[Chunk]]] = {}
    t_convert = t_chunk = 0.0
    docs = chunks = 0
    for n, path in enumerate(files):
        text = path.read_text(encoding="utf-8")
        revisions = []
        for body in (text, _second_revision(text, n)):
            t0 = time.perf_counter()
            doc = converter.convert(Source(path.name, body.encode()))
            t1 = time.perf_counter()
            cs = chunk_document(doc, settings)
            t2 = time.perf_counter()
            t_convert += t1 - t0
            t_chunk += t2 - t1
            docs += 1
            chunks += len(cs)
            revisions.append(cs)
        out[path.stem] = revisions
    return out, {"docs": docs, "chunks": chunks, "convert_s": t_convert, "chunk_s": t_chunk}


def rows_for(
    corpus: dict[str, list[list[Chunk]]], org: str, suffix: str = ""
) -> list[tuple[str, list[IndexChunk]]]:
    """(revision id, rows) for every revision of every topic."""
    out = []
    for topic, revisions in corpus.items():
        for r, chunks in enumerate(revisions, 1):
            rev = f"{topic}-r{r}{suffix}"
            rows = index_chunks(
                org=org,
                topic_id=topic,
                revision_id=rev,
                tags=["eip", f"rev{r}"],
                sources=[(f"{topic}.md", chunks)],
            )
            out.append((rev, rows))
    return out


def run_backend(
    name: str,
    opener: Callable[[], RetrievalIndex],
    revisions: list[tuple[str, list[IndexChunk]]],
    vectors: dict[str, list[list[float]]],
    fillers: list[tuple[str, list[tuple[str, list[IndexChunk]]]]],
    queries: list[tuple[str, list[float], str]],
    published: list[str],
) -> dict[str, float]:
    index = opener()
    try:
        staged = 0
        t0 = time.perf_counter()
        for rev, rows in revisions:
            index.stage(ORG, rev, rows, vectors[rev])
            staged += len(rows)
        stage_s = time.perf_counter() - t0
        _note(f"{name}: staged {staged} chunks in {stage_s:.1f} s")
        for org, org_revisions in fillers:
            for rev, rows in org_revisions:
                index.stage(org, rev, rows, vectors[rev.removesuffix(f"-{org}")])
        total = sum(index.revision_counts().values())
        _note(f"{name}: {total} chunks in the index; searching")
        lat: dict[str, list[float]] = {"lexical": [], "vector": [], "hybrid": []}
        empty = 0
        found: dict[str, int] = {"lexical": 0, "vector": 0, "hybrid": 0}
        for text, vector, want in queries:
            for mode, (q_text, q_vec) in {
                "lexical": (text, None),
                "vector": ("", vector),
                "hybrid": (text, vector),
            }.items():
                t = time.perf_counter()
                hits = index.search(ORG, q_text, q_vec, revision_ids=published, k=10)
                lat[mode].append((time.perf_counter() - t) * 1000)
                assert all(h.chunk.org == ORG and h.chunk.revision_id in published for h in hits)
                empty += not hits
                found[mode] += any(h.chunk.chunk_id == want for h in hits)
        t = time.perf_counter()
        counts = index.revision_counts()
        counts_ms = (time.perf_counter() - t) * 1000
        assert sum(counts.values()) == total
        t = time.perf_counter()
        dropped = index.drop_revision(ORG, revisions[0][0])
        drop_ms = (time.perf_counter() - t) * 1000
        assert dropped == len(revisions[0][1])
        # Dropping a whole organisation's revisions, one call each (as reconcile would).
        fill_org, fill_revs = fillers[0] if fillers else (ORG, revisions[1:])
        t = time.perf_counter()
        for rev, _rows in fill_revs:
            index.drop_revision(fill_org, rev)
        drop_org_s = time.perf_counter() - t
        result = {
            "staged": staged,
            "stage_s": stage_s,
            "total": total,
            "counts_ms": counts_ms,
            "drop_ms": drop_ms,
            "drop_org_s": drop_org_s,
            "drop_org_revisions": len(fill_revs),
            "empty": empty,
        }
        for mode, n in found.items():
            result[f"{mode}_recall"] = n / len(queries)
        for mode, values in lat.items():
            result[f"{mode}_p50"] = statistics.median(values)
            result[f"{mode}_p95"] = _percentile(values, 0.95)
        return result
    finally:
        index.close()
        _note(f"{name}: done")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument("--docs", type=Path, default=here.parent / "shared/data/docs/eips")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--target", type=int, default=10_000, help="chunks in the index")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)

    files = sorted(args.docs.glob("eip-*.md"))
    if not files:
        print(f"no EIP documents under {args.docs}", file=sys.stderr)
        return 2
    corpus, timing = convert_corpus(files)
    embedder = HashingEmbedder(DIM)
    revisions = rows_for(corpus, ORG)
    t = time.perf_counter()
    vectors = {rev: embedder.embed([r.text for r in rows]).tolist() for rev, rows in revisions}
    embed_s = time.perf_counter() - t
    per_copy = sum(len(rows) for _rev, rows in revisions)
    fillers = []
    copies = max(0, round((args.target - per_copy) / per_copy))
    for c in range(copies):
        org = f"org{c + 1:02d}"
        fillers.append((org, rows_for(corpus, org, suffix=f"-{org}")))
    published = [rev for rev, _rows in revisions if rev.endswith("-r2")]
    rng = random.Random(7)
    # A question per sampled chunk of a second revision: its first sentence (at most 160
    # characters); the chunk it came from is the expected hit.
    sampled = [
        (chunk.text.split(". ")[0][:160], f"{topic}-r2:{chunk.ordinal}")
        for topic, revs in corpus.items()
        for chunk in revs[1]
        if len(chunk.text) > 80
    ]
    rng.shuffle(sampled)
    sampled = sampled[: args.queries]
    qvecs = embedder.embed_query([text for text, _ in sampled]).tolist()
    queries = [(text, vec, want) for (text, want), vec in zip(sampled, qvecs, strict=True)]

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-kb-"))
    work.mkdir(parents=True, exist_ok=True)
    backends: dict[str, Callable[[], RetrievalIndex]] = {
        "sqlite": lambda: SqliteRetrievalIndex(work / "sqlite" / STORE_FILE, dim=DIM),
        "milvus-lite": lambda: MilvusRetrievalIndex(
            str(work / "milvus" / "kb_index.milvus.db"), dim=DIM
        ),
    }
    (work / "milvus").mkdir(parents=True, exist_ok=True)
    results = {
        name: run_backend(name, opener, revisions, vectors, fillers, queries, published)
        for name, opener in backends.items()
    }
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)

    docs, chunks = timing["docs"], timing["chunks"]
    conv = timing["convert_s"] + timing["chunk_s"]
    print(f"corpus: {len(files)} EIPs x 2 revisions = {docs} documents, {chunks} chunks")
    print(
        f"convert + chunk: {docs / conv * 60:,.0f} documents/min, {chunks / conv:,.0f} chunks/s "
        f"(convert {timing['convert_s']:.2f} s, chunk {timing['chunk_s']:.2f} s)"
    )
    print(f"embed (hashing-{DIM}): {chunks / embed_s:,.0f} chunks/s")
    names = list(results)
    print(f"\n{'':34}" + "".join(f"{n:>16}" for n in names))

    def row(label: str, fmt: Callable[[dict[str, float]], str]) -> None:
        print(f"{label:34}" + "".join(f"{fmt(results[n]):>16}" for n in names))

    row("stage (chunks/s, vectors incl.)", lambda r: f"{r['staged'] / r['stage_s']:,.0f}")
    row("stage, all revisions (s)", lambda r: f"{r['stage_s']:.2f}")
    row("chunks in the index", lambda r: f"{r['total']:,.0f}")
    for mode in ("lexical", "vector", "hybrid"):
        row(
            f"search {mode} P50 / P95 (ms)",
            lambda r, m=mode: f"{r[f'{m}_p50']:.1f} / {r[f'{m}_p95']:.1f}",
        )
    for mode in ("lexical", "vector", "hybrid"):
        row(f"source chunk in top 10, {mode}", lambda r, m=mode: f"{r[f'{m}_recall']:.3f}")
    row("searches with no hit", lambda r: f"{r['empty']:.0f}")
    row("revision_counts (ms)", lambda r: f"{r['counts_ms']:.1f}")
    row("drop_revision, one (ms)", lambda r: f"{r['drop_ms']:.1f}")
    row(
        "drop an org's revisions (s)",
        lambda r: f"{r['drop_org_s']:.2f} ({r['drop_org_revisions']:.0f})",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
