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
    if not files:
        _git(repo, "add", "-A")
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
            "src/demo/naïve.py": "def naive_sum(xs):\n    return sum(xs)\n",
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
    (r / "src" / "demo" / "alias.py").symlink_to("parser.py")
    _commit(r, "Alias the parser", {})
    _commit(
        r,
        "Naïve sum für Übergröße",
        {"src/demo/naïve.py": "def naive_sum(xs):\n    return sum(xs, 0)\n"},
    )
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
    _git(repo, "rm", "-q", "--cached", "src/demo/parser.py")  # staged, not committed: HEAD counts
    assert "4 questions" in _make_set(repo, out)
    got = [json.loads(line) for line in (out / "demo-eval.jsonl").read_text().splitlines()]
    # Newest first. Not questions: the readme-only commit, the symlink, the deleted module's
    # two, the commit of four new modules, the release, and the initial commit (five source
    # files left). The test file beside parser.py is not an answer; "(#12)" is not a word;
    # a path outside ASCII comes through as it is.
    assert got == [
        {
            "query": "Render table rows with an evict of the oldest cache entry",
            "files": ["src/demo/cache.py", "src/demo/render.py"],
        },
        {"query": "Fetch URLs with a timeout", "files": ["src/demo/net.py"]},
        {"query": "Naïve sum für Übergröße", "files": ["src/demo/naïve.py"]},
        {"query": "Parse folded header lines", "files": ["src/demo/parser.py"]},
    ]
    (tar,) = out.glob("demo-*.tar.gz")
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert "demo/src/demo/parser.py" in names and "demo/src/demo/old.py" not in names


def test_a_subdirectory_or_a_published_name_is_refused(repo: Path, tmp_path: Path) -> None:
    script = str(ROOT / "bench" / "eval_from_git.py")
    for args, why in (
        ([str(repo / "src"), "--name", "demo"], "give its top directory"),
        ([str(repo), "--name", "fd"], "a published set's name"),
        ([str(repo), "--name", "demo", "--limit", "-1"], "--limit at least 0"),
    ):
        run = subprocess.run(
            [sys.executable, script, *args, "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
        )
        assert run.returncode != 0 and why in run.stderr, (args, run.stderr)
    assert not (tmp_path / "o").exists()


def _relevance(out: Path, work: Path, *extra: str) -> list[str]:
    """``bench_relevance.py --in-process`` on the made set: its floor line and table row."""
    script = str(ROOT / "bench" / "bench_relevance.py")
    args = ["--shared", str(out), "--sets", "demo", "--work", str(work), "--in-process"]
    run = subprocess.run(
        [sys.executable, script, *args, *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    floor = next(line for line in run.stdout.splitlines() if line.startswith("demo: "))
    row = next(line for line in run.stdout.splitlines() if line.startswith("demo "))
    return [floor, row]


def test_bench_relevance_asks_a_made_set_with_a_computed_floor(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "sets"
    _make_set(repo, out)
    floor, row = _relevance(out, tmp_path / "work")
    assert "no published floor" in floor
    n, r1, r10, _mrr, f1, f10, fmrr = row.split()[1:8]
    assert n == "4" and float(r10) >= 0.75 and float(r1) >= 0.5, row
    assert 0 < float(fmrr) <= 1 and float(f1) <= float(f10), row
    # The floor is computed over the questions asked (one: every figure 0 or 1).
    floor, row = _relevance(out, tmp_path / "work", "--limit-questions", "1")
    n, *figures = row.split()[1:8]
    assert n == "1" and all(float(x) in (0.0, 1.0) for x in figures), row


def test_bench_relevance_asks_each_set_alone_and_counts_answered_nonsense(
    repo: Path, tmp_path: Path
) -> None:
    """``--alone`` indexes the set into a store of its own, ``--nonsense N`` asks N made-up
    questions of it: the row ends with how many got code items (none: the relevance
    floor), and the questions' figures are the shared store's."""
    out = tmp_path / "sets"
    _make_set(repo, out)
    _, shared_row = _relevance(out, tmp_path / "work")
    _, row = _relevance(out, tmp_path / "work", "--alone", "--nonsense", "6")
    assert (tmp_path / "work" / "data-alone" / "demo" / "code.sqlite").is_file()
    assert row.endswith("0 of 6"), row
    # One set alone is the same store content: the same figures.
    assert row.split()[1:8] == shared_row.split()[1:8], (row, shared_row)
    script = str(ROOT / "bench" / "bench_relevance.py")
    run = subprocess.run(
        [sys.executable, script, "--shared", str(out), "--sets", "demo", "--alone"],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "need --in-process" in run.stderr
