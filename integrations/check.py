#!/usr/bin/env python3
"""Check the integration folders against integrations/index.json.

    python integrations/check.py               # static checks, one line per check
    python integrations/check.py --run-smokes  # also run every automatic smoke

Exits non-zero when any check fails. What is checked:

* index.json is well formed, and every product has its folder and every folder
  its product;
* each folder holds README.md with exactly the sections Connect, Verify, Levels,
  Boundaries (in that order, Boundaries not empty), its template, and smoke.py or
  checklist.md as the index says;
* templates parse with the parser the client uses (json, tomllib, yaml.safe_load)
  and launch ``knowledge mcp`` as the bridge (the SDK example compiles instead);
* no file holds a value that looks like a secret, and every secret-named key in a
  template holds a placeholder (``${VAR}``, ``$VAR``, ``{env:VAR}``, ``<...>``);
* no template writes an address: ``KNOWLEDGE_ADDRESS`` is left out or references the
  variable in the client's own syntax, without a default, and no ``--address`` argument
  (a written one overrides the address `knowledge serve` recorded);
* claimed levels match what exists (no L2 without an automatic smoke and a
  verified client version; no L1/L3 without a template) and the levels table in
  integrations/README.md agrees with index.json;
* automatic smokes are Python programs with a ``main()`` whose result is the exit
  code.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from smoke_common import (  # noqa: E402 - importable after the sys.path entry above
    PATH_LINE,
    Launch,
    TemplateError,
    check_bridge_launch,
    launch_from_template,
    load_template,
)

try:
    from knowledge_server.redact import looks_like_secret
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(HERE.parent / "server"))
    from knowledge_server.redact import looks_like_secret

README_SECTIONS = ["Connect", "Verify", "Levels", "Boundaries"]
# integrations/l2/: the pinned harness CLIs of the L2 tests (package.json + lockfile), not a product.
L2_DIR = "l2"
L2_TESTS = HERE.parent / "tests" / "test_integrations_l2.py"
LEVELS = ("L1", "L2", "L3", "L4")
SMOKE_KINDS = ("automatic", "checklist", "none")
FORMATS = ("json", "toml", "yaml", "python", "none")
TRANSPORTS = ("mcp-stdio", "mcp-http", "grpc", "none")
REQUIRED_FIELDS = (
    "slug",
    "name",
    "config_file",
    "config_format",
    "shape",
    "client_config_location",
    "transport",
    "levels",
    "smoke",
    "client_package",
    "verified_client_version",
)
TEXT_SUFFIXES = {".md", ".json", ".toml", ".yaml", ".yml", ".py", ".txt"}

# Key names whose values must never be literal in a template.
SECRET_KEY = re.compile(
    r"(?i)(token|secret|passw(or)?d|pwd|api[_-]?key|apikey|credential|private[_-]?key|auth(orization)?$)"
)
PLACEHOLDER = re.compile(
    r"^(?:"
    r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}"  # ${VAR} ${VAR:-default}
    r"|\$\{env:[A-Za-z_][A-Za-z0-9_]*\}"  # ${env:VAR}
    r"|\{env:[A-Za-z_][A-Za-z0-9_]*\}"  # {env:VAR}
    r"|\$[A-Za-z_][A-Za-z0-9_]*"  # $VAR
    r"|<[^<>]*>"  # <placeholder>
    r"|"  # empty
    r")$"
)


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def _ok(name: str, detail: str) -> Result:
    return Result(name, True, detail)


def _fail(name: str, detail: str) -> Result:
    return Result(name, False, detail)


# --------------------------------------------------------------------------- helpers


def readme_sections(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^##\s+(.+?)\s*$", text, re.MULTILINE)]


def section_body(text: str, title: str) -> str:
    m = re.search(rf"^##\s+{re.escape(title)}\s*$(.*?)(?=^##\s|\Z)", text, re.MULTILINE | re.DOTALL)
    return m.group(1).strip() if m else ""


def walk_pairs(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (key, scalar) for every scalar in a parsed template."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk_pairs(v, str(k))
    elif isinstance(node, list):
        for v in node:
            yield from walk_pairs(v, key)
    else:
        yield key, node


# The caller's own KNOWLEDGE_ADDRESS, empty when unset (the bridge then finds the address
# by itself), in each client's syntax: Claude Code's ``${VAR:-}``, Cursor's ``${env:VAR}``,
# OpenCode's ``{env:VAR}``. A client that expands nothing gets the text as it is.
EMPTY_WHEN_UNSET = {
    "shell": re.compile(r"\$\{KNOWLEDGE_ADDRESS:-\}"),
    "cursor": re.compile(r"\$\{env:KNOWLEDGE_ADDRESS\}"),
    "opencode": re.compile(r"\{env:KNOWLEDGE_ADDRESS\}"),
}


def address_problems(launch: Launch) -> list[str]:
    """A template that writes an address overrides the address `knowledge serve` recorded
    and the caller's own variable; the bridge finds both by itself. Written means: a value
    for ``KNOWLEDGE_ADDRESS``, a variable with a default, a variable this client does not
    expand (the bridge would get its text), an empty value (it hides the address the
    caller exported from a client that passes it on), or ``--address`` among the
    arguments."""
    problems: list[str] = []
    value = launch.env.get("KNOWLEDGE_ADDRESS")
    if value is not None:
        empty = EMPTY_WHEN_UNSET.get(launch.syntax)
        if empty is None or not empty.fullmatch(value.strip()):
            what = "an address" if value.strip() else "an empty value, hiding the caller's"
            problems.append(
                f"KNOWLEDGE_ADDRESS holds {what} ({value!r}); leave it out (the bridge"
                " finds the address knowledge serve recorded) or reference the variable"
                " in this client's syntax, without a default"
            )
    if any(a == "--address" or a.startswith("--address=") for a in launch.args):
        problems.append(
            "the arguments give --address; leave it out (the bridge finds the address"
            " knowledge serve recorded, or KNOWLEDGE_ADDRESS)"
        )
    return problems


def secret_problems(data: Any) -> list[str]:
    problems: list[str] = []
    for key, value in walk_pairs(data):
        if not isinstance(value, str):
            continue
        if looks_like_secret(value) or looks_like_secret(f"{key}={value}"):
            problems.append(f"{key or '<value>'} looks like a secret")
        elif SECRET_KEY.search(key) and not PLACEHOLDER.match(value.strip()):
            problems.append(f"{key} holds a literal value; use an environment variable placeholder")
    return problems


def text_files(folder: Path) -> Iterable[Path]:
    for path in sorted(folder.rglob("*")):
        wanted = path.suffix in TEXT_SUFFIXES or path.name.startswith(".")
        if path.is_file() and "__pycache__" not in path.parts and wanted:
            yield path


def smoke_problems(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        return [f"does not compile: {exc}"]
    problems: list[str] = []
    if not source.startswith("#!"):
        problems.append("no #! line")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body):
        problems.append("no top-level main()")
    if not re.search(r"(sys\.exit|raise SystemExit)\(\s*main\(", source):
        problems.append("main() result is not the exit code")
    return problems


def levels_table(text: str) -> dict[str, dict[str, str]]:
    """Rows of the levels table in integrations/README.md, keyed by slug."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if all(set(c) <= {"-", ":", " "} for c in cells):
            continue
        row = dict(zip(header, cells, strict=False))
        if "slug" in row:
            rows[row["slug"]] = row
    return rows


# ----------------------------------------------------------------------------- checks


def check_index(root: Path) -> tuple[list[Result], list[dict[str, Any]]]:
    path = root / "index.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return [_fail("index", f"index.json unreadable: {exc}")], []
    products = data.get("products")
    if not isinstance(products, list) or not products:
        return [_fail("index", "index.json has no products list")], []
    results: list[Result] = []
    good: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in products:
        slug = entry.get("slug", "?") if isinstance(entry, dict) else "?"
        name = f"index[{slug}]"
        problems: list[str] = []
        if not isinstance(entry, dict):
            results.append(_fail(name, "entry is not an object"))
            continue
        problems += [f"missing {f}" for f in REQUIRED_FIELDS if f not in entry]
        if slug in seen:
            problems.append("duplicate slug")
        seen.add(slug)
        if entry.get("config_format") not in FORMATS:
            problems.append(f"config_format {entry.get('config_format')!r} unknown")
        if entry.get("transport") not in TRANSPORTS:
            problems.append(f"transport {entry.get('transport')!r} unknown")
        if entry.get("smoke") not in SMOKE_KINDS:
            problems.append(f"smoke {entry.get('smoke')!r} unknown")
        levels = entry.get("levels")
        if not isinstance(levels, list) or any(lv not in LEVELS for lv in levels):
            problems.append(f"levels {levels!r} must be a list of {', '.join(LEVELS)}")
        if problems:
            results.append(_fail(name, "; ".join(problems)))
        else:
            results.append(_ok(name, f"{', '.join(levels)}; smoke {entry['smoke']}"))
            good.append(entry)
    return results, good


def check_folders(root: Path, products: list[dict[str, Any]]) -> list[Result]:
    slugs = {p["slug"] for p in products}
    folders = {
        p.name
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and p.name != L2_DIR
    }
    missing = sorted(slugs - folders)
    extra = sorted(folders - slugs)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no folder for {', '.join(missing)}")
        if extra:
            parts.append(f"no index entry for folder {', '.join(extra)}")
        return [_fail("folders", "; ".join(parts))]
    return [_ok("folders", f"{len(slugs)} products, one folder each")]


def check_product(root: Path, entry: dict[str, Any]) -> list[Result]:  # noqa: C901 - one check per part of an integration folder (README, template, smoke)
    slug = entry["slug"]
    folder = root / slug
    if not folder.is_dir():
        return []  # reported by check_folders
    results: list[Result] = []

    # README
    readme = folder / "README.md"
    if not readme.is_file():
        results.append(_fail(f"{slug}/readme", "README.md missing"))
    else:
        text = readme.read_text(encoding="utf-8")
        sections = readme_sections(text)
        problems = []
        if sections != README_SECTIONS:
            problems.append(f"sections are {sections}, expected exactly {README_SECTIONS}")
        elif not section_body(text, "Boundaries"):
            problems.append("Boundaries section is empty")
        levels_body = section_body(text, "Levels")
        for level in entry["levels"]:
            if level not in levels_body:
                problems.append(f"Levels section does not mention claimed {level}")
        version = entry.get("verified_client_version")
        if version and version not in text:
            problems.append(f"verified client version {version} is not stated")
        results.append(
            _fail(f"{slug}/readme", "; ".join(problems))
            if problems
            else _ok(f"{slug}/readme", "four sections")
        )

    # template
    config_file = entry.get("config_file")
    fmt = entry["config_format"]
    if config_file:
        results.append(
            check_template(folder / config_file, fmt, entry["shape"], f"{slug}/template")
        )
    elif fmt != "none" or entry["transport"] != "none":
        results.append(
            _fail(f"{slug}/template", "no config_file, but a format or transport is declared")
        )

    # smoke or checklist
    smoke, checklist = folder / "smoke.py", folder / "checklist.md"
    kind = entry["smoke"]
    if kind == "automatic":
        if not smoke.is_file():
            results.append(_fail(f"{slug}/smoke", "index says automatic but smoke.py is missing"))
        else:
            problems = smoke_problems(smoke)
            results.append(
                _fail(f"{slug}/smoke", "; ".join(problems))
                if problems
                else _ok(f"{slug}/smoke", "smoke.py with main() and exit code")
            )
    elif kind == "checklist":
        if not checklist.is_file():
            results.append(
                _fail(f"{slug}/smoke", "index says checklist but checklist.md is missing")
            )
        elif smoke.is_file():
            results.append(_fail(f"{slug}/smoke", "smoke.py present but index says checklist"))
        elif not re.search(
            r"^\s*[-*]\s+\[ \]", checklist.read_text(encoding="utf-8"), re.MULTILINE
        ):
            results.append(_fail(f"{slug}/smoke", "checklist.md has no '- [ ]' items"))
        else:
            results.append(_ok(f"{slug}/smoke", "checklist.md"))

    # secrets in every text file of the folder
    leaks = []
    for path in text_files(folder):
        for lineno, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            if looks_like_secret(line):
                leaks.append(f"{path.name}:{lineno}")
    results.append(
        _fail(f"{slug}/secrets", f"secret-looking text at {', '.join(leaks)}")
        if leaks
        else _ok(f"{slug}/secrets", "no secret-looking text")
    )

    # levels against what exists
    results.append(check_levels(entry, folder))
    return results


def check_template(path: Path, fmt: str, shape: str, name: str) -> Result:
    if not path.is_file():
        return _fail(name, f"{path.name} missing")
    if fmt == "python":
        source = path.read_text(encoding="utf-8")
        try:
            ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            return _fail(name, f"{path.name} does not compile: {exc}")
        if "knowledge_sdk" not in source:
            return _fail(name, f"{path.name} does not use knowledge_sdk")
        return _ok(name, f"{path.name} compiles and uses knowledge_sdk")
    try:
        data = load_template(path, fmt)
        launch = launch_from_template(data, shape)
        check_bridge_launch(launch)
    except TemplateError as exc:
        return _fail(name, str(exc))
    problems = secret_problems(data) + address_problems(launch)
    if problems:
        return _fail(name, "; ".join(problems))
    return _ok(
        name, f"{path.name} parses as {fmt}; launches {launch.command} {' '.join(launch.args)}"
    )


def check_levels(entry: dict[str, Any], folder: Path) -> Result:
    slug, levels = entry["slug"], set(entry["levels"])
    problems = []
    if "L2" in levels:
        if entry["smoke"] != "automatic" or not (folder / "smoke.py").is_file():
            problems.append("L2 claimed without an automatic smoke")
        if not entry.get("verified_client_version"):
            problems.append("L2 claimed without a verified client version")
        problems += _l2_problems(entry, folder.parent)
    if levels & {"L1", "L3"} and not entry.get("config_file"):
        problems.append("L1/L3 claimed without a template")
    if "L4" not in levels:
        problems.append("L4 (named boundaries) is required of every product")
    if entry.get("verified_client_version") and not entry.get("client_package"):
        problems.append("verified_client_version without client_package")
    name = f"{slug}/levels"
    return _fail(name, "; ".join(problems)) if problems else _ok(name, ", ".join(sorted(levels)))


def _l2_problems(entry: dict[str, Any], root: Path) -> list[str]:
    """L2 is the real client run by ``tests/test_integrations_l2.py``: its package pinned in
    ``integrations/l2/package.json`` at the verified version, and that file's test for it."""
    problems = []
    package = str(entry.get("client_package") or "")
    name = package.removeprefix("npm:")
    try:
        pins = json.loads((root / L2_DIR / "package.json").read_text(encoding="utf-8"))
        pinned = pins.get("dependencies", {}).get(name)
    except (OSError, json.JSONDecodeError):
        pinned = None
    if isinstance(pinned, str) and pinned.startswith("npm:"):
        pinned = pinned.rpartition("@")[2]  # an alias: npm:<platform build>@<version>
    if not package.startswith("npm:") or pinned is None:
        problems.append(
            f"L2 claimed but {package or 'the client'} is not pinned in l2/package.json"
        )
    elif pinned != entry.get("verified_client_version"):
        problems.append(
            f"L2 claimed for {entry.get('verified_client_version')} but l2/package.json pins {pinned}"
        )
    test = f"def test_{entry['slug'].replace('-', '_')}_calls_knowledge_search("
    try:
        has_test = test in L2_TESTS.read_text(encoding="utf-8")
    except OSError:
        has_test = False
    if not has_test:
        problems.append(f"L2 claimed without {test[4:-1]} in tests/test_integrations_l2.py")
    return problems


def check_map(root: Path, products: list[dict[str, Any]]) -> list[Result]:
    readme = root / "README.md"
    if not readme.is_file():
        return [_fail("map", "integrations/README.md missing")]
    rows = levels_table(readme.read_text(encoding="utf-8"))
    problems = []
    for entry in products:
        row = rows.get(entry["slug"])
        if row is None:
            problems.append(f"{entry['slug']} missing from the levels table")
            continue
        claimed = {c.strip() for c in row.get("levels", "").split(",") if c.strip()}
        if claimed != set(entry["levels"]):
            problems.append(
                f"{entry['slug']}: table says {sorted(claimed)}, index says {entry['levels']}"
            )
        if row.get("smoke", "") != entry["smoke"]:
            problems.append(
                f"{entry['slug']}: table smoke {row.get('smoke')!r}, index {entry['smoke']!r}"
            )
    extra = sorted(set(rows) - {p["slug"] for p in products})
    if extra:
        problems.append(f"table lists unknown {', '.join(extra)}")
    if problems:
        return [_fail("map", "; ".join(problems))]
    return [_ok("map", "levels table matches index.json")]


def run_checks(root: Path = HERE) -> list[Result]:
    results, products = check_index(root)
    if not products:
        return results
    results += check_folders(root, products)
    for entry in products:
        results += check_product(root, entry)
    results += check_map(root, products)
    return results


def run_smokes(root: Path, products: list[dict[str, Any]], timeout: float = 900) -> list[Result]:
    results = []
    for entry in products:
        if entry["smoke"] != "automatic":
            continue
        smoke = root / entry["slug"] / "smoke.py"
        name = f"{entry['slug']}/run-smoke"
        try:
            done = subprocess.run(
                [sys.executable, str(smoke)],
                check=False,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            results.append(_fail(name, f"timed out after {timeout:.0f} s"))
            continue
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        if done.returncode != 0:
            results.append(_fail(name, f"exit {done.returncode}: {tail[0]}"))
        elif not PATH_LINE.search(done.stdout):
            results.append(_fail(name, "exit 0 but no path:line in the output"))
        else:
            results.append(_ok(name, f"exit 0; {len(PATH_LINE.findall(done.stdout))} path:line"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE, help="integrations folder to check")
    parser.add_argument("--run-smokes", action="store_true", help="also run every automatic smoke")
    args = parser.parse_args(argv)
    results = run_checks(args.root)
    if args.run_smokes:
        _, products = check_index(args.root)
        results += run_smokes(args.root, products)
    for result in results:
        print(result.line())
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} checks ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
