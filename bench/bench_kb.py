"""Benchmark of the knowledge base's processing, publish switch and reconcile.

On the real documents of ``../shared/data/docs/eips`` (each EIP a topic with two
revisions: the document, then the document plus an FAQ entry), in process, with the
hashing embedder:

* PROCESS throughput: documents per minute and chunks per second over every revision,
  with the time of each step (convert + chunk, embed, stage, metadata);
* publish switch: one PublishRevision transaction replacing a topic's release, P50 / P95;
* reconcile with the index at 10k chunks or more (``--orgs`` copies of the corpus in as
  many organisations): a clean pass, then a pass after drift (revisions dropped from the
  index, orphans planted), then a pass after the repairs.

The retrieval index is the one the server opens (``kb/index/factory.py``): ``--index
sqlite`` (embedded, the default) or ``--index milvus`` (a Milvus Lite file in the work
directory, or ``--milvus-uri``).

    python bench/bench_kb.py [--docs DIR] [--orgs 2] [--index sqlite|milvus]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from knowledge_server.auth_model import Principal
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.kb.index.factory import IndexSettings, open_index
from knowledge_server.kb.service import KnowledgeBase

ROOT = Path(__file__).resolve().parent.parent


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _prepare(kb: KnowledgeBase, org: str, docs: list[Path]) -> list[tuple[str, str, str]]:
    """Each EIP a topic with two approved revisions; returns (topic, rev1, rev2)."""
    ed = Principal("bench-editor", org, None, "operator")
    rv = Principal("bench-reviewer", org, None, "operator")
    wf = kb.workflow
    out = []
    for i, path in enumerate(docs):
        topic = wf.create_topic(ed, path.stem, path.stem.upper())
        part = kb.store.upload_dir / f"up_bench{i}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(path.read_bytes())
        sha, size = kb.store.keep_blob(part)
        part.unlink()
        revs = []
        for label in ("1", "2"):
            rev = wf.create_revision(ed, topic.id, label, based_on=revs[-1] if revs else "")
            if not revs:
                rev, _ = wf.add_file_source(
                    ed,
                    rev.id,
                    rev.version,
                    file_name=path.name,
                    media_type="",
                    sha256=sha,
                    size=size,
                )
            else:
                rev, _ = wf.put_faq(
                    ed, rev.id, rev.version, question=f"What is {path.stem}?", answer=path.stem
                )
            rev = wf.submit(ed, rev.id, rev.version)
            rev = wf.approve(rv, rev.id, rev.version)
            kb.queue.enqueue(ed, rev.id, rev.version)
            revs.append(rev.id)
        out.append((topic.id, revs[0], revs[1]))
    return out


def _process_all(kb: KnowledgeBase) -> tuple[int, float]:
    runs = 0
    started = time.perf_counter()
    while (task := kb.queue.claim("bench")) is not None:
        kb.process_task(task)
        runs += 1
    return runs, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--docs",
        type=Path,
        default=Path(os.environ.get("KNOWLEDGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
        / "docs"
        / "eips",
    )
    ap.add_argument(
        "--orgs",
        type=int,
        default=2,
        help="copies of the corpus (organisations) for the reconcile figure",
    )
    ap.add_argument(
        "--work", type=Path, default=None, help="data directory (default: a temporary one)"
    )
    ap.add_argument("--index", choices=("sqlite", "milvus"), default="sqlite")
    ap.add_argument("--milvus-uri", default="", help="a Milvus server (default: Milvus Lite)")
    args = ap.parse_args()
    docs = sorted(args.docs.glob("eip-*.md"))
    if not docs:
        raise SystemExit(f"no eip-*.md in {args.docs}")
    work = args.work or Path(tempfile.mkdtemp(prefix="kbbench-"))
    embedder = HashingEmbedder()
    settings = IndexSettings(backend=args.index, milvus_uri=args.milvus_uri)
    index = open_index(work, embedder.dim, settings)
    kb = KnowledgeBase(work, index=index, embedder=embedder)
    corpus_bytes = sum(p.stat().st_size for p in docs)
    print(
        f"documents: {len(docs)} EIPs, {corpus_bytes / 1e6:.2f} MB; embedder {embedder.identity}; index: {settings.describe()}"
    )

    # -- processing ----------------------------------------------------------------------
    t0 = time.perf_counter()
    topics = _prepare(kb, "org-0", docs)
    prep = time.perf_counter() - t0
    runs, secs = _process_all(kb)
    revs = kb.store.revisions_in_states("org-0", ("PROCESSED",))
    chunks = sum(r.chunk_count for r in revs)
    embed_ms = 0.0
    for t in kb.store.tasks_in_state("SUCCEEDED"):
        embed_ms += sum(ms for _, _, ms, _ in kb.store.embed_calls(t.org, t.id))
    print(f"prepare (topics, uploads, review): {prep:.2f} s for {len(docs)} topics x 2 revisions")
    print(
        f"PROCESS: {runs} revisions ({runs} documents) in {secs:.2f} s = {runs / secs * 60:.0f} documents/min,"
        f" {chunks} chunks = {chunks / secs:.0f} chunks/s; embedding {embed_ms / 1000:.2f} s of it"
        f" ({chunks / (embed_ms / 1000):.0f} chunks/s embedded)"
    )

    # -- publish switch --------------------------------------------------------------------
    pub = Principal("bench-publisher", "org-0", None, "operator")
    wf = kb.workflow
    for _, rev1, _ in topics:
        r = wf.revision(pub, rev1)
        wf.publish(pub, rev1, r.version, "")
    switch_ms = []
    for _, rev1, rev2 in topics:
        r = wf.revision(pub, rev2)
        t = time.perf_counter()
        wf.publish(pub, rev2, r.version, rev1)
        switch_ms.append((time.perf_counter() - t) * 1000)
    assert kb.published_revision_ids("org-0") == {t[2] for t in topics}
    print(
        f"publish switch ({len(switch_ms)} topics, one transaction each): P50 {statistics.median(switch_ms):.2f} ms,"
        f" P95 {_pct(switch_ms, 0.95):.2f} ms, max {max(switch_ms):.2f} ms"
    )

    # -- reconcile at >= 10k chunks ----------------------------------------------------------
    for n in range(1, args.orgs):
        _prepare(kb, f"org-{n}", docs)
    if args.orgs > 1:
        _process_all(kb)
    total = sum(index.revision_counts().values())
    indexed = len(index.revision_counts())
    timings = []
    t = time.perf_counter()
    clean = kb.reconcile(None, "bench")
    timings.append(("clean", (time.perf_counter() - t) * 1000, clean))
    # drift: 10 revisions lost from the index, 10 orphans planted
    lost = [r.id for r in kb.store.revisions_in_states("org-0", ("PUBLISHED",))[:10]]
    # (the orphans copy a chunk each, read before any revision is dropped)
    models = [index.get_chunks("org-0", [f"{topics[i][2]}:0"]) for i in range(10)]
    assert all(models), "no staged chunk to copy for the orphans"
    for rev_id in lost:
        index.drop_revision("org-0", rev_id)
    for i, model in enumerate(models):
        orphan = [
            replace(c, revision_id=f"rev_orphan{i}", chunk_id=f"rev_orphan{i}:0") for c in model
        ]
        index.stage(
            "org-0", f"rev_orphan{i}", orphan, embedder.embed([c.text for c in orphan]).tolist()
        )
    t = time.perf_counter()
    drift = kb.reconcile(None, "bench")
    timings.append(("drift", (time.perf_counter() - t) * 1000, drift))
    _process_all(kb)
    t = time.perf_counter()
    after = kb.reconcile(None, "bench")
    timings.append(("after repair", (time.perf_counter() - t) * 1000, after))
    print(
        f"reconcile over {total} chunks in {indexed} indexed revisions ({args.orgs} organisations):"
    )
    for name, ms, rep in timings:
        print(
            f"  {name}: {ms:.1f} ms, checked {rep.checked}, dropped {len(rep.dropped)},"
            f" requeued {len(rep.requeued)}, already queued {len(rep.already_queued)}"
        )
    kb.close()


if __name__ == "__main__":
    main()
