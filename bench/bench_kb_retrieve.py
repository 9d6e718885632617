"""Benchmark of Retrieve and Answer over gRPC (seed 002) at 10k published chunks.

The knowledge base: the real documents of ``../shared/data/docs/eips``, each EIP published
``--copies`` times as a topic of its own in one organisation (7 copies: 11,529
published chunks, all searched by every question), processed in process through the
``KnowledgeBase`` with the hashing embedder (the vectors the model server below returns)
into the embedded SQLite index; the same published chunks are then staged into a Milvus
Lite index of a second data directory with a copy of the metadata store.

Each data directory is served by ``knowledge serve`` (its own process, one serving
process, authentication on) with the local deterministic model server
(``knowledge_server.testing.fake_models``, its own process) as embedder, reranker and
chat model over HTTP. Over gRPC with the Python SDK:

* Retrieve P50 / P95 with one client, the same questions to SQLite and Milvus Lite,
  alternating question by question, and the server's own step timings from the trace
  (embed, search, check, rerank); then each server alone, one after the other, on
  another 200 questions of the same kind;
* throughput with ``--clients`` (16) client processes (the SDK decodes in pure Python: in
  threads of one process the client would be the bottleneck);
* Answer's own overhead: Answer latency minus the model's time (``model_ms``), next to
  Retrieve's latency for the same questions.

    python bench/bench_kb_retrieve.py [--work DIR] [--copies 7] [--questions 200] [--before CHECKOUT]

``--work DIR`` keeps the built data directories for the next run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from knowledge_sdk import KnowledgeClient, Unavailable
from knowledge_server.auth import TokenStore
from knowledge_server.auth_model import Principal
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.kb.index.factory import MILVUS_LITE_FILE, IndexSettings, open_index
from knowledge_server.kb.service import KnowledgeBase
from knowledge_server.kb.store import DB_FILE
from knowledge_server.logs import configure_logging
from milvus_lite.server_manager import server_manager_instance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import served

ROOT = Path(__file__).resolve().parent.parent
ORG = "bench"
DIM = 256
BUILT = ".bench_kb_retrieve_built"
BACKENDS = ("sqlite", "milvus")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _fig(values: list[float]) -> str:
    return f"P50 {statistics.median(values):.1f} / P95 {_pct(values, 0.95):.1f} ms"


# -- building the knowledge base ----------------------------------------------------------------


def _build_sqlite(data: Path, docs: list[Path], copies: int) -> int:
    """Every EIP ``copies`` times as a published topic of ORG; returns the chunk count."""
    embedder = HashingEmbedder(DIM)
    kb = KnowledgeBase(data, index=open_index(data, DIM), embedder=embedder)
    ed = Principal("bench-editor", ORG, None, "operator")
    rv = Principal("bench-reviewer", ORG, None, "operator")
    wf = kb.workflow
    blobs = []
    for i, path in enumerate(docs):
        part = kb.store.upload_dir / f"up_bench{i}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(path.read_bytes())
        blobs.append(kb.store.keep_blob(part))
    revs = []
    for copy in range(copies):
        for path, (sha, size) in zip(docs, blobs, strict=True):
            topic = wf.create_topic(ed, f"{path.stem}-c{copy}", path.stem.upper())
            rev = wf.create_revision(ed, topic.id, f"1.{copy}")
            rev, _ = wf.add_file_source(
                ed, rev.id, rev.version, file_name=path.name, media_type="", sha256=sha, size=size
            )
            rev = wf.submit(ed, rev.id, rev.version)
            rev = wf.approve(rv, rev.id, rev.version)
            kb.queue.enqueue(ed, rev.id, rev.version)
            revs.append(rev.id)
    started = time.perf_counter()
    while (task := kb.queue.claim("bench")) is not None:
        kb.process_task(task)
    print(f"  processed {len(revs)} revisions in {time.perf_counter() - started:.1f} s")
    for rev_id in revs:
        rev = wf.revision(ed, rev_id)
        wf.publish(ed, rev_id, rev.version, "")
    chunks = sum(r.chunk_count for r in kb.store.revisions_in_states(ORG, ("PUBLISHED",)))
    kb.close()
    return chunks


def _copy_to_milvus(sqlite_data: Path, milvus_data: Path) -> None:
    """The metadata store copied, the published chunks staged into Milvus Lite with the
    same vectors (the hashing embedder's, as the model server computes them)."""
    milvus_data.mkdir(parents=True, exist_ok=True)
    shutil.copy2(sqlite_data / DB_FILE, milvus_data / DB_FILE)
    embedder = HashingEmbedder(DIM)
    source = open_index(sqlite_data, DIM)
    target = open_index(milvus_data, DIM, IndexSettings(backend="milvus"))
    kb = KnowledgeBase(milvus_data, index=target, embedder=embedder)
    started = time.perf_counter()
    staged = 0
    for rev in kb.store.revisions_in_states(ORG, ("PUBLISHED",)):
        chunks = source.get_chunks(ORG, [f"{rev.id}:{n}" for n in range(rev.chunk_count)])
        vectors = embedder.embed([c.text for c in chunks]).tolist()
        target.stage(ORG, rev.id, chunks, vectors)
        staged += len(chunks)
    print(f"  staged {staged} chunks into Milvus Lite in {time.perf_counter() - started:.1f} s")
    kb.close()
    source.close()
    # Milvus Lite serves the file from threads of this process until told otherwise, and
    # holds its lock: the serving process could not open it.
    server_manager_instance.release_server(str(milvus_data / MILVUS_LITE_FILE))


def _questions(data: Path, n: int, seed: int = 23) -> list[str]:
    """The first twelve words of ``n`` published chunks (fixed seed): questions the
    knowledge answers, in its own words."""
    index = open_index(data, DIM)
    kb = KnowledgeBase(data, index=index, embedder=HashingEmbedder(DIM))
    revs = kb.store.revisions_in_states(ORG, ("PUBLISHED",))
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        rev = rng.choice(revs)
        ordinal = rng.randrange(rev.chunk_count)
        chunk = index.get_chunks(ORG, [f"{rev.id}:{ordinal}"])[0]
        words = re.findall(r"[A-Za-z][A-Za-z0-9-]{2,}", chunk.text)
        question = " ".join(words[:12])
        if len(words) >= 6 and len(question) <= 1000:  # the default query limit
            out.append(question)
    kb.close()
    return out


# -- serving -------------------------------------------------------------------------------------


@contextmanager
def _model_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "knowledge_server.testing.fake_models", "--dim", str(DIM)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


def _serve_env(url: str, backend: str) -> dict[str, str]:
    return {
        "KNOWLEDGE_AUTH": "on",
        "KNOWLEDGE_BOOTSTRAP": "false",
        "KNOWLEDGE_WATCH_SESSIONS": "false",
        "KNOWLEDGE_EMBEDDER": "openai",
        "KNOWLEDGE_EMBEDDER_URL": url,
        "KNOWLEDGE_EMBEDDER_MODEL": "fake-embed",
        "KNOWLEDGE_EMBEDDER_DIM": str(DIM),
        "KNOWLEDGE_KB_INDEX": backend,
        "KNOWLEDGE_RERANK_URL": url,
        "KNOWLEDGE_RERANK_MODEL": "fake-rerank",
        "KNOWLEDGE_LLM_URL": url,
        "KNOWLEDGE_LLM_MODEL": "fake-chat",
    }


def _token(data: Path) -> str:
    store = TokenStore(data / "tokens.json")
    return store.create(f"bench-agent-{time.time_ns()}", ORG, None, "agent")[1]


# -- clients -------------------------------------------------------------------------------------


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = call()
    return (time.perf_counter() - started) * 1000, out


def _client_proc(address: str, token: str, questions: list[str], rounds: int, q: Any) -> None:
    configure_logging("auto", "error")
    answered = unavailable = 0
    with KnowledgeClient(address, token=token, timeout=30) as kc:
        q.put("ready")
        for _ in range(rounds):
            for question in questions:
                try:
                    kc.kb_retrieve(question)
                    answered += 1
                except Unavailable:  # past the budget under load: counted, not fatal
                    unavailable += 1
    q.put((answered, unavailable))


def _throughput(
    address: str, token: str, questions: list[str], clients: int
) -> tuple[float, int, int]:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    share = [questions[i::clients] for i in range(clients)]
    procs = [
        ctx.Process(target=_client_proc, args=(address, token, share[i], 2, q))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert q.get(timeout=120) == "ready"
    started = time.perf_counter()
    done = failed = 0
    for _ in procs:
        answered, unavailable = q.get(timeout=600)
        done += answered
        failed += unavailable
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join(30)
    return done / elapsed, done, failed


def _start_servers(
    stack: ExitStack,
    url: str,
    data: dict[str, Path],
    backends: list[str],
    before: Path | None,
    work: Path,
    local: bool = False,
) -> dict[str, tuple[str, str, subprocess.Popen[str]]]:
    """One ``knowledge serve`` per backend (and the earlier checkout's, when given; and,
    with ``local``, one on a copy of the SQLite data with no network dependency: the
    hashing embedder in process, no reranker)."""
    servers: dict[str, tuple[str, str, subprocess.Popen[str]]] = {}
    if local:
        data["sqlite-local"] = work / "sqlite-local"
        if not data["sqlite-local"].exists():
            shutil.copytree(data["sqlite"], data["sqlite-local"])
        backends.append("sqlite-local")
    if before is not None:
        data["sqlite-before"] = work / "sqlite-before"
        if not data["sqlite-before"].exists():
            shutil.copytree(data["sqlite"], data["sqlite-before"])
        backends.append("sqlite-before")
    for b in backends:
        token = _token(data[b])
        env = _serve_env(url, b.split("-")[0])
        if b == "sqlite-local":
            # The same vectors as the model server's (it computes the hashing embedder's).
            for name in ("KNOWLEDGE_EMBEDDER_URL", "KNOWLEDGE_EMBEDDER_MODEL"):
                env.pop(name)
            env["KNOWLEDGE_EMBEDDER"] = "hash"
            env["KNOWLEDGE_RERANK_URL"] = ""
        if b == "sqlite-before":
            assert before is not None
            code = before.resolve()
            env["PYTHONPATH"] = os.pathsep.join(
                str(code / part) for part in ("server", "sdk", "licensing", "bridge")
            )
        proc, address = stack.enter_context(served(data[b], env=env, stop_timeout=60))
        servers[b] = (address, token, proc)
    return servers


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
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--copies", type=int, default=7)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--answers", type=int, default=100)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument(
        "--local",
        action="store_true",
        help="also serve a copy of the SQLite data without network dependencies"
        " ('sqlite-local': hashing embedder in process, no reranker, the fused score)",
    )
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        help="another checkout (e.g. a git worktree of an earlier commit): its server on a"
        " copy of the SQLite data joins the comparison as 'sqlite-before'",
    )
    args = ap.parse_args()
    configure_logging("auto", "warning")
    backends = [b for b in args.backends.split(",") if b]
    work = args.work or Path(tempfile.mkdtemp(prefix="kbretrieve-"))
    data = {b: work / b for b in BACKENDS}
    if not (work / BUILT).exists():
        docs = sorted(args.docs.glob("eip-*.md"))
        if not docs:
            raise SystemExit(f"no eip-*.md in {args.docs}")
        print(f"building in {work}: {len(docs)} EIPs x {args.copies} topics")
        chunks = _build_sqlite(data["sqlite"], docs, args.copies)
        _copy_to_milvus(data["sqlite"], data["milvus"])
        (work / BUILT).write_text(str(chunks))
    chunks = int((work / BUILT).read_text())
    questions = _questions(data["sqlite"], args.questions)
    alone_questions = _questions(data["sqlite"], args.questions, seed=29)
    print(
        f"knowledge base: {chunks} published chunks in one organisation; {len(questions)} questions"
    )
    if not backends and args.before is None:
        return  # built only

    with ExitStack() as stack:
        url = stack.enter_context(_model_server())
        servers = _start_servers(stack, url, data, backends, args.before, work, args.local)
        clients = {
            b: stack.enter_context(KnowledgeClient(addr, token=tok, timeout=30))
            for b, (addr, tok, _) in servers.items()
        }
        for kc in clients.values():  # warm up: connections, Milvus Lite's first loads
            for question in questions[:10]:
                kc.kb_retrieve(question)

        # -- one client: retrieve, alternating backends question by question --------------------
        lat: dict[str, list[float]] = {b: [] for b in backends}
        steps: dict[str, dict[str, list[float]]] = {
            b: {"embed": [], "search": [], "check": [], "rerank": []} for b in backends
        }
        answerable = dict.fromkeys(backends, 0)
        for i, question in enumerate(questions):
            order = backends[i % len(backends) :] + backends[: i % len(backends)]
            for b in order:
                ms, out = _timed(lambda b=b, question=question: clients[b].kb_retrieve(question))
                lat[b].append(ms)
                answerable[b] += bool(out.answerable)
                t = out.trace
                for name, value in (
                    ("embed", t.embed_ms),
                    ("search", t.search_ms),
                    ("check", t.check_ms),
                    ("rerank", t.rerank_ms),
                ):
                    steps[b][name].append(float(value))
        print("Retrieve, one client over gRPC:")
        for b in backends:
            s = steps[b]
            print(
                f"  {b:13s} {_fig(lat[b])}, answerable {answerable[b]}/{len(questions)};"
                f" server steps P50 embed {statistics.median(s['embed']):.0f} / search"
                f" {statistics.median(s['search']):.0f} / check {statistics.median(s['check']):.0f}"
                f" / rerank {statistics.median(s['rerank']):.0f} ms, P95 search"
                f" {_pct(s['search'], 0.95):.0f} ms"
            )

        # -- one client, one server at a time ----------------------------------------------------
        # Alternating keeps the comparison fair but wakes an idle process for every call;
        # here each server answers a run of other questions of the same kind on its own.
        print("Retrieve, one client, each server alone (other questions):")
        for b in backends:
            alone, search = [], []
            for question in alone_questions:
                ms, out = _timed(lambda b=b, question=question: clients[b].kb_retrieve(question))
                alone.append(ms)
                search.append(float(out.trace.search_ms))
            print(
                f"  {b:13s} {_fig(alone)}; server step search P50"
                f" {statistics.median(search):.0f} / P95 {_pct(search, 0.95):.0f} ms"
            )

        # -- answer overhead ---------------------------------------------------------------------
        print("Answer, one client (overhead = latency - model_ms):")
        for b in backends:
            total, model, own, ret = [], [], [], []
            for question in questions[: args.answers]:
                ms, out = _timed(lambda b=b, question=question: clients[b].kb_answer(question))
                total.append(ms)
                model.append(float(out.model_ms))
                own.append(ms - out.model_ms)
                rms, _ = _timed(lambda b=b, question=question: clients[b].kb_retrieve(question))
                ret.append(rms)
            print(
                f"  {b:13s} Answer {_fig(total)}; model_ms P50 {statistics.median(model):.1f};"
                f" Answer minus model {_fig(own)}; Retrieve of the same questions {_fig(ret)}"
            )

        # -- throughput --------------------------------------------------------------------------
        print(f"Retrieve throughput, {args.clients} client processes:")
        for b in backends:
            addr, tok, _ = servers[b]
            rate, done, failed = _throughput(addr, tok, questions, args.clients)
            print(
                f"  {b:13s} {rate:.1f} answered retrievals/s ({done} answered,"
                f" {failed} UNAVAILABLE past the budget)"
            )


if __name__ == "__main__":
    main()
