"""Remote MCP: the bridge over the MCP SDK's streamable HTTP transport, for hosted harnesses
and shared team machines that cannot start a local process.

* Every request needs ``Authorization: Bearer <token>``: the SDK's bearer middleware refuses
  a missing or wrong token with 401 before any tool runs. The accepted token is the bridge's
  own (``KNOWLEDGE_MCP_HTTP_TOKEN``, at least 32 characters), compared as SHA-256 digests in
  constant time; it is never logged. Calls go on to the service with the bridge's service
  credentials (``KNOWLEDGE_TOKEN``), so the service scopes them by that principal.
* Loopback by default (``127.0.0.1:8765``); another interface must be named explicitly, and
  the SDK's DNS-rebinding protection is on for loopback hosts.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from knowledge_sdk import ConnectionSettings
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from starlette.applications import Starlette

from knowledge_mcp.server import build_server

DEFAULT_LISTEN = "127.0.0.1:8765"
TOKEN_ENV = "KNOWLEDGE_MCP_HTTP_TOKEN"  # noqa: S105 - the variable's name, not a secret
MIN_TOKEN_CHARS = 32
PATH = "/mcp"


class HTTPConfigError(ValueError):
    """The HTTP transport cannot start with these settings (message says why)."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise HTTPConfigError(f"--http: expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class StaticTokenVerifier:
    """Accepts exactly one bearer token (the SDK's ``TokenVerifier`` protocol)."""

    def __init__(self, token: str) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise HTTPConfigError(
                f"the HTTP transport needs a bearer token of at least {MIN_TOKEN_CHARS} "
                f"characters in {TOKEN_ENV} (e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`)"
            )
        self._digest = hashlib.sha256(token.encode()).digest()

    async def verify_token(self, token: str) -> AccessToken | None:
        given = hashlib.sha256(token.encode()).digest()
        if not hmac.compare_digest(given, self._digest):
            return None
        return AccessToken(token=token, client_id="knowledge-mcp-http", scopes=[])


def http_app(settings: ConnectionSettings, host: str, port: int, token: str) -> Starlette:
    """The Starlette app serving the bridge's tools at ``/mcp`` behind the bearer check."""
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{PATH}"
    server = build_server(
        settings,
        auth=AuthSettings(issuer_url=url, resource_server_url=url),  # type: ignore[arg-type]  # pydantic coerces the URL strings
        token_verifier=StaticTokenVerifier(token),
    )
    return server.streamable_http_app(streamable_http_path=PATH, host=host)


def run_http(settings: ConnectionSettings, listen: str, token: str) -> None:
    """Serve until interrupted (uvicorn)."""
    import uvicorn  # a dependency of the MCP SDK's HTTP transport

    host, port = parse_listen(listen)
    app = http_app(settings, host, port, token)
    uvicorn.run(app, host=host, port=port, log_level="warning")
