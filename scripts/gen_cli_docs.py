#!/usr/bin/env python3
"""Write docs/cli.md from the CLI's own --help texts (run after changing a command)."""

from __future__ import annotations

from pathlib import Path

import click
from knowledge_server.cli import iter_commands, main

OUT = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _command(path: str) -> tuple[click.Command, click.Context]:
    ctx = click.Context(main, info_name="knowledge")
    cmd: click.Command = main
    for part in path.split():
        if not isinstance(cmd, click.Group):
            raise TypeError(f"{path!r}: {cmd.name} has no subcommands")
        cmd = cmd.commands[part]
        ctx = click.Context(cmd, info_name=part, parent=ctx)
    return cmd, ctx


def render() -> str:
    lines = [
        "# CLI reference",
        "",
        "Generated from `--help` by `scripts/gen_cli_docs.py`. Global options (before the command):",
        "",
        "```",
        main.get_help(click.Context(main, info_name="knowledge")),
        "```",
        "",
        "Exit codes of client commands: 0 ok, 1 request failed (the reason code is printed), 2 usage or",
        "configuration error (a bad option, a TLS file or token the connection cannot use, a file the",
        "command cannot read), 3 edition required, 4 unavailable (the service unreachable or silent",
        "past the deadline, or a dependency it needs down or too slow: the reason code and trace id",
        "are printed; a retry may work), 5 not authenticated.",
        "",
    ]
    for path in iter_commands():
        cmd, ctx = _command(path)
        lines += [f"## `knowledge {path}`", "", "```", cmd.get_help(ctx), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
