"""``bench/sweep_ranking.py`` sets the ranking's constants for a run and puts them back, the
real search reads them at call time (so a sweep measures what it names), and its ascent
keeps only the steps its objective allows."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from knowledge_server.code import rank, search

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "sweep_ranking", ROOT / "bench" / "sweep_ranking.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclass looks its module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sweep_ranking = _load()


def test_vary_reads_a_constant_and_its_values() -> None:
    knob, values = sweep_ranking.parse_vary("rank.SIZE_WEIGHT=0, 0.1,0.3")
    assert str(knob) == "rank.SIZE_WEIGHT"
    assert values == [0.0, 0.1, 0.3]
    knob, values = sweep_ranking.parse_vary("rank._CODE_PRIORS[test]=0.4")
    assert (knob.module, knob.name, knob.key, values) == ("rank", "_CODE_PRIORS", "test", [0.4])
    knob, _ = sweep_ranking.parse_vary("search.VEC_WEIGHT=1")
    assert str(knob) == "search.VEC_WEIGHT"
    # A count stays a whole number (it may size a slice or a SQL LIMIT).
    knob, values = sweep_ranking.parse_vary("rank.CLI_MIN_OPTIONS=5,20")
    assert values == [5, 20] and all(type(v) is int for v in values)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("rank.SIZE_WEIGHT", "write MODULE.NAME=V1,V2"),
        ("os.sep=1", "write MODULE.NAME=V1,V2"),
        ("rank.NO_SUCH_WEIGHT=1", "rank has no constant NO_SUCH_WEIGHT"),
        ("rank._CHANGELOG=1", "not a number"),
        ("rank._CODE_PRIORS=1", "not a number"),
        ("rank._CODE_PRIORS[nope]=1", "has no entry 'nope'"),
        ("rank.SIZE_WEIGHT=a,b", "the values must be numbers"),
        ("rank.SIZE_WEIGHT=", "no values"),
        ("rank.CLI_MIN_OPTIONS=2.5", "is a whole number (10)"),
    ],
)
def test_vary_says_what_is_wrong_with_a_bad_one(text: str, reason: str) -> None:
    with pytest.raises(SystemExit) as e:
        sweep_ranking.parse_vary(text)
    assert reason in str(e.value)


def test_a_setting_is_put_back_after_its_block_also_when_it_fails() -> None:
    size, test_prior, vec = rank.SIZE_WEIGHT, rank._CODE_PRIORS["test"], search.VEC_WEIGHT
    values = {
        sweep_ranking.parse_vary("rank.SIZE_WEIGHT=0.9")[0]: 0.9,
        sweep_ranking.parse_vary("rank._CODE_PRIORS[test]=0.05")[0]: 0.05,
        sweep_ranking.parse_vary("search.VEC_WEIGHT=3")[0]: 3.0,
    }
    with sweep_ranking.setting(values):
        assert (rank.SIZE_WEIGHT, rank._CODE_PRIORS["test"], search.VEC_WEIGHT) == (0.9, 0.05, 3.0)
    assert (rank.SIZE_WEIGHT, rank._CODE_PRIORS["test"], search.VEC_WEIGHT) == (
        size,
        test_prior,
        vec,
    )
    with pytest.raises(RuntimeError), sweep_ranking.setting(values):
        raise RuntimeError("a failed run")
    assert (rank.SIZE_WEIGHT, rank._CODE_PRIORS["test"], search.VEC_WEIGHT) == (
        size,
        test_prior,
        vec,
    )


def test_every_refuses_a_step_that_lowers_one_set() -> None:
    floors = {"a": 0.5, "b": 0.5}
    old = {"a": (0.9, 0.70), "b": (0.9, 0.70)}
    assert sweep_ranking.better("every", {"a": (0.9, 0.80), "b": (0.9, 0.70)}, old, floors)
    # The mean rises, but b falls: not a step by "every", a step by "mean".
    lower_b = {"a": (0.9, 0.80), "b": (0.9, 0.69)}
    assert not sweep_ranking.better("every", lower_b, old, floors)
    assert sweep_ranking.better("mean", lower_b, old, floors)
    # Within the tolerance (figures print to three places) a set has not fallen.
    assert sweep_ranking.better("every", {"a": (0.9, 0.80), "b": (0.9, 0.6996)}, old, floors)
    assert not sweep_ranking.better("min", {"a": (0.9, 0.80), "b": (0.9, 0.69)}, old, floors)
    assert sweep_ranking.better("a", lower_b, old, floors)


def test_the_ascent_keeps_steps_that_raise_the_objective_and_stops_when_none_does() -> None:
    """The ascent's logic, with an asker whose figures are a known function of two real
    constants (the real search is measured by the test below)."""
    calls: list[tuple[float, float]] = []

    def ask(name: str) -> tuple[float, float]:
        x, y = rank.SIZE_WEIGHT, rank.PATH_WEIGHT
        calls.append((x, y))
        # a is best at x = 0.5, y = 0.1; b at x = 0.5 and does not care about y.
        if name == "a":
            return 1.0, 0.8 - (x - 0.5) ** 2 - (y - 0.1) ** 2
        return 1.0, 0.7 - (x - 0.5) ** 2

    grid = [
        sweep_ranking.parse_vary("rank.SIZE_WEIGHT=0.1,0.5,0.9"),
        sweep_ranking.parse_vary("rank.PATH_WEIGHT=0.1,0.6"),
    ]
    rows: list[str] = []
    best, figures = sweep_ranking.sweep(
        ask, ["a", "b"], {"a": 0.5, "b": 0.5}, grid, "every", rounds=5, out=rows.append
    )
    assert {str(k): v for k, v in best.items()} == {
        "rank.SIZE_WEIGHT": 0.5,
        "rank.PATH_WEIGHT": 0.1,
    }
    assert figures["a"][1] == pytest.approx(0.8) and figures["b"][1] == pytest.approx(0.7)
    # The second pass kept nothing, so there is no third.
    assert sum(r.endswith("kept") for r in rows) == 2
    # The committed values, five trials in the first pass, three in the second (a value
    # equal to the kept one is not tried again); each asks both sets.
    assert len(calls) == 2 * (1 + 5 + 3)
    assert (rank.SIZE_WEIGHT, rank.PATH_WEIGHT) != (0.5, 0.1)


def test_a_swept_constant_changes_the_real_ranking_and_is_put_back(
    shared_data: Path, tmp_path: Path
) -> None:
    """The search reads the constants when it runs: a sweep of PATH_WEIGHT through the
    real indexer and ``CodeIndex.search`` (fd's first 40 questions) changes the figures,
    and after the block the committed figures come back."""
    sets = shared_data / "code-eval"
    if not sets.is_dir():
        pytest.skip(f"no code-eval sets in {shared_data}")
    root = sweep_ranking.extract(sets, "fd", tmp_path)
    store = sweep_ranking.index_sets(tmp_path / "data", {"fd": root})["fd"]
    asked = sweep_ranking.questions(sets, "fd")[:40]

    def ask(name: str) -> tuple[float, float]:
        _, r10, mrr = sweep_ranking.ask_in_process(store, root, asked).figures()
        return r10, mrr

    committed = sweep_ranking.measure(ask, ["fd"], {})
    knob, _ = sweep_ranking.parse_vary("rank.PATH_WEIGHT=0")
    without_paths = sweep_ranking.measure(ask, ["fd"], {knob: 0.0})
    assert without_paths != committed
    assert sweep_ranking.measure(ask, ["fd"], {}) == committed


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "nothing to sweep"),
        (["--with", "rank.SIZE_WEIGHT=0.1,0.2"], "one value"),
        (["--with", "rank.SIZE_WEIGHT=x"], "--with 'rank.SIZE_WEIGHT=x': the values must be"),
        (["--vary", "rank.SIZE_WEIGHT=0.1", "--objective", "best"], "every, min, mean or one of"),
        (["--vary", "rank.SIZE_WEIGHT=0.1", "--ascent", "-1"], "a count of passes"),
        (["--vary", "rank.NOPE=1"], "rank has no constant NOPE"),
    ],
)
def test_the_command_says_what_is_wrong_before_indexing_anything(
    args: list[str], reason: str, tmp_path: Path
) -> None:
    script = ROOT / "bench" / "sweep_ranking.py"
    common = ["--shared", str(tmp_path), "--work", str(tmp_path / "work"), "--sets", "fd"]
    run = subprocess.run(
        [sys.executable, str(script), *common, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert reason in run.stderr
    assert not (tmp_path / "work").exists()
