"""Text the service stored from others (memory values, session titles, snippets) is shown
by the CLI, never run by the terminal: control characters are printed as escapes."""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from knowledge_sdk import KnowledgeClient
from knowledge_sdk import types as v1
from knowledge_server import plain
from knowledge_server._gen.knowledge.v1 import dispatch_pb2
from knowledge_server.cli import main as cli_main
from knowledge_server.dispatch import outbox as ob
from rich.console import Console

from tests.conftest import LicenceVendor, ServerThread, dev_keys

# The module (``knowledge_server.cli.memory`` the attribute is its command group).
memory_cli = importlib.import_module("knowledge_server.cli.memory")


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert plain.printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"
    shown = plain.printable("ok\x1b[2K\x1b]0;pwned\x07 line\nbreak\x9b")
    assert shown == "ok\\x1b[2K\\x1b]0;pwned\\x07 line\\nbreak\\x9b"
    assert shown.isprintable()


def test_memory_cli_prints_a_stored_escape_sequence_as_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(memory_cli, "out_console", Console(file=buf, force_terminal=True))
    entry = SimpleNamespace(
        id="mem:1",
        current=True,
        category="ops",
        key="k",
        value="ok\x1b[2K\x1b[1A\x1b]0;pwned\x07 hidden \x1b[8mINVISIBLE\x1b[0m",
        confidence=0.7,
        confirmations=1,
    )
    memory_cli._say(memory_cli._entry(entry))
    out = buf.getvalue()
    assert "\x1b]0;" not in out and "\x1b[8m" not in out and "\x07" not in out
    assert "\\x1b[8mINVISIBLE" in out


def test_outbox_show_prints_a_packages_log_text_escaped(tmp_path: Path) -> None:
    """A package holds text from session logs (a title as the target's name, snippets,
    risks): ``knowledge outbox show`` and ``list`` print it escaped, one line per entry, so
    a forged ``execution: executed`` line or a window-title sequence never appears."""
    package = dispatch_pb2.HandoffPackage(
        schema="knowledge.handoff/v1", assignment_id="assign:abc", execution="not_executed"
    )
    package.target.name = "Quokka \x1b]0;PWNED-TITLE\x07\x1b[2J"
    package.task.text = "deploy quokka"
    package.context_pack.prior_episodes.add(id="ep:s:2", snippet="failed \x1b[8m hidden")
    package.context_pack.risks.append("prior failure in ep:s:2: tool_use/Bash\nexecution: executed")
    package.tool_calls.add(tool="spawn_teammate", arguments={"description": "x\x1b[31mred"})
    ob.write_once(ob.outbox_dir(tmp_path), "assign:abc", package)
    runner = CliRunner()
    for args in (["outbox", "show", "assign:abc"], ["outbox", "list"]):
        out = runner.invoke(cli_main, ["--data-dir", str(tmp_path), *args])
        assert out.exit_code == 0, out.output
        assert "\x1b" not in out.output and "\x07" not in out.output
    shown = runner.invoke(cli_main, ["--data-dir", str(tmp_path), "outbox", "show", "assign:abc"])
    assert "\\x1b]0;PWNED-TITLE" in shown.output
    assert not any(line.startswith("execution: executed") for line in shown.output.splitlines())


def test_docgraph_cli_prints_document_text_escaped(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    """Untrusted document text is data: a heading is a theme title, an entity's name and a
    neighbour; ``knowledge docgraph`` printed it raw, so a window-title or clear-screen
    sequence in a document reached the terminal. Real Enterprise server, real CLI."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "guide.md").write_text(
        "# Guide\n\n## Setup \x1b]0;pwned-title\x07\x1b[2J\x1b[31mRED\n\n"
        "Use `alpha_param` with `beta_param` here.\n\n"
        "## Usage\n\nUse `alpha_param` with `beta_param` again.\n\n"
        "## More\n\nAgain `alpha_param` and `beta_param`.\n"
    )
    licence_vendor.install(tmp_path / "data")
    server = ServerThread(tmp_path, workspaces=[str(ws)], **dev_keys(tmp_path / "data"))
    try:
        with KnowledgeClient(server.address) as kc:
            list(kc.index_workspace(str(ws)))
            list(kc.build_doc_graph(v1.BuildDocGraphRequest(root=str(ws))))
            names = [n.name for n in kc.entity_neighbors("Guide", depth=1).neighbors]
        assert any("\x1b]0;" in n for n in names), names  # the graph holds the text as written
        runner = CliRunner()
        env = {"KNOWLEDGE_ADDRESS": server.address}
        for args in (["neighbors", "Guide"], ["themes"], ["overview"], ["search-levels", "Setup"]):
            out = runner.invoke(cli_main, ["docgraph", *args], env=env)
            assert out.exit_code == 0, (args, out.output)
            assert "\x1b" not in out.output and "\x07" not in out.output, args
        shown = runner.invoke(cli_main, ["docgraph", "neighbors", "Guide"], env=env).output
        assert "\\x1b]0;pwned-title\\x07" in shown
    finally:
        server.stop()


def test_operation_problems_name_files_escaped(tmp_path: Path) -> None:
    """A log's file name is written by whoever wrote the log: ``knowledge ingest`` printed
    the problems naming it raw (a file name can hold an escape sequence)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    name = "x\x1b]0;owned\x07\x1b[2J.jsonl"
    (logs / name).write_text('{"session_id": "s", "role": "user", "text": "ok"}\nnot json\n')
    server = ServerThread(tmp_path)
    try:
        out = CliRunner().invoke(
            cli_main, ["ingest", str(logs)], env={"KNOWLEDGE_ADDRESS": server.address}
        )
    finally:
        server.stop()
    assert out.exit_code == 0, out.output
    joined = "".join(out.output.split())  # the console wraps long lines
    assert "MALFORMED_RECORD" in joined and "x\\x1b]0;owned\\x07" in joined
    assert "\x1b" not in out.output and "\x07" not in out.output
