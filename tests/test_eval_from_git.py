"""``bench/eval_from_git.py`` makes a labelled code-search set from a repository's history
the way ``shared/data/code-eval``'s sets were made, and ``bench/bench_relevance.py`` asks it
with a floor it computes itself (a real git repository, the real indexer and search)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="git is not on PATH")


def _git(repo: Path, *args: str) -> None:
    assert GIT is not None
    subprocess.run(
        [GIT, "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        check=True,
        capture_output=True,
    )


def _commit(repo: Path, subject: str, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        p = repo / rel
        if text is None:
            _git(repo, "rm", "-q", rel)
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        _git(repo, "add", rel)
    _git(repo, "commit", "-q", "-m", subject)


def _make_set(repo: Path, out: Path) -> str:
    """``bench/eval_from_git.py`` run on ``repo`` as a user runs it; its standard output."""
    script = ROOT / "bench" / "eval_from_git.py"
    run = subprocess.run(
        [sys.executable, str(script), str(repo), "--name", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return run.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    _commit(
        r,
        "Initial layout",
        {
            "README.md": "# demo\n",
            "src/demo/parser.py": "def parse_header(line):\n    return line.split(':')\n",
            "src/demo/render.py": "def render_table(rows):\n    return '\\n'.join(rows)\n",
            "src/demo/cache.py": "def evict_oldest(cache):\n    cache.pop(next(iter(cache)))\n",
            "src/demo/old.py": "def legacy():\n    return 1\n",
            "src/demo/net.py": "def fetch_url(url):\n    return url\n",
        },
    )
    _commit(
        r,
        "Parse folded header lines (#12)",
        {
            "src/demo/parser.py": "def parse_header(line):\n    # folded header\n"
            "    return line.split(':', 1)\n",
            "tests/test_parser.py": "def test_folded():\n    pass\n",
        },
    )
    _commit(r, "Release 1.2.0", {"src/demo/__init__.py": "__version__ = '1.2.0'\n"})
    _commit(
        r,
        "Add four helper modules",
        {f"src/demo/{n}.py": f"def {n}_helper():\n    return 0\n" for n in "abcd"},
    )
    _commit(r, "Tweak the legacy helper", {"src/demo/old.py": "def legacy():\n    return 2\n"})
    _commit(r, "Drop the legacy module", {"src/demo/old.py": None})
    _commit(r, "Fix a typo in the readme", {"README.md": "# demo project\n"})
    _commit(
        r,
        "Fetch URLs with a timeout",
        {"src/demo/net.py": "def fetch_url(url, timeout=10):\n    return url, timeout\n"},
    )
    _commit(
        r,
        "Render table rows with an evict of the oldest cache entry",
        {
            "src/demo/render.py": "def render_table(rows):\n    return '\\n'.join(map(str, rows))\n",
            "src/demo/cache.py": "def evict_oldest(cache):\n    cache.pop(next(iter(cache)), None)\n",
        },
    )
    return r


def test_a_set_is_made_from_commits_that_changed_one_to_three_existing_source_files(
    repo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sets"
    assert "3 questions" in _make_set(repo, out)
    got = [json.loads(line) for line in (out / "demo-eval.jsonl").read_text().splitlines()]
    # Newest first. Not questions: the readme-only commit, the deleted module's two, the
    # commit of four new modules, the release, and the initial commit (four source files left).
    # The test file beside parser.py is not an answer, and "(#12)" is not a word.
    assert got == [
        {
            "query": "Render table rows with an evict of the oldest cache entry",
            "files": ["src/demo/cache.py", "src/demo/render.py"],
        },
        {"query": "Fetch URLs with a timeout", "files": ["src/demo/net.py"]},
        {"query": "Parse folded header lines", "files": ["src/demo/parser.py"]},
    ]
    (tar,) = out.glob("demo-*.tar.gz")
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert "demo/src/demo/parser.py" in names and "demo/src/demo/old.py" not in names


def test_bench_relevance_asks_a_made_set_with_a_computed_floor(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "sets"
    _make_set(repo, out)
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_relevance.py"),
            "--shared",
            str(out),
            "--sets",
            "demo",
            "--work",
            str(tmp_path / "work"),
            "--in-process",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "demo: no published floor" in run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("demo "))
    n, r1, r10 = row.split()[1:4]
    assert n == "3" and float(r10) == 1.0 and float(r1) >= 2 / 3
