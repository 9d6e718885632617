"""Generic JSONL: one event per line for harnesses without a dedicated importer.

Line fields (only ``text`` plus ``role`` or ``event_type`` are needed)::

    {"session_id": "s1", "seq": 3, "time": "2026-01-02T10:00:00Z", "role": "user",
     "text": "...", "cwd": "/repo", "harness": "my-agent", "model": "m", "agent_preset": "p",
     "tool_name": "Bash", "is_error": false, "outcome": "success", "meta": {...},
     "parent_session_id": "s0", "agent_id": "a1", "title": "..."}

``session_id`` defaults to the file stem, ``seq`` to line number * 1000. ``role`` maps to
``<role>/message`` (``tool`` -> ``tool_result``); ``event_type`` is used verbatim. A line with
``outcome`` set to success/failure is an explicit outcome signal.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ...redact import redact
from ..model import SEQ_STRIDE, Event, Problem
from .base import (
    ImportResult,
    clean_meta,
    clean_text,
    cut,
    dict_at,
    ensure_session,
    flatten_text,
    parse_time,
    read_jsonl,
    str_at,
)

HARNESS = "generic"
_ROLE_TYPES = {
    "user": "user/message",
    "assistant": "assistant/message",
    "system": "system",
    "tool": "tool_result",
    "reasoning": "reasoning",
    "summary": "summary",
}


def import_file(
    path: str,
    offset: int = 0,
    line: int = 0,
    pending_newline: bool = False,
    ctx: dict[str, Any] | None = None,
) -> ImportResult:
    if not ctx:
        # Without a session_id a line belongs to its file's session: the stem, told apart
        # from other files of that name ("session.jsonl" in two projects) by its path.
        digest = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogatepass"))
        stem = os.path.splitext(os.path.basename(path))[0]
        ctx = {"stem": f"{stem}-{digest.hexdigest()[:10]}"}
    return read_jsonl(
        path, _handle, offset=offset, line=line, pending_newline=pending_newline, ctx=ctx
    )


def _handle(obj: dict[str, Any], n: int, ctx: dict[str, Any], res: ImportResult, path: str) -> None:
    sid = obj.get("session_id") or obj.get("sessionId") or ctx["stem"]
    sid = str(sid)
    s = ensure_session(res, sid, str(obj.get("harness") or HARNESS)[:40], path)
    if s.harness == HARNESS and isinstance(obj.get("harness"), str):
        s.harness = obj["harness"][:40]
    time = parse_time(obj.get("time") or obj.get("timestamp") or obj.get("created_at"))
    if time and (s.created_at is None or time < s.created_at):
        s.created_at = time
    for key in (
        "cwd",
        "model",
        "agent_preset",
        "parent_session_id",
        "agent_id",
        "title",
        "subagent_type",
    ):
        v = obj.get(key)
        if isinstance(v, str) and v:
            if key == "cwd" and s.cwd:
                continue
            setattr(s, key, redact(cut(v, 500)) if key == "title" else v)
    if s.parent_session_id or s.agent_id:
        s.is_sidechain = True
    etype = obj.get("event_type")
    if not isinstance(etype, str) or not etype:
        role = obj.get("role") if isinstance(obj.get("role"), str) else obj.get("type")
        if not isinstance(role, str) or not role:
            res.problems.append(Problem("unknown", path, n, "line has neither role nor event_type"))
            return
        etype = _ROLE_TYPES.get(role, f"{role}/message" if "/" not in role else role)
        tool = obj.get("tool_name")
        if role == "tool_use" and isinstance(tool, str):
            etype = f"tool_use/{tool}"
    text = obj.get("text")
    if not isinstance(text, str):
        text = flatten_text(obj.get("content") if "content" in obj else obj.get("message"))
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not -(2**63) <= seq < 2**63:
        seq = n * SEQ_STRIDE  # none, or not a number SQLite can store
    outcome = obj.get("outcome")
    meta = dict_at(obj, "meta")
    tool_name = str_at(obj, "tool_name")
    res.events.append(
        Event(
            session_id=sid,
            seq=seq,
            event_type=etype[:80],
            text=clean_text(text or ""),
            time=time,
            is_error=bool(obj.get("is_error")),
            tool_name=tool_name,
            meta=clean_meta(meta),
            signal=outcome if outcome in ("success", "failure") else None,
        )
    )
