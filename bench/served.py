"""`knowledge serve` as a separate process on a free loopback port, for the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def served(
    data: Path, *serve_args: str, stop_timeout: float = 30, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start the server on ``data`` with ``serve_args``; yield it and its address once it
    accepts calls; stop it (SIGTERM) on exit. Logs warnings only, as JSON. ``env`` adds to
    the environment (e.g. PYTHONPATH, to serve another checkout)."""
    env = dict(
        os.environ, KNOWLEDGE_LOG_LEVEL="warning", KNOWLEDGE_LOG_FORMAT="json", **(env or {})
    )
    command = [sys.executable, "-m", "knowledge_server.cli", "--data-dir", str(data)]
    proc = subprocess.Popen(
        [*command, "serve", "--listen", "127.0.0.1:0", *serve_args],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""
        if not line.startswith("listening on 127.0.0.1:"):
            raise RuntimeError(f"the server did not start: {line.strip()!r}")
        yield proc, line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=stop_timeout)
