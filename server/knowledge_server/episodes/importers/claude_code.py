"""Claude Code transcripts (``~/.claude/projects/<slug>/<sessionId>.jsonl``), 1.x and 2.x.

Decisions (see docs/episodes.md):

* One file is one session. Its id is the first ``sessionId`` found in the file, else the
  file stem; stray records copied from other sessions stay in the file's session.
* ``seq`` = physical line number * 1000 + block index, i.e. file order. File order is what
  a reader can reproduce after every append; the parentUuid DAG can re-order branches
  but would make ``seq`` change when a later record arrives.
* 1.x inline sidechain records stay in the parent session; each event carries
  ``meta.is_sidechain``. 2.x subagent files (``agent-<id>.jsonl``, usually under
  ``<session>/subagents/``) become a child session ``<parent>/agent-<id>`` with
  ``parent_session_id`` and ``agent_id``; ``<file>.meta.json`` supplies ``agentType``.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ...redact import redact
from ..model import SEQ_STRIDE, Event, Problem, SessionMeta
from .base import (
    ImportResult,
    clean_meta,
    clean_text,
    compact_json,
    cut,
    ensure_session,
    flatten_text,
    head_records,
    load_file,
    parse_time,
    read_jsonl,
)

HARNESS = "claude-code"

_COMMAND = re.compile(r"<command-name>\s*/?([^<\s]+)\s*</command-name>")
_COMMAND_ARGS = re.compile(r"<command-args>(.*?)</command-args>", re.DOTALL)

# Record types that carry no searchable conversation text; they are skipped silently.
_KNOWN_SILENT = frozenset(
    [
        "attachment",
        "progress",
        "queue-operation",
        "file-history-snapshot",
        "last-prompt",
        "custom-title",
        "ai-title",
        "agent-name",
        "permission-mode",
        "mode",
        "pr-link",
        "frame-link",
        "worktree-state",
        "relocated",
        "bridge-session",
        "atis-latch",
        "started",
        "result",
        "tag",
    ]
)


def _first_session_id(path: str) -> str | None:
    try:
        records, _ = head_records(path)
    except OSError:
        return None
    for obj in records:
        sid = obj.get("sessionId")
        if isinstance(sid, str) and sid and not sid.startswith("["):
            return sid
    return None


def _initial_ctx(path: str) -> dict[str, Any]:
    stem = os.path.splitext(os.path.basename(path))[0]
    ctx: dict[str, Any] = {"tools": {}}
    if stem.startswith("agent-"):
        agent_id = stem[len("agent-") :]
        parts = os.path.normpath(path).split(os.sep)
        parent = None
        if len(parts) >= 3 and parts[-2] == "subagents":
            parent = parts[-3]
        if not parent:
            first = _first_session_id(path)
            if first and first != stem:
                parent = first
        parent = parent or "unknown"
        ctx.update(
            session=f"{parent}/agent-{agent_id}", parent=parent, agent_id=agent_id, child=True
        )
        meta_path = os.path.join(os.path.dirname(path), stem + ".meta.json")
        try:
            info = load_file(meta_path)
            if isinstance(info, dict):
                ctx["subagent_type"] = info.get("agentType")
                ctx["depth"] = info.get("spawnDepth")
        except (OSError, ValueError):
            pass
    else:
        ctx["session"] = _first_session_id(path) or stem
        ctx["child"] = False
    return ctx


def import_file(
    path: str,
    offset: int = 0,
    line: int = 0,
    pending_newline: bool = False,
    ctx: dict[str, Any] | None = None,
) -> ImportResult:
    return read_jsonl(
        path,
        _handle,
        offset=offset,
        line=line,
        pending_newline=pending_newline,
        ctx=ctx if ctx else _initial_ctx(path),
    )


def _session(res: ImportResult, ctx: dict[str, Any], path: str) -> SessionMeta:
    s = ensure_session(res, ctx["session"], HARNESS, path)
    if ctx.get("child"):
        s.parent_session_id = ctx.get("parent")
        s.agent_id = ctx.get("agent_id")
        s.is_sidechain = True
        s.subagent_type = ctx.get("subagent_type") or s.subagent_type
        s.agent_preset = ctx.get("subagent_type") or s.agent_preset
        if isinstance(ctx.get("depth"), int):
            s.spawn_depth = ctx["depth"]
    return s


def _remember_tool(ctx: dict[str, Any], tool_id: Any, name: str) -> None:
    if not isinstance(tool_id, str):
        return
    tools = ctx.setdefault("tools", {})
    tools[tool_id] = name
    if len(tools) > 500:  # bounded: ctx is persisted per file
        for k in list(tools)[: len(tools) - 500]:
            del tools[k]


def _tool_meta(name: str, inp: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if not isinstance(inp, dict):
        return meta
    if name == "Skill":
        meta["skill"] = inp.get("skill") or inp.get("command") or inp.get("name")
    elif name in ("Task", "Agent"):
        meta["subagent_type"] = inp.get("subagent_type")
        meta["description"] = inp.get("description")
    elif name == "SlashCommand":
        meta["slash_command"] = inp.get("command")
    elif name == "Bash":
        meta["shell_command"] = inp.get("command")
    elif "file_path" in inp:
        meta["file_path"] = inp.get("file_path")
    return meta


def _handle(obj: dict[str, Any], n: int, ctx: dict[str, Any], res: ImportResult, path: str) -> None:  # noqa: C901 - one branch per record type of the Claude Code log
    rtype = obj.get("type")
    if rtype in _KNOWN_SILENT:
        if rtype == "custom-title" or rtype == "ai-title":
            title = obj.get("customTitle") or obj.get("aiTitle")
            if isinstance(title, str):
                _session(res, ctx, path).title = redact(cut(title, 200))
        return
    s = _session(res, ctx, path)
    time = parse_time(obj.get("timestamp"))
    if time and (s.created_at is None or time < s.created_at):
        s.created_at = time
    cwd = obj.get("cwd")
    if isinstance(cwd, str) and cwd.startswith("/") and not s.cwd:
        s.cwd = cwd
    sidechain = bool(obj.get("isSidechain"))
    base_meta: dict[str, Any] = {}
    if sidechain:
        base_meta["is_sidechain"] = True
    if isinstance(obj.get("agentId"), str) and not obj["agentId"].startswith("["):
        base_meta["agent_id"] = obj["agentId"]
    if isinstance(obj.get("uuid"), str):
        base_meta["uuid"] = obj["uuid"]
    sid = ctx["session"]
    seq0 = n * SEQ_STRIDE

    def emit(i: int, etype: str, text: str, **kw: Any) -> None:
        meta = dict(base_meta)
        meta.update(kw.pop("meta", {}) or {})
        res.events.append(
            Event(
                session_id=sid,
                seq=seq0 + min(i, SEQ_STRIDE - 1),
                event_type=etype,
                text=clean_text(text),
                time=time,
                meta=clean_meta(meta),
                **kw,
            )
        )

    if rtype == "summary":
        emit(0, "summary", str(obj.get("summary") or ""))
        return
    if rtype == "system":
        subtype = str(obj.get("subtype") or "")
        err = subtype == "api_error" or obj.get("level") == "error"
        text = flatten_text(obj.get("content")) or ""
        if err:
            detail = (
                flatten_text(obj.get("error")) if isinstance(obj.get("error"), (dict, str)) else ""
            )
            text = (text + "\n" + detail).strip() or "API error"
        if not text:
            return  # bookkeeping (session_start, turn_duration, hooks ...)
        emit(
            0,
            "system",
            text,
            is_error=err,
            signal="failure" if subtype == "api_error" else None,
            meta={"subtype": subtype},
        )
        return
    if rtype not in ("user", "assistant"):
        res.problems.append(Problem("unknown", path, n, f"record type {str(rtype)[:40]}"))
        return
    msg = obj.get("message")
    if not isinstance(msg, dict):
        raise TypeError("message is not an object")
    content = msg.get("content")
    blocks: list[Any]
    if rtype == "assistant":
        model = msg.get("model")
        if (
            isinstance(model, str)
            and model
            and not model.startswith("<")
            and not model.startswith("[")
        ):
            s.model = model
        api_err = bool(obj.get("isApiErrorMessage"))
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        for i, b in enumerate(blocks):
            if not isinstance(b, dict):
                continue
            bt = b.get("type")
            if bt == "text":
                text = b.get("text") or ""
                if text.strip():
                    emit(
                        i,
                        "assistant/message",
                        text,
                        is_error=api_err,
                        signal="failure" if api_err else None,
                    )
            elif bt == "thinking":
                text = b.get("thinking") or ""
                if text.strip():
                    emit(i, "reasoning", text)
            elif bt == "tool_use":
                name = str(b.get("name") or "unknown")
                _remember_tool(ctx, b.get("id"), name)
                inp = b.get("input")
                emit(
                    i,
                    f"tool_use/{name}",
                    f"{name} {compact_json(inp)}",
                    tool_name=name,
                    meta=_tool_meta(name, inp),
                )
        return
    # user record: prompt text, slash command, or tool results
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = content
    else:
        raise TypeError("message.content has no usable shape")
    texts: list[str] = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict):
            continue
        bt = b.get("type")
        if bt == "text":
            texts.append(str(b.get("text") or ""))
        elif bt == "tool_result":
            tool = ctx.get("tools", {}).get(b.get("tool_use_id"))
            is_err = bool(b.get("is_error"))
            text = flatten_text(b.get("content"))
            if not text:
                tur = obj.get("toolUseResult")
                text = flatten_text(tur) if tur is not None else ""
            emit(
                i,
                "tool_result",
                text,
                is_error=is_err,
                tool_name=tool,
                meta={"tool_use_id": b.get("tool_use_id")},
            )
    joined = "\n".join(t for t in texts if t.strip())
    if joined.strip():
        meta: dict[str, Any] = {}
        m = _COMMAND.search(joined)
        etype = "user/message"
        if m:
            meta["slash_command"] = m.group(1)
            a = _COMMAND_ARGS.search(joined)
            if a and a.group(1).strip():
                meta["command_args"] = a.group(1).strip()
        if obj.get("isCompactSummary"):
            etype = "summary"
        elif obj.get("isMeta"):
            meta["is_meta"] = True
        emit(0 if not blocks else len(blocks), etype, joined, meta=meta)
