#!/usr/bin/env python3
"""Smoke for the Python SDK example.

Starts a throw-away service, indexes a tiny workspace, runs example.py against it
with KNOWLEDGE_ADDRESS set, and fails unless the output carries path:line and an
index_rev.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smoke_common import (
    SMOKE_QUERY,
    SmokeFailure,
    index_corpus,
    running_service,
    until_evidence,
    write_corpus,
)

EXAMPLE = Path(__file__).resolve().parent / "example.py"


def _run_example(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), SMOKE_QUERY],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Exit 1 means "no hit yet": its output is judged (and retried) like any answer.
    if done.returncode not in (0, 1):
        raise SmokeFailure(f"example.py exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def main() -> int:
    print("== smoke python-sdk: example.py")
    try:
        with tempfile.TemporaryDirectory(prefix="knowledge-smoke-python-sdk-") as tmp:
            corpus = write_corpus(Path(tmp) / "workspace")
            with running_service(Path(tmp) / "data", workspace=corpus) as address:
                print(f"service listening on {address}")
                index_corpus(address, corpus)
                env = {k: v for k, v in os.environ.items() if k != "KNOWLEDGE_TOKEN"}
                env["KNOWLEDGE_ADDRESS"] = address
                hits = until_evidence(lambda: _run_example(env))
    except SmokeFailure as exc:
        print(f"FAIL python-sdk: {exc}")
        return 1
    for hit in hits:
        print(hit)
    print("OK python-sdk: answer carries path:line and index_rev")
    return 0


if __name__ == "__main__":
    sys.exit(main())
