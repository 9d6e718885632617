"""The integration folders pass their checker, and the checker catches seeded defects.

The smokes themselves need a running service and are run by
``python integrations/check.py --run-smokes``; here the smoke machinery is
exercised against a stand-in MCP server so the client side is tested on its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
INTEGRATIONS = REPO_ROOT / "integrations"
sys.path.insert(0, str(INTEGRATIONS))

import check  # noqa: E402 - importable after the sys.path entry above
import smoke_common  # noqa: E402 - likewise


def _failures(results: list[check.Result]) -> dict[str, str]:
    return {r.name: r.detail for r in results if not r.ok}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A private copy of integrations/ to break."""
    root = tmp_path / "integrations"
    shutil.copytree(
        INTEGRATIONS, root, ignore=shutil.ignore_patterns("__pycache__", "node_modules")
    )
    assert _failures(check.run_checks(root)) == {}
    return root


def _edit_json(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


# ----------------------------------------------------------------------- the real tree


def test_every_check_passes_on_the_repository() -> None:
    results = check.run_checks(INTEGRATIONS)
    assert _failures(results) == {}
    assert len(results) > 12


def test_every_product_of_the_plan_is_present() -> None:
    slugs = {p["slug"] for p in json.loads((INTEGRATIONS / "index.json").read_text())["products"]}
    assert slugs == {
        "claude-code",
        "codex-cli",
        "opencode",
        "cursor",
        "cline",
        "openclaw",
        "hermes-agent",
        "pi",
        "deepseek-harness",
        "autoclaw",
        "manus",
        "python-sdk",
    }


_COUNTED = re.compile(
    r"\b(\d+|ten|eleven|twelve|thirteen|fourteen|fifteen)\s+(?:`knowledge_\*`\s+)?tools\b", re.I
)
_NUMBERS = {"ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15}


def test_no_readme_or_checklist_states_another_tool_count_than_the_bridges() -> None:
    """A count of the bridge's tools written into a harness's steps goes stale when a tool is
    added (they said ten while the bridge served twelve): none is written, or it is the
    bridge's."""
    from knowledge_mcp.tools import TOOLS

    stated = [
        (doc.relative_to(INTEGRATIONS).as_posix(), m.group(0))
        for doc in [INTEGRATIONS / "README.md", *sorted(INTEGRATIONS.glob("*/*.md"))]
        for m in _COUNTED.finditer(doc.read_text(encoding="utf-8"))
        if int(_NUMBERS.get(m.group(1).lower(), m.group(1))) != len(TOOLS)
    ]
    assert stated == []


def test_cli_exits_zero_and_prints_one_line_per_check() -> None:
    done = subprocess.run(
        [sys.executable, str(INTEGRATIONS / "check.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert all(line.startswith(("ok   ", "FAIL ")) for line in lines[:-1])
    assert lines[-1].endswith("0 failed")


# --------------------------------------------------------------------- seeded defects


def test_catches_a_secret_value_in_a_template(tree: Path) -> None:
    fake = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    _edit_json(
        tree / "cursor" / "mcp.json",
        lambda d: d["mcpServers"]["knowledge"]["env"].__setitem__("KNOWLEDGE_TOKEN", fake),
    )
    failed = _failures(check.run_checks(tree))
    assert "cursor/template" in failed
    assert "cursor/secrets" in failed


def _set_address(tree: Path, slug: str, value: str) -> str:
    """Write ``value`` as KNOWLEDGE_ADDRESS into ``slug``'s template; its check's name."""
    if slug == "hermes-agent":
        path = tree / slug / "config.yaml"
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["mcp_servers"]["knowledge"]["env"] = {"KNOWLEDGE_ADDRESS": value}
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
    else:
        name = {
            "cursor": "mcp.json",
            "claude-code": ".mcp.json",
            "cline": "cline_mcp_settings.json",
        }
        _edit_json(
            tree / slug / name[slug],
            lambda d: (
                d["mcpServers"]["knowledge"]
                .setdefault("env", {})
                .__setitem__("KNOWLEDGE_ADDRESS", value)
            ),
        )
    return f"{slug}/template"


@pytest.mark.parametrize(
    ("slug", "value", "written"),
    [
        ("cursor", "127.0.0.1:50151", True),
        ("cursor", "${env:KNOWLEDGE_ADDRESS:-127.0.0.1:50151}", True),
        ("cursor", "${KNOWLEDGE_ADDRESS:-}", True),  # Cursor's syntax is ${env:VAR}
        ("cursor", "<HOST:PORT>", True),
        ("cursor", "${env:KNOWLEDGE_ADDRESS}", False),
        ("cursor", "", True),  # hides the address the caller exported
        ("claude-code", "${KNOWLEDGE_ADDRESS:-127.0.0.1:50151}", True),
        ("claude-code", "${KNOWLEDGE_ADDRESS}", True),  # unset, it reaches the bridge as text
        ("claude-code", "${KNOWLEDGE_ADDRESS:-}", False),
        ("cline", "${KNOWLEDGE_ADDRESS}", True),  # Cline's expansion is unconfirmed: as text
        ("hermes-agent", "${KNOWLEDGE_ADDRESS}", True),
        ("hermes-agent", "127.0.0.1:50151", True),
        ("cline", "", True),
    ],
)
def test_catches_a_template_that_writes_an_address(
    tree: Path, slug: str, value: str, written: bool
) -> None:
    """A written address (a value, a variable's default, a variable the client leaves as
    text) overrides the address `knowledge serve` recorded: a service on another port was
    never found from such a template."""
    name = _set_address(tree, slug, value)
    failed = _failures(check.run_checks(tree))
    assert (name in failed) is written, failed
    if written:
        assert "KNOWLEDGE_ADDRESS holds " in failed[name]


@pytest.mark.parametrize(
    "args", [["mcp", "--address", "127.0.0.1:50151"], ["mcp", "--address=x:1"]]
)
def test_catches_a_template_that_gives_the_address_as_an_argument(
    tree: Path, args: list[str]
) -> None:
    _edit_json(tree / "pi" / "mcp.json", lambda d: d["mcpServers"]["knowledge"].update(args=args))
    failed = _failures(check.run_checks(tree))
    assert "the arguments give --address" in failed["pi/template"]


@pytest.mark.parametrize(
    ("value", "why"), [("hunter2hunter2", "looks like a secret"), ("s3cr3", "literal value")]
)
def test_catches_a_literal_token_of_no_known_shape(tree: Path, value: str, why: str) -> None:
    # Long literals are caught by the value detector; short ones by the key-name form check.
    path = tree / "codex-cli" / "config.toml"
    path.write_text(
        path.read_text(encoding="utf-8")
        + f'\n[mcp_servers.knowledge.env]\nKNOWLEDGE_TOKEN = "{value}"\n',
        encoding="utf-8",
    )
    failed = _failures(check.run_checks(tree))
    assert why in failed["codex-cli/template"]


def test_placeholders_are_not_secrets(tree: Path) -> None:
    for value in ("${KNOWLEDGE_TOKEN}", "${KNOWLEDGE_TOKEN:-}", "$KNOWLEDGE_TOKEN", "<token>"):
        _edit_json(
            tree / "cursor" / "mcp.json",
            lambda d, v=value: d["mcpServers"]["knowledge"]["env"].__setitem__(
                "KNOWLEDGE_TOKEN", v
            ),
        )
        assert _failures(check.run_checks(tree)) == {}, value


def test_catches_a_missing_boundaries_section(tree: Path) -> None:
    readme = tree / "opencode" / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text[: text.index("## Boundaries")], encoding="utf-8")
    failed = _failures(check.run_checks(tree))
    assert "Boundaries" in failed["opencode/readme"]


def test_catches_an_empty_boundaries_section(tree: Path) -> None:
    readme = tree / "cline" / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text[: text.index("## Boundaries")] + "## Boundaries\n\n", encoding="utf-8")
    assert "empty" in _failures(check.run_checks(tree))["cline/readme"]


def test_catches_an_l2_claim_without_a_smoke(tree: Path) -> None:
    def claim(data: dict) -> None:  # type: ignore[type-arg]
        for entry in data["products"]:
            if entry["slug"] == "cursor":
                entry["levels"] = ["L1", "L2", "L3", "L4"]

    _edit_json(tree / "index.json", claim)
    failed = _failures(check.run_checks(tree))
    assert "L2 claimed without an automatic smoke" in failed["cursor/levels"]
    assert "map" in failed  # the levels table no longer agrees either


def test_catches_an_l2_claim_without_a_verified_client(tree: Path) -> None:
    def claim(data: dict) -> None:  # type: ignore[type-arg]
        for entry in data["products"]:
            if entry["slug"] == "openclaw":
                entry["levels"] = ["L1", "L2", "L3", "L4"]

    _edit_json(tree / "index.json", claim)
    assert "verified client version" in _failures(check.run_checks(tree))["openclaw/levels"]


def test_catches_an_l2_claim_the_l2_tests_do_not_back(tree: Path) -> None:
    """L2 means the pinned client ran in tests/test_integrations_l2.py: a pin that differs
    from the verified version, or a product without its L2 test, fails the claim."""
    _edit_json(
        tree / "l2" / "package.json", lambda d: d["dependencies"].update({"opencode-ai": "0.0.1"})
    )

    def claim(data: dict) -> None:  # type: ignore[type-arg]
        for entry in data["products"]:
            if entry["slug"] == "hermes-agent":
                entry["levels"] = ["L1", "L2", "L3", "L4"]

    _edit_json(tree / "index.json", claim)
    failed = _failures(check.run_checks(tree))
    assert "l2/package.json pins 0.0.1" in failed["opencode/levels"]
    assert "not pinned in l2/package.json" in failed["hermes-agent/levels"]
    assert "test_hermes_agent_calls_knowledge_search" in failed["hermes-agent/levels"]


def test_catches_a_malformed_toml_template(tree: Path) -> None:
    path = tree / "codex-cli" / "config.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace('args = ["mcp"]', 'args = ["mcp"'),
        encoding="utf-8",
    )
    assert "does not parse as toml" in _failures(check.run_checks(tree))["codex-cli/template"]


def test_catches_malformed_yaml_and_json_templates(tree: Path) -> None:
    (tree / "hermes-agent" / "config.yaml").write_text(
        "mcp_servers:\n  knowledge: [unclosed\n", encoding="utf-8"
    )
    (tree / "opencode" / "opencode.json").write_text('{"mcp": {', encoding="utf-8")
    failed = _failures(check.run_checks(tree))
    assert "does not parse as yaml" in failed["hermes-agent/template"]
    assert "does not parse as json" in failed["opencode/template"]


def test_catches_a_template_that_does_not_launch_the_bridge(tree: Path) -> None:
    _edit_json(
        tree / "claude-code" / ".mcp.json",
        lambda d: d["mcpServers"]["knowledge"].__setitem__("args", ["serve"]),
    )
    assert "expected to start with mcp" in _failures(check.run_checks(tree))["claude-code/template"]


def test_catches_a_folder_without_an_entry_and_an_entry_without_a_folder(tree: Path) -> None:
    (tree / "windsurf").mkdir()
    shutil.rmtree(tree / "pi")
    detail = _failures(check.run_checks(tree))["folders"]
    assert "no index entry for folder windsurf" in detail
    assert "no folder for pi" in detail


def test_catches_an_automatic_smoke_without_main(tree: Path) -> None:
    (tree / "openclaw" / "smoke.py").write_text(
        "#!/usr/bin/env python3\nprint('hi')\n", encoding="utf-8"
    )
    assert "main()" in _failures(check.run_checks(tree))["openclaw/smoke"]


def test_catches_a_checklist_product_with_a_smoke_mismatch(tree: Path) -> None:
    (tree / "cursor" / "checklist.md").unlink()
    assert "checklist.md is missing" in _failures(check.run_checks(tree))["cursor/smoke"]


def test_cli_exits_nonzero_on_a_defect(tree: Path) -> None:
    (tree / "manus" / "README.md").write_text(
        "# Manus\n\n## Connect\n\nnothing\n", encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, str(INTEGRATIONS / "check.py"), "--root", str(tree)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "FAIL manus/readme" in done.stdout


# ------------------------------------------------------------------ smoke machinery


def test_expansion_follows_each_client() -> None:
    env = {"KNOWLEDGE_ADDRESS": "10.0.0.2:7000"}
    assert smoke_common.expand_vars("${KNOWLEDGE_ADDRESS:-x}", "shell", env) == "10.0.0.2:7000"
    assert smoke_common.expand_vars("${KNOWLEDGE_TOKEN:-}", "shell", env) == ""
    assert smoke_common.expand_vars("${KNOWLEDGE_TOKEN}", "shell", env) == "${KNOWLEDGE_TOKEN}"
    assert smoke_common.expand_vars("${env:KNOWLEDGE_ADDRESS}", "cursor", env) == "10.0.0.2:7000"
    assert smoke_common.expand_vars("{env:KNOWLEDGE_TOKEN}", "opencode", env) == ""
    assert smoke_common.expand_vars("${KNOWLEDGE_ADDRESS}", "none", env) == "${KNOWLEDGE_ADDRESS}"


def test_codex_template_forwards_only_named_variables() -> None:
    entry = smoke_common.product("codex-cli")
    data = smoke_common.load_template(INTEGRATIONS / "codex-cli" / entry["config_file"], "toml")
    launch = smoke_common.launch_from_template(data, entry["shape"])
    env = smoke_common.child_environment(
        launch, {"KNOWLEDGE_ADDRESS": "a:1", "KNOWLEDGE_TOKEN": "t", "HOME": "/x"}
    )
    assert env == {"KNOWLEDGE_ADDRESS": "a:1", "KNOWLEDGE_TOKEN": "t"}


def test_codex_template_and_plugin_forward_every_connection_setting_the_bridge_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex hands a server only the variables `env_vars` names: every one the stdio
    bridge reads must be there (the TLS files were not, so a service over TLS was
    unreachable from Codex; KNOWLEDGE_TIMEOUT was not, so it was ignored), the data
    directory's included. Found by running the bridge's own start-up reads."""
    from knowledge_mcp.__main__ import parse_args
    from knowledge_mcp.address import resolve_address
    from knowledge_sdk.client import ConnectionSettings

    class Reads(dict[str, str]):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def get(self, key: str, default: Any = None) -> Any:
            self.seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> str:
            self.seen.add(key)
            return super().__getitem__(key)

    reads = Reads()
    monkeypatch.setattr(os, "environ", reads)
    args = parse_args([])
    ConnectionSettings.from_env(address=resolve_address(args.address), timeout=args.timeout)
    monkeypatch.undo()
    # KNOWLEDGE_MCP_HTTP*: the bridge over HTTP (--http), which no harness starts.
    wanted = {
        n
        for n in reads.seen
        if n.startswith(("KNOWLEDGE_", "XDG_")) and not n.startswith("KNOWLEDGE_MCP_HTTP")
    }
    assert {"KNOWLEDGE_ADDRESS", "KNOWLEDGE_TLS_CA", "KNOWLEDGE_TIMEOUT", "XDG_DATA_HOME"} <= wanted
    codex = smoke_common.load_template(INTEGRATIONS / "codex-cli" / "config.toml", "toml")
    plugin = json.loads((REPO_ROOT / "plugins" / "knowledge" / ".mcp.json").read_text())
    for where, forwarded in (
        ("codex-cli/config.toml", codex["mcp_servers"]["knowledge"]["env_vars"]),
        ("plugins/knowledge/.mcp.json", plugin["mcpServers"]["knowledge"]["env_vars"]),
    ):
        assert wanted <= set(forwarded), (where, sorted(wanted - set(forwarded)))


def test_path_line_pattern() -> None:
    text = (
        'see uploader.py:4, src/a/b.ts:10-12 and /abs/c.go:7, not 127.0.0.1:50151 or "http://h:80"'
    )
    assert smoke_common.find_path_lines(text) == ["uploader.py:4", "src/a/b.ts:10", "/abs/c.go:7"]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('{"index_rev": "rev-000007"}', True),
        ('{\n  "index_rev":\t"rev-000007"\n}', True),
        ("index_rev=rev-000007\nuploader.py:4  LEDGER_UPLOAD_RETRY_BUDGET = 5", True),
        # Empty: the next line's path:line is not its value.
        ("index_rev=\nuploader.py:4  LEDGER_UPLOAD_RETRY_BUDGET = 5", False),
        ('{"index_rev":\n"uploader.py:4"}', False),
        ('{"index_rev": "", "hits": [{"address": "uploader.py:4"}]}', False),
        ("code (index_rev -, degraded)", False),
    ],
)
def test_index_rev_pattern_wants_a_value_on_its_line(text: str, ok: bool) -> None:
    assert smoke_common._has_index_rev(text) is ok


_STAND_IN = textwrap.dedent(
    """
    import sys
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("knowledge")
    ANSWER = sys.argv[1]

    @server.tool()
    def knowledge_search(query: str) -> str:
        return ANSWER

    server.run("stdio")
    """
)


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ('{"index_rev": "r7", "hits": [{"address": "uploader.py:4"}]}', True),
        ('{"index_rev": "r7", "hits": []}', False),
        ('{"hits": [{"address": "uploader.py:4"}]}', False),
    ],
)
def test_search_over_mcp_demands_an_address_and_a_revision(
    tmp_path: Path, answer: str, ok: bool
) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(_STAND_IN, encoding="utf-8")
    launch = smoke_common.Launch(command=sys.executable, args=(str(script), answer))
    text = smoke_common.bridge_search(launch, "127.0.0.1:1", None, tmp_path)
    if ok:
        assert smoke_common.assert_evidence(text) == ["uploader.py:4"]
    else:
        with pytest.raises(smoke_common.SmokeFailure):
            smoke_common.assert_evidence(text)


# A stand-in for the `knowledge` command: `serve` records its address in its data
# directory as the real one does, prints the listening line and waits, `index`
# succeeds, `mcp` is an MCP server that answers with a fixed text once the service
# address reached it (from KNOWLEDGE_ADDRESS, else from the recorded file). It lets the
# smokes run end to end, through each template's environment rules, without the real
# service.
_FAKE_KNOWLEDGE = textwrap.dedent(
    """
    import json, os, sys, time
    ANSWER = __ANSWER__
    verb = next((a for a in sys.argv[1:] if a in ("serve", "index", "mcp")), "")
    def recorded():
        try:
            with open(os.path.join(os.environ["KNOWLEDGE_DATA_DIR"], "server.json")) as fh:
                return json.load(fh)["address"]
        except (KeyError, OSError, ValueError):
            return None
    if verb == "serve":
        os.makedirs(os.environ["KNOWLEDGE_DATA_DIR"], mode=0o700, exist_ok=True)
        with open(os.path.join(os.environ["KNOWLEDGE_DATA_DIR"], "server.json"), "w") as fh:
            json.dump({"address": "127.0.0.1:45999"}, fh)
        print("listening on 127.0.0.1:45999", flush=True)
        time.sleep(600)
    elif verb == "index":
        sys.exit(0)
    elif verb == "mcp":
        from mcp.server.mcpserver import MCPServer
        server = MCPServer("knowledge")

        @server.tool()
        def knowledge_search(query: str) -> str:
            # The address must have reached the bridge through the template's env rules,
            # or the bridge must have found the one the service recorded.
            found = os.environ.get("KNOWLEDGE_ADDRESS") or recorded()
            if found != "127.0.0.1:45999":
                raise RuntimeError("bridge found the address %r" % found)
            return ANSWER

        server.run("stdio")
    sys.exit(2)
    """
)

MCP_SMOKES = ["claude-code", "codex-cli", "opencode", "openclaw", "hermes-agent", "pi"]


def _fake_knowledge(tmp_path: Path, answer: str) -> Path:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    exe = bindir / "knowledge"
    exe.write_text(
        f"#!{sys.executable}\n" + _FAKE_KNOWLEDGE.replace("__ANSWER__", repr(answer)),
        encoding="utf-8",
    )
    exe.chmod(0o755)
    return bindir


def _run_smoke(slug: str, tmp_path: Path, answer: str) -> subprocess.CompletedProcess[str]:
    import os

    bindir = _fake_knowledge(tmp_path, answer)
    env = {**os.environ, "KNOWLEDGE_SMOKE_PATH": str(bindir), "KNOWLEDGE_SMOKE_SKIP_CLIENT": "1"}
    return subprocess.run(
        [sys.executable, str(INTEGRATIONS / slug / "smoke.py")],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("slug", MCP_SMOKES)
def test_smoke_passes_end_to_end_against_a_stand_in(slug: str, tmp_path: Path) -> None:
    done = _run_smoke(slug, tmp_path, '{"index_rev": "r1", "hits": [{"address": "uploader.py:4"}]}')
    assert done.returncode == 0, done.stdout + done.stderr
    assert "uploader.py:4" in done.stdout.splitlines()
    assert f"OK {slug}" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("slug", ["claude-code", "hermes-agent"])
def test_smoke_fails_without_an_index_rev(slug: str, tmp_path: Path) -> None:
    done = _run_smoke(slug, tmp_path, '{"hits": [{"address": "uploader.py:4"}]}')
    assert done.returncode == 1
    assert "no index_rev" in done.stdout
