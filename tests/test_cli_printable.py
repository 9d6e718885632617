"""Text the service stored from others (memory values, session titles, snippets) is shown
by the CLI, never run by the terminal: control characters are printed as escapes."""

from __future__ import annotations

import importlib
import io
from types import SimpleNamespace

import pytest
from knowledge_server.cli import common
from rich.console import Console

# The module (``knowledge_server.cli.memory`` the attribute is its command group).
memory_cli = importlib.import_module("knowledge_server.cli.memory")


def test_printable_escapes_control_characters_and_keeps_the_rest() -> None:
    assert common.printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"
    shown = common.printable("ok\x1b[2K\x1b]0;pwned\x07 line\nbreak\x9b")
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
