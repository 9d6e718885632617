"""A labelled code-search set made from a git repository's own history.

The sets in ``shared/data/code-eval`` were made this way; this script makes one more from
any repository, so the ranking can be checked on code it was never tuned on:

* every non-merge commit of the current branch whose changed source files (the code
  lane's own ``file_kind``: tests, documents, configuration, changelogs, lock and
  generated files are not source) that still exist at HEAD number 1 to ``--max-files``;
* its subject line, minus a trailing ``(#123)``, is the question; those files are the
  answer; subjects that only name a version, a release or a merge are dropped;
* the snapshot is HEAD (``git archive``: only committed files; the answers are regular
  files of HEAD, not symlinks or submodules).

It writes ``OUT/NAME-eval.jsonl`` and ``OUT/NAME-SHORTSHA.tar.gz`` in the layout of
``shared/data/code-eval``, so ``python bench/bench_relevance.py --shared OUT --sets NAME``
asks the questions; for a set it has no published floor for, that script computes the
floor (whole-file BM25 over the set's source files) itself.

Usage: python bench/eval_from_git.py REPO --name NAME --out DIR [--max-files 3] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from knowledge_server.code.chunking import generated_header, language_for
from knowledge_server.code.rank import file_kind

# The sets of shared/data/code-eval, whose floors bench_relevance has from their README.
PUBLISHED = frozenset({"click", "starlette", "cobra", "fd"})
_PR_SUFFIX = re.compile(r"\s*\(#\d+\)\s*$")
_VERSION = r"v?\d+(\.\d+)+\S*"
# Subjects that only name a version, a release or a merge: they say nothing about the code.
_NO_QUESTION = [
    re.compile(rf"^{_VERSION}$", re.IGNORECASE),  # "1.4.0", "v2.0.0-rc1"
    re.compile(rf"^(release|version|bump|prepare)\w*\b.*\b({_VERSION}|version)$", re.IGNORECASE),
    re.compile(rf"^(release|version)\w*\s+{_VERSION}\b", re.IGNORECASE),  # "Release 8.1 (...)"
    re.compile(r"^merge\b", re.IGNORECASE),  # "Merge branch ..." kept by a rebase
]


def _git(repo: Path, *args: str) -> str:
    git = shutil.which("git")
    if git is None:
        sys.exit("git is not on PATH")
    return subprocess.run(
        [git, "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def is_source(repo: Path, path: str) -> bool:
    """Whether the code lane calls ``path`` source, reading its ``#!`` line and the
    comments at its top (a generated file is not source) as the index does."""
    try:
        with open(repo / path, "rb") as f:
            head = f.read(8_000).decode("utf-8", "replace")
    except OSError:
        head = ""
    return file_kind(path, language_for(path, head), generated_header(head)) == "source"


def question(subject: str) -> str | None:
    """The question a commit subject makes, or None for one that names no change."""
    q = _PR_SUFFIX.sub("", subject).strip()
    if not q or any(p.search(q) for p in _NO_QUESTION):
        return None
    return q


def _head_files(repo: Path) -> set[str]:
    """The regular files of HEAD (what ``git archive HEAD`` writes; no symlinks, which the
    indexer does not follow, and no submodules)."""
    out = set()
    for entry in _git(repo, "ls-tree", "-r", "-z", "--full-tree", "HEAD").split("\0"):
        meta, _, path = entry.partition("\t")
        if path and meta.split(" ")[0] in ("100644", "100755"):
            out.add(path)
    return out


def make_set(repo: Path, max_files: int = 3, limit: int = 0) -> tuple[str, list[dict[str, object]]]:
    """(HEAD's commit, the questions: {"query", "files"} newest first)."""
    head = _git(repo, "rev-parse", "HEAD").strip()
    present = _head_files(repo)
    # NUL-separated and unquoted, so any path (spaces, non-ASCII) comes through as it is.
    log = _git(
        repo,
        "-c",
        "core.quotePath=false",
        "log",
        "-z",
        "--no-merges",
        "--no-renames",
        "--format=%x01%s",
        "--name-only",
    )
    out: list[dict[str, object]] = []
    for entry in log.split("\x01")[1:]:
        subject, _, names = entry.partition("\0")
        q = question(subject)
        if q is None:
            continue
        changed = {f for f in names.lstrip("\n").split("\0") if f}
        files = sorted(f for f in changed if f in present and is_source(repo, f))
        if 1 <= len(files) <= max_files:
            out.append({"query": q, "files": files})
            if limit and len(out) >= limit:
                break
    return head, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("repo", type=Path, help="a git working copy (its current branch is read)")
    ap.add_argument("--name", required=True, help="the set's name (file names, --sets)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the two files")
    ap.add_argument("--max-files", type=int, default=3, help="most answer files per question")
    ap.add_argument("--limit", type=int, default=0, help="newest N questions only (0: all)")
    args = ap.parse_args()
    if not re.fullmatch(r"[A-Za-z0-9_.]+", args.name):
        sys.exit("--name: letters, digits, '_' and '.' only (it becomes a file name)")
    if args.name in PUBLISHED:
        sys.exit(
            f"--name {args.name}: a published set's name (bench_relevance would use its floor)"
        )
    if args.max_files < 1 or args.limit < 0:
        sys.exit("--max-files must be at least 1 and --limit at least 0")
    try:
        top = Path(_git(args.repo, "rev-parse", "--show-toplevel").strip())
    except subprocess.CalledProcessError as e:
        sys.exit(f"git failed on {args.repo}: {e.stderr.strip() or e}")
    if top.resolve() != args.repo.resolve():
        sys.exit(f"{args.repo} is inside the repository {top}: give its top directory")
    try:
        head, qs = make_set(args.repo, args.max_files, args.limit)
    except subprocess.CalledProcessError as e:
        sys.exit(f"git failed on {args.repo}: {e.stderr.strip() or e}")
    if not qs:
        sys.exit(
            f"no commit of {args.repo} changed 1-{args.max_files} source files that still exist"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob(f"{args.name}-*.tar.gz"):
        old.unlink()  # bench_relevance takes the one snapshot of a set
    tar = args.out / f"{args.name}-{head[:12]}.tar.gz"
    _git(
        args.repo,
        "archive",
        "--format=tar.gz",
        f"--prefix={args.name}/",
        "-o",
        str(tar.resolve()),
        "HEAD",
    )
    with (args.out / f"{args.name}-eval.jsonl").open("w") as f:
        for q in qs:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    print(f"{len(qs)} questions from {args.repo} at {head[:12]}: {tar}")


if __name__ == "__main__":
    main()
