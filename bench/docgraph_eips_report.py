"""Document graph over the EIP corpus: two LLM runs (fake server) and one structural-only run.

    python bench/docgraph_eips_report.py [--eips PATH] [--keep DIR]

The fake LLM is started as a separate process (``python -m knowledge_server.testing.fake_llm``)
so the real HTTP client path is measured. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from knowledge_server.docgraph.build import BuildReport, DocGraphBuilder
from knowledge_server.docgraph.llm import LLMClient, LLMSettings
from knowledge_server.docgraph.ops import DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks
from knowledge_server.docgraph.store import DocGraphStore

DEFAULT_EIPS = Path(__file__).resolve().parents[2] / "shared" / "data" / "docs" / "eips"


def _stats(url: str) -> dict:
    # The URL is the one the fake LLM server this script started printed (http://127.0.0.1).
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:  # noqa: S310 - see above
        return json.loads(resp.read())


def _row(label: str, r: BuildReport, calls: int, seconds: float) -> str:
    return (
        f"{label:<28} docs={r.documents:<4} chunks={r.chunks:<5} entities={r.entities:<5} "
        f"relations={r.relations:<5} themes={r.themes:<4} summaries={r.summaries:<3} "
        f"llm_calls={calls:<5} noop={r.noop!s:<5} wall={seconds:.2f}s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eips", type=Path, default=DEFAULT_EIPS)
    ap.add_argument("--keep", type=Path, default=None, help="data directory to keep the layers in")
    args = ap.parse_args(argv)
    if not args.eips.is_dir():
        print(f"EIP corpus not found at {args.eips}", file=sys.stderr)
        return 2
    t = time.perf_counter()
    chunks = load_markdown_chunks(args.eips, "eip-*.md")
    print(
        f"corpus: {args.eips}  files={len({c.path for c in chunks})}  chunks={len(chunks)}  "
        f"chunking={time.perf_counter() - t:.2f}s"
    )

    fake = subprocess.Popen(
        [sys.executable, "-m", "knowledge_server.testing.fake_llm", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = (fake.stdout.readline() if fake.stdout else "").strip()
        data = Path(args.keep or tempfile.mkdtemp(prefix="docgraph-eips-"))
        store = DocGraphStore(data / "llm")
        client = LLMClient(LLMSettings(base_url=url, model="fake-rules", backoff_seconds=0.1))
        builder = DocGraphBuilder(store, client)
        est = builder.estimate(chunks)
        print(
            f"estimate before run 1: chunks_to_process={est.chunks_to_process} "
            f"expected_calls={est.expected_calls} cached={est.cached}"
        )

        results = []
        for label, force in (
            ("run 1 (fake LLM)", False),
            ("run 2 (same input)", False),
            ("run 2b (forced, from cache)", True),
        ):
            before = _stats(url)["calls"]
            t = time.perf_counter()
            rep = builder.build(chunks, force=force)
            seconds = time.perf_counter() - t
            calls = _stats(url)["calls"] - before
            results.append(rep)
            print(_row(label, rep, calls, seconds))
        first, forced = results[0], results[2]
        identical = store.dump_layer(first.rev_id) == store.dump_layer(forced.rev_id)
        print(
            f"layer rev {first.rev_id} vs rev {forced.rev_id}: byte-identical={identical} "
            f"sha256={store.layer_hash(first.rev_id)[:16]}"
        )
        print(
            "validation counters (run 1):",
            json.dumps({k: v for k, v in first.counters.items()}, sort_keys=True),
        )

        structural = DocGraphStore(data / "structural")
        t = time.perf_counter()
        srep = DocGraphBuilder(structural, None).build(chunks)
        print(_row("structural only (no LLM)", srep, 0, time.perf_counter() - t))
        print(f"structural layer state: llm_state={srep.llm_state} reason={srep.reason!r}")

        ops = DocGraphOps(store, client)
        t = time.perf_counter()
        answers = [
            ops.themes(limit=5),
            ops.entity_neighbors("EIP-1559", depth=2),
            ops.doc_relations(doc="eip-1559.md"),
            ops.global_overview(limit=5),
            ops.search_levels("fee market and base fee burn in EIP-1559"),
        ]
        print(
            f"operations: {len(answers)} answered in {time.perf_counter() - t:.2f}s; "
            + ", ".join(f"{a['op']}={a['limits']['returned']}" for a in answers)
        )
        top = answers[0]["themes"][:3]
        for theme in top:
            print(
                f"  theme {theme['theme_id'][:10]} '{theme['title']}' size={theme['size']} "
                f"at {theme['path']}:{theme['start_line']}"
            )
        print(f"data directory: {data}")
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
