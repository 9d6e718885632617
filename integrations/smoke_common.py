"""Shared machinery for the integration smokes and the integration checker.

A smoke proves one thing: a client configured with *our template* would start the
bridge and get back a fact with an address. It does so without the client's model:

1. start a throw-away Knowledge Service (``knowledge serve --listen 127.0.0.1:0``)
   on a temporary data folder and index a tiny corpus into it;
2. read the product's template and derive the launch (command, args, env) the
   client itself would derive, expanding variables with that client's syntax;
3. speak MCP over stdio to that process with the official ``mcp`` client SDK,
   call ``knowledge_search`` and fail unless the answer carries ``path:line``
   and an ``index_rev``.

The per-client template readers live here too, so the checker and the smokes
agree on what "the template launches ``knowledge mcp``" means.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "INTEGRATIONS_DIR",
    "PATH_LINE",
    "Launch",
    "NoEvidenceYet",
    "SmokeFailure",
    "TemplateError",
    "expand_vars",
    "find_path_lines",
    "launch_from_template",
    "load_index",
    "load_template",
    "npm_client_step",
    "pip_client_step",
    "product",
    "run_smoke",
    "until_evidence",
]

INTEGRATIONS_DIR = Path(__file__).resolve().parent
SERVER_NAME = "knowledge"
DEFAULT_ADDRESS = "127.0.0.1:50151"
BRIDGE_ENV = ("KNOWLEDGE_ADDRESS", "KNOWLEDGE_TOKEN")

# A fact address: a file path and a line number (optionally a range). The path
# either has a folder part or an extension starting with a letter, so host:port
# pairs such as "127.0.0.1:50151" and URLs do not count as addresses.
PATH_LINE = re.compile(
    r"(?<![\w/.:@+-])"
    r"(/?(?:[\w.@+-]+/)+[\w.@+-]+|[\w@+-][\w.@+-]*\.[A-Za-z][A-Za-z0-9]*)"
    r":(\d+)(?:-\d+)?\b"
)

# How the index is filled before searching. The CLI verb belongs to the service;
# override with KNOWLEDGE_SMOKE_INDEX_CMD (a shell-quoted command line using the
# {address} and {corpus} placeholders) when it differs.
DEFAULT_INDEX_CMD = "knowledge --address {address} index {corpus}"
SMOKE_QUERY = "where is the retry budget for the ledger uploader defined"


class SmokeFailure(Exception):
    """The smoke did not prove its claim; the message says which step failed."""


class NoEvidenceYet(SmokeFailure):
    """The answer has no ``path:line``; while indexing may still run, worth retrying."""


class TemplateError(ValueError):
    """A template does not parse, or does not describe a ``knowledge mcp`` launch."""


# --------------------------------------------------------------------------- index


def load_index(root: Path = INTEGRATIONS_DIR) -> dict[str, Any]:
    with (root / "index.json").open(encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def product(slug: str, root: Path = INTEGRATIONS_DIR) -> dict[str, Any]:
    for entry in load_index(root)["products"]:
        if entry["slug"] == slug:
            return dict(entry)
    raise KeyError(f"no product {slug!r} in {root / 'index.json'}")


# ------------------------------------------------------------------ template parsing


def load_template(path: Path, fmt: str) -> Any:
    """Parse ``path`` with the parser the client itself uses for that format."""
    text = path.read_text(encoding="utf-8")
    try:
        if fmt == "json":
            return json.loads(text)
        if fmt == "toml":
            return tomllib.loads(text)
        if fmt == "yaml":
            return yaml.safe_load(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise TemplateError(f"{path.name}: does not parse as {fmt}: {exc}") from exc
    raise TemplateError(f"{path.name}: no parser for format {fmt!r}")


@dataclass(frozen=True, slots=True)
class Launch:
    """What a client would spawn for our server entry, before variable expansion."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # Variables the client copies from its own environment into the child's.
    passthrough: tuple[str, ...] = ()
    # True when the client hands its whole environment to the child.
    inherits_env: bool = False
    # Variable syntax the client expands inside values.
    syntax: str = "none"


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise TemplateError(message)


def _str_list(value: Any, what: str) -> tuple[str, ...]:
    _require(
        isinstance(value, list) and all(isinstance(v, str) for v in value),
        f"{what} must be a list of strings",
    )
    return tuple(value)


def _str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    _require(
        isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
        f"{what} must map names to strings",
    )
    return {str(k): v for k, v in value.items()}


def _entry(container: Any, where: str) -> dict[str, Any]:
    _require(isinstance(container, dict), f"{where} must be a table/object")
    _require(SERVER_NAME in container, f"{where} has no {SERVER_NAME!r} server")
    entry = container[SERVER_NAME]
    _require(isinstance(entry, dict), f"{where}.{SERVER_NAME} must be a table/object")
    return entry


def _stdio_entry(entry: dict[str, Any], where: str, **kw: Any) -> Launch:
    _require(isinstance(entry.get("command"), str), f"{where}.command must be a string")
    return Launch(
        command=entry["command"],
        args=_str_list(entry.get("args", []), f"{where}.args"),
        env=_str_map(entry.get("env"), f"{where}.env"),
        **kw,
    )


def launch_from_template(data: Any, shape: str) -> Launch:
    """Read the ``knowledge`` server entry out of a parsed template of ``shape``."""
    if shape == "mcpServers":  # Claude Code, Cursor, Cline, Pi adapter
        _require(isinstance(data, dict), "top level must be an object")
        return _stdio_entry(_entry(data.get("mcpServers"), "mcpServers"), "mcpServers.knowledge")
    if shape == "claude-code":
        _require(isinstance(data, dict), "top level must be an object")
        entry = _entry(data.get("mcpServers"), "mcpServers")
        _require(entry.get("type", "stdio") == "stdio", "mcpServers.knowledge.type must be stdio")
        # Claude Code starts a stdio server with its own environment plus `env`.
        return _stdio_entry(entry, "mcpServers.knowledge", syntax="shell", inherits_env=True)
    if shape == "cursor":
        _require(isinstance(data, dict), "top level must be an object")
        return _stdio_entry(
            _entry(data.get("mcpServers"), "mcpServers"), "mcpServers.knowledge", syntax="cursor"
        )
    if shape == "codex":
        _require(isinstance(data, dict), "top level must be a table")
        entry = _entry(data.get("mcp_servers"), "mcp_servers")
        return _stdio_entry(
            entry,
            "mcp_servers.knowledge",
            passthrough=_str_list(entry.get("env_vars", []), "mcp_servers.knowledge.env_vars"),
        )
    if shape == "opencode":
        _require(isinstance(data, dict), "top level must be an object")
        entry = _entry(data.get("mcp"), "mcp")
        _require(entry.get("type") == "local", 'mcp.knowledge.type must be "local"')
        cmd = _str_list(entry.get("command"), "mcp.knowledge.command")
        _require(len(cmd) >= 1, "mcp.knowledge.command must not be empty")
        return Launch(
            command=cmd[0],
            args=cmd[1:],
            env=_str_map(entry.get("environment"), "mcp.knowledge.environment"),
            inherits_env=True,
            syntax="opencode",
        )
    if shape == "openclaw":  # OpenClaw and AutoClaw: mcp.servers.<name>
        _require(isinstance(data, dict), "top level must be an object")
        mcp = data.get("mcp")
        _require(isinstance(mcp, dict), "mcp must be an object")
        return _stdio_entry(_entry(mcp.get("servers"), "mcp.servers"), "mcp.servers.knowledge")
    if shape == "hermes":
        _require(isinstance(data, dict), "top level must be a mapping")
        return _stdio_entry(_entry(data.get("mcp_servers"), "mcp_servers"), "mcp_servers.knowledge")
    if shape == "dsh":
        return _dsh_launch(data)
    raise TemplateError(f"unknown template shape {shape!r}")


def _dsh_launch(data: Any) -> Launch:
    # A cordis patch is a list of operations; ours is one insert of the official
    # MCP client plugin, configured for a stdio server named "knowledge".
    _require(isinstance(data, list), "a cordis patch is a top-level list")
    for op in data:
        if not isinstance(op, dict) or not isinstance(op.get("insert"), list):
            continue
        for row in op["insert"]:
            if not isinstance(row, dict):
                continue
            cfg = row.get("config")
            if row.get("name") == "@deepseek-ai/dsh-mcp-client" and isinstance(cfg, dict):
                _require(isinstance(row.get("id"), str) and row["id"], "insert row needs an id")
                _require(
                    cfg.get("serverName") == SERVER_NAME, "config.serverName must be knowledge"
                )
                _require(cfg.get("transport") == "stdio", "config.transport must be stdio")
                return _stdio_entry(cfg, "insert[].config")
    raise TemplateError("no insert row for @deepseek-ai/dsh-mcp-client")


def check_bridge_launch(launch: Launch) -> None:
    """Raise unless the launch is the ``knowledge mcp`` bridge."""
    exe = Path(launch.command).name
    _require(exe in {"knowledge", "knowledge.exe"}, f"command is {launch.command!r}, not knowledge")
    _require(
        launch.args[:1] == ("mcp",), f"args are {list(launch.args)!r}, expected to start with mcp"
    )


# ------------------------------------------------------------------ variable expansion

_SHELL_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_CURSOR_VAR = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_OPENCODE_VAR = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(value: str, syntax: str, environ: Mapping[str, str]) -> str:
    """Expand ``value`` the way a client with ``syntax`` would.

    ``shell`` (Claude Code): ``${VAR}`` and ``${VAR:-default}``; an unset ``${VAR}``
    stays literal, as Claude Code leaves it. ``cursor``: ``${env:VAR}``.
    ``opencode``: ``{env:VAR}``, unset becomes empty. ``none``: literal.
    """
    if syntax == "shell":

        def _shell(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in environ:
                return environ[name]
            return default if default is not None else m.group(0)

        return _SHELL_VAR.sub(_shell, value)
    if syntax == "cursor":
        return _CURSOR_VAR.sub(lambda m: environ.get(m.group(1), ""), value)
    if syntax == "opencode":
        return _OPENCODE_VAR.sub(lambda m: environ.get(m.group(1), ""), value)
    return value


def child_environment(launch: Launch, environ: Mapping[str, str]) -> dict[str, str]:
    """The bridge-related variables the client would hand to the child process."""
    env: dict[str, str] = {}
    if launch.inherits_env:
        env.update({k: environ[k] for k in BRIDGE_ENV if k in environ})
    for name in launch.passthrough:
        if name in environ:
            env[name] = environ[name]
    for name, value in launch.env.items():
        env[name] = expand_vars(value, launch.syntax, environ)
    return env


def find_path_lines(text: str) -> list[str]:
    found = (f"{m.group(1)}:{m.group(2)}" for m in PATH_LINE.finditer(text))
    return list(dict.fromkeys(found))


# ------------------------------------------------------------------ service lifecycle


def _venv_path() -> str:
    # The smoke runs inside the project's environment; make its scripts (knowledge)
    # resolvable the way an activated shell would. KNOWLEDGE_SMOKE_PATH, when set,
    # goes first: it selects another installation of `knowledge`.
    parts = [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    extra = os.environ.get("KNOWLEDGE_SMOKE_PATH")
    if extra:
        parts = [*extra.split(os.pathsep), *parts]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


@contextmanager
def running_service(
    data_dir: Path, workspace: Path | None = None, timeout: float = 60.0
) -> Iterator[str]:
    """Start ``knowledge serve`` on a free loopback port; yield ``HOST:PORT``.

    With ``workspace`` the service indexes that folder at start and ingests no
    session logs (an empty sessions folder), so the smoke never reads the user's
    own harness history; without it nothing is bootstrapped.
    """
    exe = shutil.which("knowledge", path=_venv_path())
    if exe is None:
        raise SmokeFailure("the `knowledge` command is not installed in this environment")
    argv = [exe, "serve", "--listen", "127.0.0.1:0"]
    if workspace is None:
        argv.append("--no-bootstrap")
    else:
        sessions = data_dir.parent / "no-sessions"
        sessions.mkdir(parents=True, exist_ok=True)
        argv += ["--workspace", str(workspace), "--sessions", str(sessions)]
    # The data folder goes through the environment, which every `knowledge` verb reads.
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PATH": _venv_path(), "KNOWLEDGE_DATA_DIR": str(data_dir)},
    )
    try:
        address = _await_listening(proc, timeout)
        # Keep reading the service's output so a full pipe never blocks it.
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for _ in proc.stdout:
        pass


def _await_listening(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    pattern = re.compile(r"^listening on (\S+:\d+)\s*$")
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line.rstrip())
        m = pattern.match(line.strip())
        if m:
            return m.group(1)
    tail = "\n".join(seen[-10:])
    raise SmokeFailure(f"`knowledge serve` did not print 'listening on HOST:PORT':\n{tail}")


def write_corpus(root: Path) -> Path:
    """A tiny workspace whose one answer sits on a known line."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "uploader.py").write_text(
        '"""Ledger uploader."""\n'
        "\n"
        "# The retry budget for the ledger uploader: five attempts, then give up.\n"
        "LEDGER_UPLOAD_RETRY_BUDGET = 5\n"
        "\n"
        "\n"
        "def upload(batch):\n"
        "    return batch\n",
        encoding="utf-8",
    )
    (root / "NOTES.md").write_text(
        "# Notes\n\nThe ledger uploader retries five times (see uploader.py).\n",
        encoding="utf-8",
    )
    return root


def index_corpus(address: str, corpus: Path, token: str | None = None) -> None:
    """Index ``corpus`` through the service and wait for it to finish.

    A failure is reported, not fatal: the service was also told to index the corpus
    at start (``serve --workspace``), and the search below retries until its deadline.
    """
    template = os.environ.get("KNOWLEDGE_SMOKE_INDEX_CMD", DEFAULT_INDEX_CMD)
    argv = [a.format(address=address, corpus=str(corpus)) for a in shlex.split(template)]
    env = {**os.environ, "PATH": _venv_path(), "KNOWLEDGE_ADDRESS": address}
    if token:
        env["KNOWLEDGE_TOKEN"] = token
    try:
        done = subprocess.run(
            argv, env=env, check=False, capture_output=True, text=True, timeout=300
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        print(f"note: index command {argv!r} did not run: {exc}")
        return
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        print(
            f"note: index command exited {done.returncode} ({last[0]}); relying on serve --workspace"
        )


def until_evidence(attempt: Any, deadline_s: float | None = None) -> list[str]:
    """Call ``attempt()`` (returns answer text) until it carries evidence or time runs out.

    Indexing may still be running when the service starts answering, so an answer
    without any address is retried until the deadline (KNOWLEDGE_SMOKE_DEADLINE
    seconds, default 90); any other failure is final at once.
    """
    if deadline_s is None:
        deadline_s = float(os.environ.get("KNOWLEDGE_SMOKE_DEADLINE", "90"))
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return assert_evidence(attempt())
        except NoEvidenceYet:
            if time.monotonic() >= deadline:
                raise
            time.sleep(2)


# ------------------------------------------------------------------ MCP conversation


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        text = getattr(item, "text", None)
        if isinstance(text, str):
            parts.append(text)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts)


def _has_index_rev(text: str) -> bool:
    # Spaces and tabs only around the separator: `\s` would run over a line break to take the
    # next line (a path:line) as the value of an empty `index_rev=`.
    return re.search(r'"?index_rev"?[ \t]*[:=][ \t]*"?[\w.:-]+', text) is not None


async def _search_over_mcp(
    command: str, args: list[str], env: dict[str, str], cwd: Path
) -> tuple[set[str], str, bool]:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    # Nothing is raised inside the session: anyio would wrap it in an exception group.
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        names = {tool.name for tool in listed.tools}
        if "knowledge_search" not in names:
            return names, "", True
        result = await session.call_tool("knowledge_search", {"query": SMOKE_QUERY})
        return names, _result_text(result), bool(getattr(result, "is_error", False))


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def bridge_search(
    launch: Launch, address: str, token: str | None, cwd: Path, data_dir: Path | None = None
) -> str:
    """Spawn the bridge as the template says and return the search answer text.

    The caller's environment names the service (``KNOWLEDGE_ADDRESS``). Where the template
    passes it on, the bridge dials it; where it does not, the bridge must find the address
    the service recorded in its data directory (``data_dir``, in place of the user's)."""
    environ = dict(os.environ)
    environ["KNOWLEDGE_ADDRESS"] = address
    environ.pop("KNOWLEDGE_TOKEN", None)
    if token:
        environ["KNOWLEDGE_TOKEN"] = token
    env = child_environment(launch, environ)
    given = env.get("KNOWLEDGE_ADDRESS")
    if given and given != address:
        raise SmokeFailure(
            f"the template hands the bridge KNOWLEDGE_ADDRESS={given}, not {address}"
        )
    if not given and data_dir is not None:
        print(
            f"note: the template names no address; the bridge reads the one recorded in {data_dir}"
        )
        env["KNOWLEDGE_DATA_DIR"] = str(data_dir)
    env["PATH"] = _venv_path()
    command = shutil.which(launch.command, path=env["PATH"]) or launch.command
    try:
        names, text, is_error = asyncio.run(_search_over_mcp(command, list(launch.args), env, cwd))
    except Exception as exc:  # any transport or protocol failure is the smoke's failure
        leaf = _first_leaf(exc)
        raise SmokeFailure(
            f"MCP conversation with `{command}` failed: {type(leaf).__name__}: {leaf}"
        ) from exc
    if "knowledge_search" not in names:
        raise SmokeFailure(f"the bridge does not offer knowledge_search (tools: {sorted(names)})")
    if is_error:
        raise SmokeFailure(f"knowledge_search returned an error: {text[:2000]}")
    return text


def assert_evidence(text: str) -> list[str]:
    hits = find_path_lines(text)
    if not hits:
        raise NoEvidenceYet(f"the answer carries no path:line address:\n{text[:2000]}")
    if not _has_index_rev(text):
        raise SmokeFailure(f"the answer carries no index_rev:\n{text[:2000]}")
    return hits


# ------------------------------------------------------------------ entry point


def run_smoke(slug: str, client_step: Any = None) -> int:
    """Run the standard smoke for ``slug``; return the process exit code.

    ``client_step``, when given, is called with ``(template_path, workdir, address)``
    after the bridge check, while the service still runs, to exercise the real client's own listing command; it
    prints what happened and returns nothing (a missing client is not a failure).
    """
    entry = product(slug)
    folder = INTEGRATIONS_DIR / slug
    template = folder / entry["config_file"]
    print(f"== smoke {slug}: {entry['name']} ({template.name})")
    try:
        launch = launch_from_template(
            load_template(template, entry["config_format"]), entry["shape"]
        )
        check_bridge_launch(launch)
        with tempfile.TemporaryDirectory(prefix=f"knowledge-smoke-{slug}-") as tmp:
            tmpdir = Path(tmp)
            corpus = write_corpus(tmpdir / "workspace")
            data_dir = tmpdir / "data"
            with running_service(data_dir, workspace=corpus) as address:
                print(f"service listening on {address}")
                index_corpus(address, corpus)
                hits = until_evidence(
                    lambda: bridge_search(launch, address, None, corpus, data_dir)
                )
                for hit in hits:
                    print(hit)
                if client_step is not None:
                    client_step(template, tmpdir, address)
    except (SmokeFailure, TemplateError) as exc:
        print(f"FAIL {slug}: {exc}")
        return 1
    print(f"OK {slug}: answer carries path:line and index_rev")
    return 0


def npm_client_step(package: str, version: str, binary: str, argv: list[str], layout: Any) -> Any:
    """Build a ``client_step`` that installs a pinned npm client into a temp prefix
    and runs its MCP listing command against our template, offline and logged out.

    ``layout(template, workdir, home, address)`` places the template where the
    client looks and returns the working directory to run in. The output is printed verbatim;
    the outcome never changes the smoke's exit code, because listing commands
    report a server's health without an account only for some clients.
    """

    def step(template: Path, tmpdir: Path, address: str = DEFAULT_ADDRESS) -> None:
        if os.environ.get("KNOWLEDGE_SMOKE_SKIP_CLIENT"):
            print(f"client step skipped: KNOWLEDGE_SMOKE_SKIP_CLIENT is set ({package})")
            return
        npm = shutil.which("npm")
        if npm is None:
            print(f"client step skipped: npm is not available to install {package}@{version}")
            return
        prefix = tmpdir / "npm"
        home = tmpdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        install = subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(prefix),
                f"{package}@{version}",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if install.returncode != 0:
            print(
                f"client step skipped: npm install {package}@{version} failed:\n{install.stderr[-2000:]}"
            )
            return
        exe = prefix / "node_modules" / ".bin" / binary
        workdir = layout(template, tmpdir, home, address)
        _run_client(exe, binary, argv, workdir, home, address)

    return step


def pip_client_step(requirement: str, binary: str, argv: list[str], layout: Any) -> Any:
    """Like :func:`npm_client_step` for a client published on PyPI: installs
    ``requirement`` into a temporary virtual environment."""

    def step(template: Path, tmpdir: Path, address: str = DEFAULT_ADDRESS) -> None:
        if os.environ.get("KNOWLEDGE_SMOKE_SKIP_CLIENT"):
            print(f"client step skipped: KNOWLEDGE_SMOKE_SKIP_CLIENT is set ({requirement})")
            return
        venv = tmpdir / "client-venv"
        home = tmpdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=False, capture_output=True, text=True
        )
        pip = venv / ("Scripts" if os.name == "nt" else "bin") / "pip"
        if made.returncode != 0 or not pip.exists():
            print(f"client step skipped: cannot create a virtual environment: {made.stderr[-500:]}")
            return
        install = subprocess.run(
            [str(pip), "install", "--quiet", requirement],
            check=False,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if install.returncode != 0:
            print(
                f"client step skipped: pip install {requirement} failed:\n{install.stderr[-2000:]}"
            )
            return
        exe = pip.parent / binary
        workdir = layout(template, tmpdir, home, address)
        _run_client(exe, binary, argv, workdir, home, address)

    return step


def _run_client(
    exe: Path, binary: str, argv: list[str], workdir: Path, home: Path, address: str
) -> None:
    """Run ``binary --version`` and ``binary <argv>`` with a throw-away HOME and print both."""
    env = {**os.environ, "HOME": str(home), "PATH": _venv_path(), "KNOWLEDGE_ADDRESS": address}
    env.pop("KNOWLEDGE_TOKEN", None)
    env.pop("CODEX_HOME", None)
    for cmd in ([str(exe), "--version"], [str(exe), *argv]):
        shown = f"$ {binary} {' '.join(cmd[1:])}"
        try:
            done = subprocess.run(
                cmd, cwd=workdir, env=env, check=False, capture_output=True, text=True, timeout=180
            )
        except subprocess.TimeoutExpired:
            print(f"{shown}\n(timed out after 180 s)")
            continue
        print(f"{shown}  -> exit {done.returncode}")
        out = (done.stdout + done.stderr).strip()
        if out:
            print(out[-3000:])
