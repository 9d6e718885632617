"""``knowledge-mcp`` / ``python -m knowledge_mcp``: the MCP bridge on stdin/stdout."""

from __future__ import annotations

import argparse
import os
import sys

from knowledge_sdk import ConnectionConfigError, ConnectionSettings

from knowledge_mcp.address import resolve_address
from knowledge_mcp.tools import TOOLS

try:
    from knowledge_mcp.server import build_server
except ModuleNotFoundError as exc:  # the one dependency a bare SDK install lacks
    if (exc.name or "").partition(".")[0] != "mcp":
        raise
    # Not `pip install knowledge-mcp`: that name is not published on a package index, so whoever
    # registered it there would be installed (docs/harness.md, "Install").
    sys.exit(
        "knowledge-mcp needs the `mcp` package: install the bridge's wheel built in a checkout "
        "(pip install --find-links dist dist/knowledge_mcp-0.1.0-py3-none-any.whl) or the "
        "repository with its mcp extra (pip install -c requirements.lock '/path/to/repo[mcp]'), "
        'as docs/harness.md ("Install") says; knowledge-mcp is not on a package index'
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="knowledge-mcp",
        description=(
            "Run the Knowledge Service's MCP bridge on stdin/stdout (for agent harnesses). "
            "Talks to a running `knowledge serve`; TLS files come from KNOWLEDGE_TLS_CA, "
            "KNOWLEDGE_TLS_CERT and KNOWLEDGE_TLS_KEY."
        ),
    )
    parser.add_argument(
        "--address",
        help=(
            "Service address HOST:PORT. Env: KNOWLEDGE_ADDRESS. Default: the address "
            "`knowledge serve` recorded in the data directory (KNOWLEDGE_DATA_DIR), else "
            "127.0.0.1:50151."
        ),
    )
    parser.add_argument("--token", help="Bearer token. Env: KNOWLEDGE_TOKEN.")
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        nargs="?",
        const="127.0.0.1:8765",
        help=(
            "Serve over streamable HTTP at http://HOST:PORT/mcp instead of stdio (default "
            "127.0.0.1:8765, loopback). Every request needs `Authorization: Bearer` with the "
            "token in KNOWLEDGE_MCP_HTTP_TOKEN. Env: KNOWLEDGE_MCP_HTTP."
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="Deadline in seconds per call (default 30). Env: KNOWLEDGE_TIMEOUT.",
    )
    args = parser.parse_args(argv)
    if args.http is None and (env_http := os.environ.get("KNOWLEDGE_MCP_HTTP")):
        args.http = env_http
    if args.timeout is None and (env := os.environ.get("KNOWLEDGE_TIMEOUT")):
        try:
            args.timeout = float(env)
        except ValueError:
            parser.error(f"KNOWLEDGE_TIMEOUT is not a number: {env!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = ConnectionSettings.from_env(
            address=resolve_address(args.address), token=args.token, timeout=args.timeout
        )
    except ConnectionConfigError as exc:
        # A TLS certificate without its key, a token no header carries: one line and exit
        # 2, as the CLI answers the same settings.
        print(f"knowledge-mcp: {exc}", file=sys.stderr)
        return 2
    if args.http:
        # The HTTP stack (uvicorn, starlette) is loaded only for --http.
        from knowledge_mcp import http

        try:
            host, _port = http.parse_listen(args.http)
            token = os.environ.get(http.TOKEN_ENV, "")
            http.StaticTokenVerifier(token)  # refuses a missing or short token before binding
        except http.HTTPConfigError as exc:
            print(f"knowledge-mcp: {exc}", file=sys.stderr)
            return 2
        where = "loopback" if http.is_loopback(host) else "NOT loopback: put TLS in front of it"
        print(
            f"knowledge-mcp: serving {len(TOOLS)} tools over streamable HTTP at "
            f"http://{args.http}/mcp ({where}) for {settings.address}",
            file=sys.stderr,
        )
        http.run_http(settings, args.http, token)
        return 0
    print(
        f"knowledge-mcp: serving {len(TOOLS)} tools over stdio for {settings.address}",
        file=sys.stderr,
    )
    build_server(settings).run("stdio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
