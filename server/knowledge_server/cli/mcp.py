"""`knowledge mcp`: starts the MCP bridge (the separate `knowledge_mcp` package).

The bridge is a client of the service; the server package never imports it. This command
replaces its own process with `python -m knowledge_mcp` (same interpreter), passing the
connection options given here or to the `knowledge` group, so harness configs written for
`knowledge mcp` keep working.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import click

from knowledge_server.cli.common import resolve_address

BRIDGE_MODULE = "knowledge_mcp"
# docs/harness.md, "Install": the names are not published on a package index, so whoever
# registered them there would be installed; the bridge comes from the repository or its wheel.
BRIDGE_MISSING = (
    "the MCP bridge is not installed: install the repository with its mcp extra "
    "(pip install -c requirements.lock '/path/to/repo[mcp]') or the bridge's wheel built in a "
    'checkout, as docs/harness.md ("Install") says; knowledge-mcp is not on a package index'
)


# The variables that make `knowledge-mcp` serve over HTTP instead of stdio.
HTTP_SWITCH = frozenset({"KNOWLEDGE_MCP_HTTP", "KNOWLEDGE_MCP_HTTP_TOKEN"})


def bridge_exec(
    address: str | None, token: str | None, timeout: float | None
) -> tuple[list[str], dict[str, str]]:
    """The bridge's command line and environment. The token goes in the environment
    (``KNOWLEDGE_TOKEN``), never on the command line, which every local user can read
    (``ps``, ``/proc/<pid>/cmdline``) for as long as the bridge runs. The bridge's HTTP
    switch (``KNOWLEDGE_MCP_HTTP`` and its token) is left out: `knowledge mcp` is the stdio
    bridge a harness starts, often with the user's whole environment, and a variable
    exported for an HTTP bridge turned it into one the harness could not talk to."""
    argv = [sys.executable, "-m", BRIDGE_MODULE]
    if address:
        argv += ["--address", address]
    if timeout:
        argv += ["--timeout", str(timeout)]
    env = {k: v for k, v in os.environ.items() if k not in HTTP_SWITCH}
    if token:
        env["KNOWLEDGE_TOKEN"] = token
    return argv, env


@click.command("mcp")
@click.option(
    "--address",
    default=None,
    help="Service address HOST:PORT. Env: KNOWLEDGE_ADDRESS. Default: the address "
    "`knowledge serve` recorded, else 127.0.0.1:50151.",
)
@click.option("--token", default=None, help="Bearer token. Env: KNOWLEDGE_TOKEN.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Deadline in seconds per call (default 30). Env: KNOWLEDGE_TIMEOUT.",
)
@click.pass_context
def mcp_command(
    ctx: click.Context, address: str | None, token: str | None, timeout: float | None
) -> None:
    """Run the MCP bridge on stdin/stdout (for agent harnesses); same as `knowledge-mcp`.

    Talks to a running `knowledge serve`; TLS files come from KNOWLEDGE_TLS_CA,
    KNOWLEDGE_TLS_CERT and KNOWLEDGE_TLS_KEY.
    """
    if importlib.util.find_spec(BRIDGE_MODULE) is None:
        raise click.ClickException(BRIDGE_MISSING)
    parent = ctx.find_root().obj if isinstance(ctx.find_root().obj, dict) else {}
    # The group's --address holds KNOWLEDGE_ADDRESS; without either, the address `knowledge
    # serve` recorded in the data directory (as every client command finds the service).
    argv, env = bridge_exec(
        address or resolve_address(ctx),
        token or parent.get("token"),
        timeout or parent.get("timeout"),
    )
    if ignored := sorted(HTTP_SWITCH & set(os.environ)):
        print(
            f"knowledge mcp: {', '.join(ignored)} ignored: this is the stdio bridge"
            " (for HTTP: knowledge-mcp --http)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # The bridge replaces this process (same stdio); argv[0] is the interpreter running us.
    os.execve(argv[0], argv, env)  # noqa: S606 - an argument list, no shell involved
