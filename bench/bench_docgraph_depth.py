#!/usr/bin/env python3
"""How useful the document graph is without an LLM, on two public documentation sets.

    python bench/bench_docgraph_depth.py [--data SHARED_DATA] [--repeat 1] [--corpus eips]

Corpora: the EIPs (``docs/eips`` of the shared data) and the Starlette documentation (the
``docs/*.md`` of the starlette code-eval archive). For each, a real server (gRPC on a loopback
port, Enterprise licence signed by a throw-away key) indexes a copy of the corpus, builds a
structural-only document graph, and answers the corpus's fixed list of 30 questions
(``bench/docgraph_questions/<corpus>.txt``) with ``SearchLevels`` and ``Search mode=docs``
(and ``mode=themes``). Printed per corpus:

* structural-only build time (the server's ``ms``) and entity / relation / theme counts;
* SearchLevels and Search P50 / P95 over ``--repeat`` rounds of the 30 questions (rounds
  after the first answer Search from its result cache);
* questions answered: SearchLevels ``found=true``; Search items that come from the graph
  (``match_kind`` entity/theme, when the server reports it) and any item at all; and, as a
  check that an answer is the right one, how often a document listed for the question in
  ``<corpus>.expected`` is among the first 5 distinct documents of each answer;
* overlap with an LLM build: the share of entities an LLM-only build with the project's fake
  LLM server finds that the structural build also has (same normalised name, any kind).

Asserts nothing about time; figures go into bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ROOT / "bench" / "docgraph_questions"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def questions(corpus: str) -> list[str]:
    lines = (QUESTIONS / f"{corpus}.txt").read_text(encoding="utf-8").splitlines()
    out = [q.strip() for q in lines if q.strip() and not q.startswith("#")]
    assert len(out) == 30, (corpus, len(out))
    return out


def expected(corpus: str) -> list[set[str]]:
    """Per question, the documents that answer it (``<corpus>.expected``, same order)."""
    lines = (QUESTIONS / f"{corpus}.expected").read_text(encoding="utf-8").splitlines()
    out = [set(ln.split()) for ln in lines if ln.strip() and not ln.startswith("#")]
    assert len(out) == 30, (corpus, len(out))
    return out


def _top_paths(paths: list[str], k: int = 5) -> list[str]:
    """The first ``k`` distinct documents of a ranked list of paths."""
    out: list[str] = []
    for p in paths:
        name = Path(p).name
        if name not in out:
            out.append(name)
    return out[:k]


def prepare(corpus: str, shared: Path, into: Path) -> Path:
    """A workspace folder holding only the corpus's Markdown documents."""
    ws = into / corpus
    ws.mkdir(parents=True)
    if corpus == "eips":
        for f in sorted((shared / "docs" / "eips").glob("eip-*.md")):
            shutil.copy(f, ws / f.name)
        return ws
    archive = next((shared / "code-eval").glob("starlette-*.tar.gz"))
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.isfile() and m.name.endswith(".md") and "/docs/" in "/" + m.name
        ]
        for m in members:
            data = tar.extractfile(m)
            assert data is not None
            (ws / Path(m.name).name).write_bytes(data.read())
    return ws


def licence(data_dir: Path, keys: Path) -> dict[str, str]:
    from knowledge_licensing import FEATURE_DOC_GRAPH, generate_keypair, issue_licence

    private, public = generate_keypair("bench-1", keys)
    ring = data_dir / "licence-keys"
    ring.mkdir(parents=True, exist_ok=True)
    (ring / public.name).write_bytes(public.read_bytes())
    now = datetime.now(UTC)
    (data_dir / "licence.json").write_bytes(
        issue_licence(
            private,
            licence_id="bench",
            licensee="bench",
            edition="enterprise",
            features=(FEATURE_DOC_GRAPH,),
            not_before=now - timedelta(days=1),
            expires_at=now + timedelta(days=1),
        )
    )
    return {"licence_dev_keys_dir": str(ring)}


async def _summary(stream: Any) -> Any:
    out = None
    async for ev in stream:
        if ev.summary is not None:
            out = ev.summary
    return out


def overlap(ws: Path) -> tuple[int, int, int, int, int]:
    """(LLM-build entities, of them also in the structural build, structural entities,
    documents with a theme member mentioned, documents) for the corpus chunked by headings."""
    from knowledge_server.docgraph.build import BuildSettings, DocGraphBuilder
    from knowledge_server.docgraph.llm import LLMClient, LLMSettings
    from knowledge_server.docgraph.sample import load_markdown_chunks
    from knowledge_server.docgraph.store import DocGraphStore
    from knowledge_server.testing.fake_llm import FakeLLMServer

    chunks = load_markdown_chunks(ws, "*.md")
    with tempfile.TemporaryDirectory() as tmp, FakeLLMServer() as fake:
        llm_store = DocGraphStore(Path(tmp) / "llm")
        client = LLMClient(LLMSettings(base_url=fake.url, model="fake-rules", backoff_seconds=0))
        rep = DocGraphBuilder(
            llm_store, client, BuildSettings(structural=False, summaries=False)
        ).build(chunks)
        st_store = DocGraphStore(Path(tmp) / "st")
        srep = DocGraphBuilder(st_store, None).build(chunks)

        def names(store: DocGraphStore, rev: int | None) -> set[str]:
            db = sqlite3.connect(store.path)
            try:
                return {
                    r[0] for r in db.execute("SELECT norm_name FROM entity WHERE rev_id=?", (rev,))
                }
            finally:
                db.close()

        a, b = names(llm_store, rep.rev_id), names(st_store, srep.rev_id)
        db = sqlite3.connect(st_store.path)
        try:
            covered = db.execute(
                "SELECT count(DISTINCT m.path) FROM theme_member tm JOIN entity_mention m ON "
                "m.rev_id=tm.rev_id AND m.entity_id=tm.entity_id WHERE tm.rev_id=?",
                (srep.rev_id,),
            ).fetchone()[0]
        finally:
            db.close()
        client.close()
        llm_store.close()
        st_store.close()
        return len(a), len(a & b), len(b), int(covered), len({c.path for c in chunks})


async def run_corpus(corpus: str, shared: Path, repeat: int, tmp: Path) -> dict[str, Any]:
    from knowledge_sdk import AsyncKnowledgeClient
    from knowledge_sdk import types as v1
    from knowledge_server.config import load_config
    from knowledge_server.logs import configure_logging
    from knowledge_server.runtime import build_app
    from knowledge_server.server import create_server

    configure_logging("auto", "warning")
    ws = prepare(corpus, shared, tmp / "ws")
    data = tmp / f"data-{corpus}"
    data.mkdir()
    extra = licence(data, tmp / f"keys-{corpus}")
    cfg = load_config(
        env={},
        overrides={
            "listen": "127.0.0.1:0",
            "data_dir": str(data),
            "bootstrap": False,
            "workspaces": [str(ws)],
            **extra,
        },
    )
    app = build_app(cfg)
    served = await create_server(cfg, app)
    await served.server.start()
    qs = questions(corpus)
    want = expected(corpus)
    out: dict[str, Any] = {"corpus": corpus, "documents": len(list(ws.glob("*.md")))}
    try:
        async with AsyncKnowledgeClient(f"127.0.0.1:{served.port}") as kc:
            await _summary(kc.index_workspace(str(ws)))
            t = time.perf_counter()
            s = await _summary(
                kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws), structural_only=True))
            )
            out["build_wall_s"] = time.perf_counter() - t
            out["build_ms"] = s.ms
            for key in ("documents", "chunks", "entities", "relations", "themes"):
                out[key] = int(s.counters[key])
            lat_levels: list[float] = []
            lat_docs: list[float] = []
            lat_themes: list[float] = []
            found = graph_docs = any_docs = graph_themes = 0
            hit_docs = hit_themes = hit_levels = 0
            empty: list[str] = []
            for rnd in range(repeat):
                for qi, q in enumerate(qs):
                    t = time.perf_counter()
                    lv = await kc.search_levels(q, limit=10)
                    lat_levels.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    sd = await kc.search(q, mode="docs", include=["code"], limit=10)
                    lat_docs.append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    sth = await kc.search(q, mode="themes", include=["code"], limit=10)
                    lat_themes.append((time.perf_counter() - t) * 1000)
                    if rnd:
                        continue
                    hit_levels += bool(
                        want[qi] & set(_top_paths([h.address.path for h in lv.items]))
                    )
                    hit_docs += bool(
                        want[qi] & set(_top_paths([i.path for i in sd.lanes.code.items]))
                    )
                    hit_themes += bool(
                        want[qi] & set(_top_paths([i.path for i in sth.lanes.code.items]))
                    )
                    found += bool(lv.found)
                    items = list(sd.lanes.code.items)
                    any_docs += bool(items)
                    if not items:
                        empty.append(f"q{qi + 1}: {sd.lanes.code.degradation_reason[:120]}")
                    graph_docs += any(
                        getattr(it, "match_kind", "") in ("entity", "theme") for it in items
                    )
                    graph_themes += any(
                        getattr(it, "match_kind", "") == "theme" for it in sth.lanes.code.items
                    )
            out.update(
                levels_p50=pct(lat_levels, 50),
                levels_p95=pct(lat_levels, 95),
                docs_p50=pct(lat_docs, 50),
                docs_p95=pct(lat_docs, 95),
                themes_p50=pct(lat_themes, 50),
                themes_p95=pct(lat_themes, 95),
                levels_found=found,
                docs_any=any_docs,
                docs_graph=graph_docs,
                themes_graph=graph_themes,
                hit_docs=hit_docs,
                hit_themes=hit_themes,
                hit_levels=hit_levels,
                empty=empty,
            )
    finally:
        await served.server.stop(0)
        app_close = getattr(app, "close", None)
        if app_close is not None:
            res = app_close()
            if asyncio.iscoroutine(res):
                await res
    (
        out["llm_entities"],
        out["llm_also_structural"],
        out["structural_entities_direct"],
        out["theme_documents"],
        out["all_documents"],
    ) = overlap(ws)
    return out


def report(r: dict[str, Any]) -> str:
    share = r["llm_also_structural"] / r["llm_entities"] if r["llm_entities"] else 0.0
    return (
        f"[{r['corpus']}] files={r['documents']} chunks={r['chunks']}\n"
        f"  structural-only build: {r['build_ms']:.0f} ms (server), wall {r['build_wall_s']:.2f}s; "
        f"entities={r['entities']} relations={r['relations']} themes={r['themes']}\n"
        f"  SearchLevels  P50={r['levels_p50']:.1f} ms P95={r['levels_p95']:.1f} ms; "
        f"found=true {r['levels_found']}/30, expected document in top 5 {r['hit_levels']}/30\n"
        f"  Search docs   P50={r['docs_p50']:.1f} ms P95={r['docs_p95']:.1f} ms; "
        f"any item {r['docs_any']}/30, graph-matched (entity|theme) {r['docs_graph']}/30, "
        f"expected document in top 5 {r['hit_docs']}/30\n"
        f"  Search themes P50={r['themes_p50']:.1f} ms P95={r['themes_p95']:.1f} ms; "
        f"theme-level evidence {r['themes_graph']}/30, "
        f"expected document in top 5 {r['hit_themes']}/30\n"
        f"  overlap: LLM build (fake LLM) entities={r['llm_entities']}, also in structural "
        f"build={r['llm_also_structural']} ({share:.0%}); structural build "
        f"entities={r['structural_entities_direct']}, documents with a theme "
        f"{r['theme_documents']}/{r['all_documents']}"
        + "".join(f"\n  Search docs without items: {e}" for e in r["empty"])
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("KNOWLEDGE_SHARED_DATA", str(ROOT.parent / "shared" / "data"))),
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--corpus", action="append", choices=("eips", "starlette"))
    args = ap.parse_args(argv)
    if not (args.data / "docs" / "eips").is_dir():
        print(f"shared data not found at {args.data}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="docgraph-depth-") as tmp:
        for corpus in args.corpus or ["eips", "starlette"]:
            tmp_c = Path(tmp) / corpus
            tmp_c.mkdir()
            r = asyncio.run(run_corpus(corpus, args.data, args.repeat, tmp_c))
            print(report(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
