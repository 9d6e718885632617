"""L2: the real harness CLIs (Claude Code, Codex CLI, OpenCode; pinned in
``integrations/l2/package.json``, installed with ``npm ci``) call our MCP bridge against a real
server, with a local scripted model server in place of the vendor's API (``tests/l2_models.py``).
The client's own output must carry a ``path:start-end`` and the ``index_rev`` our server
produced for that search. Run headless, offline (only loopback addresses)."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from knowledge_sdk import KnowledgeClient

from tests.conftest import REPO_ROOT, ServerThread
from tests.l2_models import QUOTE_PREFIX, ScriptedModels

L2 = REPO_ROOT / "integrations" / "l2"
BIN = L2 / "node_modules" / ".bin"
# OpenCode's Linux x64 build, installed under its package name (see l2/package.json).
OPENCODE = L2 / "node_modules" / "opencode-ai" / "bin" / "opencode"
PYPATH = os.pathsep.join(str(REPO_ROOT / p) for p in ("server", "sdk", "licensing", "bridge"))
QUERY = "where are parcels shipped to the warehouse"
PROMPT = "Use the knowledge_search tool to find where parcels are shipped, then quote its result."
CITE = re.compile(r"[\w./-]+\.py:\d+-\d+")
# The first test of a fresh checkout installs the three clients (about 1 GB) with `npm ci`.
pytestmark = pytest.mark.timeout(1200)


def _npm_ci() -> None:
    """Install the pinned clients once (``npm ci`` from the lockfile). Test processes running
    side by side (pytest-xdist) take a lock, so one installs and the others find it done."""
    stamp = L2 / "node_modules" / ".package-lock.json"
    lock = L2 / "package-lock.json"
    with open(L2 / ".npm-ci.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime and OPENCODE.is_file():
            return
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed: the L2 clients come from the npm registry")
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip("the pinned OpenCode build is Linux x64's (integrations/l2/package.json)")
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=L2,
            timeout=900,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    _npm_ci()
    tmp = tmp_path_factory.mktemp("l2")
    ws = tmp / "ws"
    (ws / "shop").mkdir(parents=True)
    (ws / "shop" / "shipping.py").write_text(
        "def ship_parcel_to_warehouse(parcel, warehouse):\n"
        '    """Parcels are shipped to the warehouse by the courier."""\n'
        "    return warehouse.receive(parcel)\n"
    )
    server = ServerThread(tmp, workspaces=[str(ws)])
    try:
        with KnowledgeClient(server.address) as kc:
            for _ in kc.index_workspace(str(ws)):
                pass
            resp = kc.search(QUERY)
        rev = resp.lanes.code.index_rev
        assert resp.lanes.code.items, "the fixture workspace must answer the query"
        yield {"address": server.address, "code_rev": rev, "tmp": tmp, "ws": ws}
    finally:
        server.stop()


def _env(home: Path, **extra: str) -> dict[str, str]:
    keep = ("PATH", "LANG", "TERM", "SYSTEMROOT", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), **extra)
    env["XDG_DATA_HOME"] = str(home / ".local" / "share")
    env["XDG_CACHE_HOME"] = str(home / ".cache")
    return env


def _bridge(address: str) -> dict[str, object]:
    return {
        "command": sys.executable,
        "args": ["-m", "knowledge_mcp"],
        "env": {"KNOWLEDGE_ADDRESS": address, "PYTHONPATH": PYPATH},
    }


def _check(output: str, world: dict[str, object]) -> None:
    assert QUOTE_PREFIX in output, output[-2000:]
    assert CITE.search(output), output[-2000:]
    assert str(world["code_rev"]) in output, output[-2000:]


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout


def test_claude_code_calls_knowledge_search(world: dict[str, object], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"knowledge": _bridge(str(world["address"]))}}))
    with ScriptedModels(QUERY) as models:
        env = _env(
            home,
            ANTHROPIC_BASE_URL=models.url,
            ANTHROPIC_API_KEY="sk-ant-scripted",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
            # MCP tools are otherwise deferred behind a ToolSearch call (not in turn 1's list).
            ENABLE_TOOL_SEARCH="false",
        )
        out = _run(
            [
                str(BIN / "claude"),
                "-p",
                PROMPT,
                "--mcp-config",
                str(config),
                "--strict-mcp-config",
                "--allowedTools",
                "mcp__knowledge__knowledge_search",
                "--output-format",
                "json",
            ],
            env,
            Path(str(world["ws"])),
        )
    result = json.loads(out)
    _check(result["result"], world)


def test_codex_cli_calls_knowledge_search(world: dict[str, object], tmp_path: Path) -> None:
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    bridge = _bridge(str(world["address"]))
    with ScriptedModels(QUERY) as models:
        (codex_home / "config.toml").write_text(
            'model = "scripted"\n'
            'model_provider = "scripted"\n'
            'approval_policy = "never"\n'
            'sandbox_mode = "read-only"\n'
            "[model_providers.scripted]\n"
            'name = "scripted"\n'
            f'base_url = "{models.url}/v1"\n'
            'env_key = "SCRIPTED_API_KEY"\n'
            'wire_api = "responses"\n'
            "[mcp_servers.knowledge]\n"
            # Without it the first model request goes out before the bridge has listed its
            # tools (Codex starts MCP servers in the background).
            "required = true\n"
            f"command = {json.dumps(bridge['command'])}\n"
            f"args = {json.dumps(bridge['args'])}\n"
            f"env = {{ KNOWLEDGE_ADDRESS = {json.dumps(world['address'])}, "
            f"PYTHONPATH = {json.dumps(PYPATH)} }}\n"
        )
        env = _env(home, CODEX_HOME=str(codex_home), SCRIPTED_API_KEY="scripted")
        out = _run(
            [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--json", PROMPT],
            env,
            Path(str(world["ws"])),
        )
    _check(out, world)


def test_opencode_calls_knowledge_search(world: dict[str, object], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bridge = _bridge(str(world["address"]))
    with ScriptedModels(QUERY) as models:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "provider": {
                "scripted": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Scripted",
                    "options": {"baseURL": f"{models.url}/v1", "apiKey": "scripted"},
                    "models": {"model": {"name": "model", "tool_call": True}},
                }
            },
            "mcp": {
                "knowledge": {
                    "type": "local",
                    "command": [bridge["command"], *bridge["args"]],  # type: ignore[list-item]
                    "environment": bridge["env"],
                    "enabled": True,
                }
            },
        }
        cfg = tmp_path / "opencode.json"
        cfg.write_text(json.dumps(config))
        env = _env(home, OPENCODE_CONFIG=str(cfg), OPENCODE_DISABLE_AUTOUPDATE="1")
        out = _run(
            [str(OPENCODE), "run", "-m", "scripted/model", "--format", "json", PROMPT],
            env,
            Path(str(world["ws"])),
        )
    _check(out, world)


# --- hooks: evidence in the model request without a tool call ---------------------------------

HOOK = f"{sys.executable} -m knowledge_mcp.hooks"
# The hooks' own limit (default 2 s) is tested in tests/test_hooks.py; here the machine may be
# busy with the rest of the suite, and the test is about the evidence reaching the model.
HOOK_LIMIT = "8"
EVIDENCE = re.compile(
    r"<knowledge-evidence>.*?shop/shipping\.py:\d+-\d+.*?</knowledge-evidence>", re.S
)


def _model_saw(models: ScriptedModels, pattern: re.Pattern[str]) -> bool:
    return any(
        pattern.search(json.dumps(body))
        for path, body in models.requests
        if path.startswith("POST")
    )


def _claude_with_hooks(world: dict[str, object], tmp_path: Path, address: str) -> ScriptedModels:
    home = tmp_path / "home"
    home.mkdir()
    hook = {"type": "command", "command": HOOK, "timeout": 10}
    settings = tmp_path / "settings.json"
    settings.write_text(
        json.dumps(
            {"hooks": {e: [{"hooks": [hook]}] for e in ("SessionStart", "UserPromptSubmit")}}
        )
    )
    models = ScriptedModels(QUERY)
    with models:
        env = _env(
            home,
            ANTHROPIC_BASE_URL=models.url,
            ANTHROPIC_API_KEY="sk-ant-scripted",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
            KNOWLEDGE_ADDRESS=address,
            KNOWLEDGE_HOOK_TIMEOUT=HOOK_LIMIT,
            PYTHONPATH=PYPATH,
        )
        out = _run(
            [
                str(BIN / "claude"),
                "-p",
                QUERY,
                "--settings",
                str(settings),
                "--output-format",
                "json",
            ],
            env,
            Path(str(world["ws"])),
        )
    assert json.loads(out)["is_error"] is False
    return models


def test_claude_code_hooks_put_evidence_in_the_model_request(
    world: dict[str, object], tmp_path: Path
) -> None:
    models = _claude_with_hooks(world, tmp_path, str(world["address"]))
    assert _model_saw(models, EVIDENCE), [json.dumps(b)[:2000] for _, b in models.requests]
    assert _model_saw(models, re.compile(re.escape(str(world["code_rev"]))))


def test_claude_code_hooks_are_silent_when_the_service_is_down(
    world: dict[str, object], tmp_path: Path
) -> None:
    models = _claude_with_hooks(world, tmp_path, "127.0.0.1:9")
    assert not _model_saw(models, re.compile("knowledge-evidence"))
    assert any(p == "POST /v1/messages" for p, _ in models.requests)  # the prompt still went out


def test_codex_cli_hooks_put_evidence_in_the_model_request(
    world: dict[str, object], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    hook = {"type": "command", "command": HOOK, "timeout": 10}
    (codex_home / "hooks.json").write_text(
        json.dumps(
            {"hooks": {e: [{"hooks": [hook]}] for e in ("SessionStart", "UserPromptSubmit")}}
        )
    )
    with ScriptedModels(QUERY) as models:
        (codex_home / "config.toml").write_text(
            'model = "scripted"\nmodel_provider = "scripted"\napproval_policy = "never"\n'
            'sandbox_mode = "read-only"\n[model_providers.scripted]\nname = "scripted"\n'
            f'base_url = "{models.url}/v1"\nenv_key = "SCRIPTED_API_KEY"\nwire_api = "responses"\n'
        )
        env = _env(
            home,
            CODEX_HOME=str(codex_home),
            SCRIPTED_API_KEY="scripted",
            KNOWLEDGE_ADDRESS=str(world["address"]),
            KNOWLEDGE_HOOK_TIMEOUT=HOOK_LIMIT,
            PYTHONPATH=PYPATH,
        )
        # Codex runs a hook only once its hash is trusted (the TUI's /hooks records it);
        # this flag stands in for that step in an unattended run.
        _run(
            [
                str(BIN / "codex"),
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-hook-trust",
                "--json",
                QUERY,
            ],
            env,
            Path(str(world["ws"])),
        )
    assert _model_saw(models, EVIDENCE)
    assert _model_saw(models, re.compile(re.escape(str(world["code_rev"]))))


def test_opencode_plugin_puts_evidence_in_the_model_request(
    world: dict[str, object], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    plugin = REPO_ROOT / "integrations" / "opencode" / "plugin" / "knowledge.js"
    with ScriptedModels(QUERY) as models:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "plugin": [f"file://{plugin}"],
            "provider": {
                "scripted": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Scripted",
                    "options": {"baseURL": f"{models.url}/v1", "apiKey": "scripted"},
                    "models": {"model": {"name": "model", "tool_call": True}},
                }
            },
        }
        cfg = tmp_path / "opencode.json"
        cfg.write_text(json.dumps(config))
        env = _env(
            home,
            OPENCODE_CONFIG=str(cfg),
            OPENCODE_DISABLE_AUTOUPDATE="1",
            KNOWLEDGE_ADDRESS=str(world["address"]),
            KNOWLEDGE_HOOK_COMMAND=HOOK,
            KNOWLEDGE_HOOK_TIMEOUT=HOOK_LIMIT,
            PYTHONPATH=PYPATH,
        )
        _run(
            [str(OPENCODE), "run", "-m", "scripted/model", "--format", "json", QUERY],
            env,
            Path(str(world["ws"])),
        )
    assert _model_saw(models, EVIDENCE), [json.dumps(b)[:3000] for _, b in models.requests]


# --- one install per harness: the plugin as the client loads it ---------------------------------

PLUGIN = REPO_ROOT / "plugins" / "knowledge"


# A token the plugin tests export: the service runs without authentication and ignores it,
# but the plugin's MCP server must receive it as exported.
PLUGIN_TOKEN = "kn_exported_for_the_plugin"
BRIDGE_ENV = "bridge-env.txt"


def _installed_commands(tmp_path: Path) -> Path:
    """`knowledge-mcp` and `knowledge-hook` on PATH as an install of the bridge package puts
    them (here: this checkout's modules under the test's interpreter). `knowledge-mcp` first
    writes the KNOWLEDGE_ADDRESS, KNOWLEDGE_TOKEN and KNOWLEDGE_DATA_DIR it was started with
    to ``BRIDGE_ENV``
    beside ``bin/`` (read back by ``_bridge_env``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / BRIDGE_ENV
    record = (
        'printf \'%s\\n%s\\n%s\\n\' "${KNOWLEDGE_ADDRESS-(unset)}" "${KNOWLEDGE_TOKEN-(unset)}" '
        '"${KNOWLEDGE_DATA_DIR-(unset)}" '
        f'> "{log}.part" && mv "{log}.part" "{log}"\n'
    )
    for name, module in (
        ("knowledge-mcp", "knowledge_mcp"),
        ("knowledge-hook", "knowledge_mcp.hooks"),
    ):
        path = bindir / name
        path.write_text(
            "#!/bin/sh\n"
            + (record if name == "knowledge-mcp" else "")
            + f'PYTHONPATH="{PYPATH}" exec "{sys.executable}" -m {module} "$@"\n'
        )
        path.chmod(0o755)
    return bindir


def _bridge_env(tmp_path: Path, wait: float = 0.0) -> list[str]:
    """[KNOWLEDGE_ADDRESS, KNOWLEDGE_TOKEN, KNOWLEDGE_DATA_DIR] as the client started the
    plugin's `knowledge-mcp`
    with (``(unset)`` for a variable it did not pass). ``wait``: seconds to allow a server the
    client starts in the background to come up."""
    log = tmp_path / BRIDGE_ENV
    deadline = time.monotonic() + wait
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert log.exists(), "the client never started the plugin's knowledge-mcp"
    return log.read_text().splitlines()


def test_claude_code_plugin_validates_and_brings_tools_and_hooks(
    world: dict[str, object], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bindir = _installed_commands(tmp_path)
    env_base = _env(home, DISABLE_AUTOUPDATER="1")
    checked = subprocess.run(
        [str(BIN / "claude"), "plugin", "validate", str(PLUGIN)],
        env=env_base,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0 and "Validation passed" in checked.stdout, checked.stdout
    assert "without quotes" not in checked.stdout, checked.stdout  # a plugin path with a space
    # The permanent install: plugins/ is a marketplace, installed from the checkout offline.
    claude = str(BIN / "claude")
    _run([claude, "plugin", "validate", str(PLUGIN.parent)], env_base, tmp_path)
    _run([claude, "plugin", "marketplace", "add", str(PLUGIN.parent)], env_base, tmp_path)
    installed = _run(
        [claude, "plugin", "install", "knowledge@knowledge-service"], env_base, tmp_path
    )
    assert "Successfully installed plugin: knowledge@knowledge-service" in installed, installed
    with ScriptedModels(QUERY) as models:
        env = _env(
            home,
            ANTHROPIC_BASE_URL=models.url,
            ANTHROPIC_API_KEY="sk-ant-scripted",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_AUTOUPDATER="1",
            KNOWLEDGE_ADDRESS=str(world["address"]),
            KNOWLEDGE_TOKEN=PLUGIN_TOKEN,
            KNOWLEDGE_HOOK_TIMEOUT=HOOK_LIMIT,
        )
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
        # The installed plugin's MCP server starts and completes the handshake, with the
        # connection settings exported in the client's environment ...
        health = _run([claude, "mcp", "list"], env, Path(str(world["ws"])))
        assert re.search(r"plugin:knowledge:knowledge: knowledge-mcp\s+-\s+✔ Connected", health), (
            health
        )
        assert _bridge_env(tmp_path)[:2] == [str(world["address"]), PLUGIN_TOKEN]
        # ... and its UserPromptSubmit hook puts the evidence in the model request. (Whether
        # the plugin's tools are in the first request of a headless run depends on how fast
        # the server starts: Claude Code does not wait for plugin servers there, so the tool
        # call itself is proven by test_claude_code_calls_knowledge_search.)
        _run(
            [claude, "-p", QUERY, "--output-format", "json"],
            env,
            Path(str(world["ws"])),
        )
    assert _model_saw(models, EVIDENCE)
    # The plugin's skill and commands are offered to the model.
    assert _model_saw(
        models, re.compile(r"knowledge:consult-knowledge: Consult the knowledge service")
    )
    assert _model_saw(models, re.compile(r"knowledge:dispatch: Plan who or what"))
    assert _model_saw(models, re.compile(r"knowledge:knowledge: Ask the knowledge service"))


def test_codex_cli_plugin_installs_from_the_repository_and_brings_hooks_and_skill(
    world: dict[str, object], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    bindir = _installed_commands(tmp_path)
    with ScriptedModels(QUERY) as models:
        (codex_home / "config.toml").write_text(
            'model = "scripted"\nmodel_provider = "scripted"\napproval_policy = "never"\n'
            'sandbox_mode = "read-only"\n[model_providers.scripted]\nname = "scripted"\n'
            f'base_url = "{models.url}/v1"\nenv_key = "SCRIPTED_API_KEY"\nwire_api = "responses"\n'
        )
        env = _env(
            home,
            CODEX_HOME=str(codex_home),
            SCRIPTED_API_KEY="scripted",
            KNOWLEDGE_ADDRESS=str(world["address"]),
            KNOWLEDGE_TOKEN=PLUGIN_TOKEN,
            KNOWLEDGE_DATA_DIR=str(tmp_path / "kdata"),
            KNOWLEDGE_HOOK_TIMEOUT=HOOK_LIMIT,
        )
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
        codex = str(BIN / "codex")
        _run([codex, "plugin", "marketplace", "add", str(PLUGIN.parent)], env, tmp_path)
        _run([codex, "plugin", "add", "knowledge@knowledge-service"], env, tmp_path)
        listed = _run([codex, "plugin", "list"], env, tmp_path)
        assert re.search(r"knowledge@knowledge-service\s+installed, enabled\s+0\.1\.0", listed), (
            listed
        )
        out = _run(
            [
                codex,
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-hook-trust",
                "--json",
                QUERY,
            ],
            env,
            Path(str(world["ws"])),
        )
    assert _model_saw(models, EVIDENCE), out  # the plugin's UserPromptSubmit hook
    # (The plugin's MCP server starts in the background: a headless run's first model request
    # may go out before its tools are listed, so the tool call itself is proven above with a
    # config-file server marked `required = true`.) Codex hands a server only the variables
    # its entry names, and its `env` values literally: the plugin's bridge must still get
    # the address and token exported in Codex's environment, and the data directory that
    # finds the address `knowledge serve` recorded.
    assert _bridge_env(tmp_path, wait=60) == [
        str(world["address"]),
        PLUGIN_TOKEN,
        str(tmp_path / "kdata"),
    ]
    assert _model_saw(
        models,
        re.compile(
            r"knowledge/skills/consult-knowledge/SKILL\.md|consult the knowledge service", re.I
        ),
    )
