#!/usr/bin/env python3
"""Search the Knowledge Service from plain Python and print each fact's address.

    KNOWLEDGE_ADDRESS=127.0.0.1:50151 python example.py "where is the retry budget"

The token, when the service asks for one, comes from KNOWLEDGE_TOKEN; it is never
written in code or config. AsyncKnowledgeClient has the same methods.
"""

from __future__ import annotations

import os
import sys

from knowledge_sdk import KnowledgeClient


def main(argv: list[str]) -> int:
    query = " ".join(argv) or "where is the retry budget defined"
    address = os.environ.get("KNOWLEDGE_ADDRESS") or "127.0.0.1:50151"
    token = os.environ.get("KNOWLEDGE_TOKEN") or None
    with KnowledgeClient(address, token=token) as client:
        answer = client.search(query=query, include=["code"])
    code = answer.lanes.code
    print(f"index_rev={code.index_rev}")
    for item in code.items:
        first = item.snippet.splitlines()[0] if item.snippet else ""
        print(f"{item.path}:{item.start_line}  {first}")
    return 0 if code.items else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
