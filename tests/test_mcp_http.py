"""Remote MCP: the bridge over streamable HTTP (``knowledge-mcp --http``) against a real
server, driven by the MCP SDK's own HTTP client; a wrong or missing bearer token is refused
before any tool runs, and the transport listens on loopback unless told otherwise."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from knowledge_mcp.__main__ import parse_args
from knowledge_sdk import AsyncKnowledgeClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import REPO_ROOT, start_server, write_session_log

PATH = os.pathsep.join(str(REPO_ROOT / p) for p in ("server", "sdk", "licensing", "bridge"))
TOKEN = "k" * 20 + "remote-mcp-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_bridge(address: str, token: str | None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KNOWLEDGE_")}
    env.update(KNOWLEDGE_ADDRESS=address, PYTHONPATH=PATH)
    if token is not None:
        env["KNOWLEDGE_MCP_HTTP_TOKEN"] = token
    proc = subprocess.Popen(
        [sys.executable, "-m", "knowledge_mcp", "--http", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _session_call(url: str, token: str, query: str) -> tuple[list[str], dict]:  # type: ignore[type-arg]
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool("knowledge_search", {"query": query})
        assert not result.is_error
        assert result.structured_content is not None
        return tools, result.structured_content


async def test_http_transport_serves_the_tools_behind_a_bearer_token(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_session_log(logs / "s.jsonl", "sess-remote", tmp_path, "remote harness pelican_marker")
    rs = await start_server(tmp_path, session_paths=[str(logs)])
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            async for _ in kc.ingest_sessions([str(logs)]):
                pass
        with http_bridge(rs.address, TOKEN) as (url, proc):
            tools, data = await _session_call(url, TOKEN, "pelican_marker")
            assert "knowledge_search" in tools
            lane = data["lanes"]["episodes"]
            assert lane["index_rev"].startswith("episodes:")
            assert lane["items"][0]["session_id"] == "sess-remote"
            assert data["untrusted"] is True

            # A refused token: the SDK's client fails, a plain request gets 401 with the
            # bearer challenge, and no tool ran.
            # (the SDK's client reports it as a failed request inside its task group)
            with pytest.raises(BaseExceptionGroup):
                await _session_call(url, TOKEN[:-1] + "x", "pelican_marker")
            async with httpx2.AsyncClient(timeout=10) as plain:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
                accept = {"Accept": "application/json, text/event-stream"}
                for headers in (
                    accept,
                    {**accept, "Authorization": "Bearer wrong"},
                    {**accept, "Authorization": f"Basic {TOKEN}"},
                ):
                    r = await plain.post(url, json=body, headers=headers)
                    assert r.status_code == 401, (headers, r.status_code)
                    assert r.headers["www-authenticate"].startswith("Bearer")
                    assert TOKEN not in r.text
            assert proc.poll() is None  # the bridge keeps serving
        err = proc.stderr.read() if proc.stderr else ""
        assert TOKEN not in err  # the token is never logged
        assert "loopback" in err
    finally:
        await rs.server.stop(0)


def test_http_needs_a_strong_token_and_defaults_to_loopback() -> None:
    assert parse_args(["--http"]).http == "127.0.0.1:8765"
    assert parse_args([]).http is None
    for token in (None, "short"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KNOWLEDGE_")}
        env["PYTHONPATH"] = PATH
        if token is not None:
            env["KNOWLEDGE_MCP_HTTP_TOKEN"] = token
        done = subprocess.run(
            [sys.executable, "-m", "knowledge_mcp", "--http"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "KNOWLEDGE_MCP_HTTP_TOKEN" in done.stderr
