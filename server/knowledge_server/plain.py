"""Text from others (logs, packages, memory) shown as text: never run by a terminal, never
starting lines of its own where one line is meant."""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str, *, lines: bool = False) -> str:
    r"""``text`` with every character that is not printable (an escape sequence that would
    move the terminal's cursor, hide text or retitle the window; a line break) written as
    its escape (``\x1b``, ``\n``). ``lines``: line breaks and tabs are kept (a whole event
    or chunk)."""
    if text.isprintable():
        return text
    kept = "\n\t" if lines else ""
    return "".join(
        c if c.isprintable() or c in kept else c.encode("unicode_escape").decode("ascii")
        for c in text
    )
