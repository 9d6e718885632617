"""Format detection and dispatch to the per-harness importers."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from ...redact import redact
from . import aider, claude_code, codex, generic, opencode
from .base import MAX_LINE_BYTES, ImportResult, cut, head_records

__all__ = [
    "INCREMENTAL_FORMATS",
    "ImportResult",
    "detect_format",
    "import_full",
    "import_incremental",
    "plain_session_id",
    "sniff_format",
]

# JSONL formats are read incrementally (byte offset + line number); the others are
# re-imported whole when their fingerprint changes.
INCREMENTAL_FORMATS = frozenset({"claude-code", "codex", "generic"})

_AIDER_HEADER = re.compile(r"(?m)^# aider chat started at \d{4}-\d\d-\d\d")
_CODEX_TYPES = {
    "session_meta",
    "response_item",
    "event_msg",
    "turn_context",
    "compacted",
    "world_state",
}
_CLAUDE_TYPES = {
    "user",
    "assistant",
    "summary",
    "system",
    "attachment",
    "progress",
    "file-history-snapshot",
    "queue-operation",
    "last-prompt",
    "permission-mode",
}


def detect_format(path: str) -> str | None:
    """Guess the format of one file from its layout and content; None = not a session log."""
    return sniff_format(path)[0]


def sniff_format(path: str) -> tuple[str | None, str]:  # noqa: C901 - one probe per supported log format, in priority order
    """``(format, "")`` for a session log, ``(None, reason)`` for a file that is not one."""
    name = os.path.basename(path)
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if name.endswith(".json"):
        if len(parts) >= 3 and parts[-3] == "session" and name.startswith("ses_"):
            return "opencode", ""
        return None, "not an OpenCode session file (session/*/ses_*.json)"
    if name.endswith(".md"):
        try:
            with open(path, "rb") as fh:
                head = fh.read(1 << 20).decode("utf-8", errors="replace")
        except OSError as exc:
            return None, f"unreadable ({type(exc).__name__})"
        if _AIDER_HEADER.search(head):
            return "aider", ""
        return None, "no Aider chat header in the first MiB"
    if not name.endswith((".jsonl", ".ndjson")):
        return None, "not a session log type (.jsonl, .ndjson, Aider .md, OpenCode .json)"
    try:
        records, oversized = head_records(path)
    except OSError as exc:
        return None, f"unreadable ({type(exc).__name__})"
    votes = {"codex": 0, "claude-code": 0, "generic": 0}
    for obj in records:
        t = obj.get("type")
        if (t in _CODEX_TYPES and isinstance(obj.get("payload"), dict)) or (
            "id" in obj and "instructions" in obj and "type" not in obj
        ):
            votes["codex"] += 3
        elif "record_type" in obj:
            votes["codex"] += 1
        elif "sessionId" in obj or "parentUuid" in obj or "isSidechain" in obj or "leafUuid" in obj:
            votes["claude-code"] += 3
        elif t in _CLAUDE_TYPES and isinstance(obj.get("message"), dict):
            votes["claude-code"] += 2
        elif "session_id" in obj and "text" in obj:
            votes["generic"] += 3
        elif "text" in obj and ("role" in obj or "event_type" in obj):
            votes["generic"] += 1
    best = max(votes, key=lambda k: votes[k])
    if votes[best] == 0:
        if records:
            return "generic", ""
        if oversized:
            return None, (
                f"no JSON object in its first lines: {oversized} line(s) over the "
                f"{MAX_LINE_BYTES >> 20} MiB line limit"
            )
        return None, "empty, or no JSON object in its first lines"
    return best, ""


def import_full(fmt: str, path: str) -> ImportResult:
    if fmt == "aider":
        return plain_fields(aider.import_file(path))
    if fmt == "opencode":
        return plain_fields(opencode.import_file(path))
    return import_incremental(fmt, path, 0, 0, False, None)


def import_incremental(
    fmt: str, path: str, offset: int, line: int, pending_newline: bool, ctx: dict[str, Any] | None
) -> ImportResult:
    mod = {"claude-code": claude_code, "codex": codex, "generic": generic}[fmt]
    return plain_fields(
        mod.import_file(path, offset=offset, line=line, pending_newline=pending_newline, ctx=ctx)
    )


# A session id is written in the log, so it is data: one that holds a line break or another
# character that is not printable (or is longer than this) is stored with each such
# character as "_", cut to this length. Ids are quoted one per line in the evidence agents
# read (``session#seq``, ``ep:session:seq``): a line break in one forged lines of its own.
MAX_SESSION_ID = 200


def plain_session_id(value: str) -> str:
    """``value`` with every character that is not printable as ``_``, at most
    MAX_SESSION_ID long; the same id for the same input, so increments agree."""
    if value.isprintable() and len(value) <= MAX_SESSION_ID:
        return value
    return "".join(c if c.isprintable() else "_" for c in value[:MAX_SESSION_ID])


# A name a log gives (a tool, an agent type, a model, a title) is shown in actors' ids and
# names, in hand-off packages and the tool calls they carry: cut to this many characters.
MAX_NAME = 200
MAX_TITLE = 500


def _one_line(value: str) -> str:
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else "_" for c in " ".join(value.split()))


def plain_name(value: str, limit: int = MAX_NAME) -> str:
    """A name shown on one line (a session's title, an event type, a tool, an agent
    type): redacted like a text and cut to ``limit``, runs of white space as one space,
    any other character that is not printable as ``_``. A log's tool or agent type that
    holds a token is a secret as much as its text is."""
    if len(value) > limit:
        return _one_line(cut(value, limit))
    return _short_name(value)


@functools.lru_cache(maxsize=4096)
def _short_name(value: str) -> str:
    # Remembered (short names only): a log repeats its few tool names on every event.
    return _one_line(redact(value))


def plain_fields(res: ImportResult) -> ImportResult:
    """``res`` with its events' and sessions' ids, and the agent ids that name sidechain
    actors, made plain (``plain_session_id``); the names shown on one line (titles, event
    types, tools, models, agent types) too (``plain_name``): a log's text cannot start a
    line of its own, or send a terminal an escape sequence, where they are shown."""
    for event in res.events:
        event.session_id = plain_session_id(event.session_id)
        event.event_type = plain_name(event.event_type)
        if event.tool_name:
            event.tool_name = plain_name(event.tool_name)
        agent = event.meta.get("agent_id")
        if isinstance(agent, str):
            event.meta["agent_id"] = plain_session_id(agent)
        kind = event.meta.get("subagent_type")
        if isinstance(kind, str):
            event.meta["subagent_type"] = plain_name(kind)
    if any(not k.isprintable() or len(k) > MAX_SESSION_ID for k in res.sessions):
        sessions = {}
        for meta in res.sessions.values():
            meta.session_id = plain_session_id(meta.session_id)
            sessions[meta.session_id] = meta
        res.sessions = sessions
    for meta in res.sessions.values():
        if meta.parent_session_id:
            meta.parent_session_id = plain_session_id(meta.parent_session_id)
        if meta.agent_id:
            meta.agent_id = plain_session_id(meta.agent_id)
        for name in ("title", "model", "agent_preset", "subagent_type"):
            value = getattr(meta, name)
            if value:
                setattr(meta, name, plain_name(value, MAX_TITLE if name == "title" else MAX_NAME))
    return res
