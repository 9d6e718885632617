"""Aider Markdown chat history (``.aider.chat.history.md``).

Each ``# aider chat started at YYYY-MM-DD HH:MM:SS`` header opens a session; text before
the first header forms a ``preamble`` session. ``#### `` lines are user turns, ``> ``
blockquotes are tool/command output (``system``), the rest is the assistant reply.
Session id: ``aider-<sha1(file path)[:10]>-<YYYYMMDDTHHMMSS>`` (+ ``-<n>`` for repeated
headers); ``seq`` = line number * 1000 of the block start; ``cwd`` = the file's folder;
header times have no zone and are taken as UTC. The file is re-parsed whole on change.
"""

from __future__ import annotations

import hashlib
import os
import re
from datetime import UTC, datetime

from ..model import SEQ_STRIDE, Event, SessionMeta
from .base import ImportResult, clean_text

HARNESS = "aider"
_HEADER = re.compile(r"^# aider chat started at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s*$")
_ERRORS = re.compile(r"(?i)\b(error|failed|traceback|exception)\b")


def import_file(path: str) -> ImportResult:
    res = ImportResult()
    with open(path, "rb") as fh:
        data = fh.read()
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    base = (
        "aider-"
        + hashlib.sha1(os.path.abspath(path).encode(), usedforsecurity=False).hexdigest()[:10]
    )
    cwd = os.path.dirname(os.path.abspath(path))
    used: dict[str, int] = {}
    sid = base + "-preamble"
    started: datetime | None = None
    block: list[str] = []
    kind = ""
    start_line = 0

    def flush() -> None:
        nonlocal block, kind
        body = "\n".join(block).strip()
        if body and kind:
            if sid not in res.sessions:
                res.sessions[sid] = SessionMeta(
                    session_id=sid, harness=HARNESS, cwd=cwd, created_at=started, source_path=path
                )
            etype = {"user": "user/message", "tool": "system", "assistant": "assistant/message"}[
                kind
            ]
            is_err = kind == "tool" and bool(_ERRORS.search(body))
            res.events.append(
                Event(
                    session_id=sid,
                    seq=start_line * SEQ_STRIDE,
                    event_type=etype,
                    text=clean_text(body),
                    time=started,
                    is_error=is_err,
                )
            )
        block, kind = [], ""

    for i, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        m = _HEADER.match(line)
        if m:
            flush()
            started = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            key = started.strftime("%Y%m%dT%H%M%S")
            used[key] = used.get(key, 0) + 1
            sid = f"{base}-{key}" + (f"-{used[key]}" if used[key] > 1 else "")
            res.sessions[sid] = SessionMeta(
                session_id=sid, harness=HARNESS, cwd=cwd, created_at=started, source_path=path
            )
            continue
        if line.startswith("#### "):
            k, content = "user", line[5:]
        elif line.startswith(">"):
            k, content = "tool", line[1:].lstrip(" ").rstrip()
        elif not line.strip():
            if kind:
                block.append("")
            continue
        else:
            k, content = "assistant", line
        if k != kind:
            flush()
            kind, start_line = k, i
        block.append(content)
    flush()
    # A header followed directly by another header is an empty session: not worth listing.
    used_ids = {e.session_id for e in res.events}
    res.sessions = {k: v for k, v in res.sessions.items() if k in used_ids}
    res.end_offset = len(data)
    res.end_line = len(lines)
    return res
