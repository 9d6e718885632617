"""Ranking constants swept on the labelled code-search sets, in process.

The sets (``shared/data/code-eval``, and any made by ``bench/eval_from_git.py``) are
extracted and indexed once, as ``bench_relevance.py --in-process`` does (``--alone``: each
in a store of its own). Then, for each setting, every question is asked through
``CodeIndex.search`` exactly as the code lane asks it (``bench_relevance.ask_in_process``),
with some of the ranking's module constants set to other values for that run and put back
after it. A setting's figures are those of the real path, not an estimate from stored
candidates: the committed values give the figures ``bench_relevance.py --in-process`` prints.

A constant is named as ``rank.NAME`` (``knowledge_server.code.rank``), ``search.NAME``
(``knowledge_server.code.search``), or ``rank.NAME[key]`` for an entry of a dictionary
constant (``rank._CODE_PRIORS[test]``). Values are numbers. A constant derived from
another at import (``rank._KNOWLEDGE_PRIORS`` from ``rank._CODE_PRIORS``) does not follow
it: vary it by its own name.

Ways to sweep:

* one at a time (the default): the committed values, then each value of each ``--vary``
  with the others as committed (no ``--vary``: the first row alone);
* ``--with MODULE.NAME=V`` (repeatable) sets a constant for the whole run, the first row
  included: a setting found on some sets, checked on others (``--shared DIR --sets NAME``);
* ``--ascent ROUNDS``: coordinate ascent from the committed values: each ``--vary`` in
  turn, its values tried with the steps kept so far, a value kept when it raises the
  objective; ROUNDS passes over them, stopping early when a pass keeps nothing.

The objective (``--objective``): ``every`` (the default, the rule the ranking's constants
were chosen by: keep what helps on every set) takes a step only when no set's MRR falls by more
than 0.0005 and the mean of MRR / floor rises; ``min``: the lowest MRR / floor; ``mean``:
the mean of MRR / floor; a set's name: that set's MRR alone (to learn how far one set can
go, never to choose values by).

Each row prints the setting, MRR (and R@10) per set, its ratio to the whole-file floor, and
the objective; the run ends with the best setting found.

Usage: python bench/sweep_ranking.py --vary rank.SIZE_WEIGHT=0,0.1,0.3
                                     --vary 'rank._CODE_PRIORS[test]=0.3,0.7'
                                     [--sets click,starlette,cobra,fd] [--work DIR]
                                     [--with MODULE.NAME=V] [--alone] [--ascent ROUNDS]
                                     [--objective every|min|mean|SET]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_relevance import (  # noqa: E402 - after the path above
    ask_in_process,
    extract,
    floor,
    index_sets,
    questions,
    set_arguments,
)

_NAME = re.compile(r"^(rank|search)\.([A-Za-z_]\w*)(?:\[([\w-]+)\])?$")
# An objective's step must not lower any set by more than this (figures print to 3 places).
TOLERANCE = 0.0005


@dataclass(frozen=True)
class Knob:
    """One constant: the module it lives in, its name, and the key of a dictionary's entry."""

    module: str
    name: str
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.module}.{self.name}" + (f"[{self.key}]" if self.key else "")


def _modules() -> dict[str, ModuleType]:
    from knowledge_server.code import rank, search

    return {"rank": rank, "search": search}


def parse_vary(text: str, flag: str = "--vary") -> tuple[Knob, list[float]]:
    """``rank.NAME=V1,V2`` -> (the constant, its values, whole numbers for a constant that
    is one: a pool size or a count); SystemExit with the reason when the name is not a
    numeric constant of the module (or not a key of its dictionary) or a value is not a
    number of the constant's kind."""
    name, eq, values = text.partition("=")
    m = _NAME.match(name.strip())
    if not eq or not m:
        raise SystemExit(
            f"{flag} {text!r}: write MODULE.NAME=V1,V2 (MODULE rank or search),"
            " or MODULE.NAME[key]=V1,V2 for an entry of a dictionary constant"
        )
    knob = Knob(m.group(1), m.group(2), m.group(3))
    current = _get(knob)
    if isinstance(current, bool) or not isinstance(current, int | float):
        raise SystemExit(f"{flag} {text!r}: {knob} is {current!r}, not a number")
    try:
        vals = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: the values must be numbers") from None
    if not vals:
        raise SystemExit(f"{flag} {text!r}: no values")
    if isinstance(current, int):
        if any(not v.is_integer() for v in vals):
            raise SystemExit(f"{flag} {text!r}: {knob} is a whole number ({current})")
        return knob, [int(v) for v in vals]
    return knob, vals


def _get(knob: Knob) -> object:
    module = _modules()[knob.module]
    if not hasattr(module, knob.name):
        raise SystemExit(f"{knob.module} has no constant {knob.name}")
    value = getattr(module, knob.name)
    if knob.key is None:
        return value
    if not isinstance(value, dict) or knob.key not in value:
        raise SystemExit(f"{knob.module}.{knob.name} has no entry {knob.key!r}")
    return value[knob.key]


@contextmanager
def setting(values: Mapping[Knob, float]) -> Iterator[None]:
    """The constants set to ``values`` for the block, and put back after it (also when the
    block fails)."""
    modules = _modules()
    saved: list[tuple[Knob, object]] = []
    try:
        for knob, value in values.items():
            saved.append((knob, _get(knob)))
            module = modules[knob.module]
            if knob.key is None:
                setattr(module, knob.name, value)
            else:
                getattr(module, knob.name)[knob.key] = value
    except BaseException:
        _restore(saved)
        raise
    try:
        yield
    finally:
        _restore(saved)


def _restore(saved: list[tuple[Knob, object]]) -> None:
    modules = _modules()
    for knob, value in reversed(saved):
        module = modules[knob.module]
        if knob.key is None:
            setattr(module, knob.name, value)
        else:
            getattr(module, knob.name)[knob.key] = value


Asker = Callable[[str], tuple[float, float]]  # set -> (R@10, MRR)


def measure(
    ask: Asker, names: Sequence[str], values: Mapping[Knob, float]
) -> dict[str, tuple[float, float]]:
    """Each set's (R@10, MRR) with the constants set to ``values``."""
    with setting(values):
        return {n: ask(n) for n in names}


def objective(
    kind: str, figures: Mapping[str, tuple[float, float]], floors: Mapping[str, float]
) -> float:
    """The figure a setting is judged by (higher is better); ``every`` is judged by
    ``better`` against a baseline, and ranks settings by the mean ratio."""
    ratios = [figures[n][1] / floors[n] for n in figures]
    if kind == "min":
        return min(ratios)
    if kind in ("mean", "every"):
        return statistics.fmean(ratios)
    return figures[kind][1]


def better(
    kind: str,
    new: Mapping[str, tuple[float, float]],
    old: Mapping[str, tuple[float, float]],
    floors: Mapping[str, float],
) -> bool:
    """Whether ``new`` is a step up from ``old`` by the objective ``kind``."""
    if kind == "every" and any(new[n][1] < old[n][1] - TOLERANCE for n in new):
        return False
    return objective(kind, new, floors) > objective(kind, old, floors) + 1e-9


def sweep(
    ask: Asker,
    names: Sequence[str],
    floors: Mapping[str, float],
    grid: Sequence[tuple[Knob, list[float]]],
    kind: str,
    rounds: int,
    out: Callable[[str], None] = print,
    first: str = "",
) -> tuple[dict[Knob, float], dict[str, tuple[float, float]]]:
    """One at a time (``rounds`` 0) or coordinate ascent (``rounds`` passes); prints a row
    per setting (the first, the constants as they are, labelled ``first`` or "committed";
    in the ascent, the step tried on top of the steps kept) and returns the best setting
    found and its figures."""
    head = f"{'setting':<44}" + "".join(f" {n:>15}" for n in names) + f" {'objective':>10}"
    out(head + "\n" + " " * 44 + "".join(f" {'MRR R@10 x':>15}" for _ in names))

    def row(label: str, figures: Mapping[str, tuple[float, float]], note: str = "") -> None:
        cells = "".join(
            f" {figures[n][1]:.3f} {figures[n][0]:.3f} {figures[n][1] / floors[n]:.2f}"
            for n in names
        )
        out(f"{label:<44.44}{cells} {objective(kind, figures, floors):>10.4f}{note}")

    best: dict[Knob, float] = {}
    base = measure(ask, names, best)
    row(first or "committed", base)
    best_figures = base
    if rounds == 0:
        for knob, vals in grid:
            for v in vals:
                figures = measure(ask, names, {knob: v})
                row(f"{knob}={v:g}", figures, "  +" if better(kind, figures, base, floors) else "")
                if better(kind, figures, best_figures, floors):
                    best, best_figures = {knob: v}, figures
        return best, best_figures
    for r in range(rounds):
        kept = False
        for knob, vals in grid:
            for v in vals:
                if best.get(knob, _get(knob)) == v:
                    continue
                trial = {**best, knob: v}
                figures = measure(ask, names, trial)
                step = better(kind, figures, best_figures, floors)
                row(f"pass {r + 1}: {knob}={v:g}", figures, "  kept" if step else "")
                if step:
                    best, best_figures, kept = trial, figures, True
        if not kept:
            break
    return best, best_figures


def _label(values: Mapping[Knob, float]) -> str:
    return " ".join(
        f"{k.name}{'[' + k.key + ']' if k.key else ''}={v:g}" for k, v in values.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    set_arguments(ap)
    ap.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="MODULE.NAME=V1,V2",
        help="a constant and the values to try (repeatable)",
    )
    ap.add_argument(
        "--with",
        dest="fixed",
        action="append",
        default=[],
        metavar="MODULE.NAME=V",
        help="a constant set to V for the whole run, the first row included (repeatable):"
        " a setting found on some sets, checked on others",
    )
    ap.add_argument(
        "--ascent",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="coordinate ascent, at most ROUNDS passes (default: one at a time)",
    )
    ap.add_argument(
        "--objective",
        default="every",
        help="every (default), min, mean, or a set's name (its MRR alone)",
    )
    ap.add_argument(
        "--alone", action="store_true", help="each set in a store of its own (data-alone/NAME)"
    )
    args = ap.parse_args()
    if not args.shared.is_dir():
        sys.exit(f"no code-eval data at {args.shared}")
    names = [s for s in args.sets.split(",") if s]
    if args.objective not in ("every", "min", "mean", *names):
        sys.exit(f"--objective {args.objective!r}: every, min, mean or one of {names}")
    if args.ascent < 0:
        sys.exit("--ascent takes a count of passes (0: one at a time)")
    if not args.vary and not args.fixed:
        sys.exit("nothing to sweep: give one --vary or --with or more (see --help)")
    grid = [parse_vary(v) for v in args.vary]
    fixed = {}
    for text in args.fixed:
        knob, values = parse_vary(text, "--with")
        if len(values) != 1:
            sys.exit(f"--with {text!r}: one value")
        fixed[knob] = values[0]
    roots = {n: extract(args.shared, n, args.work) for n in names}
    stores = index_sets(args.work / "data", roots, alone=args.alone)
    asked = {n: questions(args.shared, n)[: args.limit_questions or None] for n in names}
    floors = {n: floor(n, roots[n], asked[n])[2] for n in names}

    def ask(name: str) -> tuple[float, float]:
        _, r10, mrr = ask_in_process(stores[name], roots[name], asked[name]).figures()
        return r10, mrr

    if fixed:
        print(f"with {_label(fixed)}")
    t0 = time.perf_counter()
    with setting(fixed):
        best, figures = sweep(
            ask,
            names,
            floors,
            grid,
            args.objective,
            args.ascent,
            first="with these" if fixed else "",
        )
    print(
        f"\nbest by {args.objective}: {_label({**fixed, **best}) or 'the committed values'}"
        f" ({objective(args.objective, figures, floors):.4f}) in {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
