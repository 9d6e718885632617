"""A small sandbox corpus (EIP-shaped Markdown) for tests and demos, plus a folder loader."""

from __future__ import annotations

from pathlib import Path

from .model import DocChunk, chunk_markdown_file

__all__ = ["SAMPLE_DOCS", "load_markdown_chunks", "write_sample_corpus"]

SAMPLE_DOCS: dict[str, str] = {
    "eip-100.md": """---
eip: 100
title: Gas pricing baseline
author: Alice Doe (@alice), Bob Roe <bob@example.org>
status: Final
type: Standards Track
category: Core
requires: 200, 300
---

## Abstract
The Fee Market design requires EIP-200 for the Base Fee Oracle.
The BASEFEE opcode uses the `base_fee_per_gas` field.

## Specification
The Base Fee Oracle defines `base_fee_per_gas` for every block.
The Fee Market uses BASEFEE when pricing. See [EIP-200](./eip-200.md).

## Rationale
The Fee Market and the Base Fee Oracle were kept apart on purpose.
BASEFEE stays cheap so that wallets can read it often.
""",
    "eip-200.md": """---
eip: 200
title: Oracle storage layout
author: Carol Poe (@carol)
status: Draft
type: Standards Track
category: Core
requires: 300
---

## Abstract
The Base Fee Oracle extends EIP-300 with a Storage Slot Map.
Clients read the Storage Slot Map through SLOAD.

## Specification
The Storage Slot Map uses SLOAD and the `slot_index` key.
The Base Fee Oracle and the Storage Slot Map share one account.
See [the baseline](./eip-100.md) and [EIP-300](./eip-300.md).
""",
    "eip-300.md": """---
eip: 300
title: Account access lists
author: Dan Moe (@dan), Alice Doe (@alice)
status: Final
type: Standards Track
category: Core
---

## Abstract
Access List Transactions define the `access_list` field.
SLOAD becomes cheaper for warm slots listed in Access List Transactions.

## Motivation
Access List Transactions make Storage Slot Map reads predictable.
The `access_list` field uses a compact encoding.
""",
    "notes/operator-notes.md": """# Operator Notes

Operators watch the Base Fee Oracle during upgrades.
The Fee Market requires monitoring of BASEFEE spikes.

## Links
The baseline is described in [EIP-100](../eip-100.md).
""",
}


def write_sample_corpus(root: str | Path) -> list[str]:
    """Write :data:`SAMPLE_DOCS` under ``root``; returns the relative paths, sorted."""
    base = Path(root)
    for rel, text in SAMPLE_DOCS.items():
        target = base / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return sorted(SAMPLE_DOCS)


def load_markdown_chunks(root: str | Path, pattern: str = "**/*.md") -> list[DocChunk]:
    """Chunks of every Markdown file under ``root`` (relative posix paths), in path order."""
    base = Path(root)
    chunks: list[DocChunk] = []
    for p in sorted(base.glob(pattern)):
        if p.is_file():
            chunks.extend(chunk_markdown_file(base, p.relative_to(base).as_posix()))
    return chunks
