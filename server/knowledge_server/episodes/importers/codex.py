"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Handles the ``{timestamp, type, payload}`` envelope and legacy un-enveloped lines (the
payload is the line itself). One file is one session: the first ``session_meta`` id
names it; later ``session_meta`` lines of resumed or forked files are recorded in the
event meta (and ``forked_from_id``) but do not split the file. ``seq`` = line * 1000.

``event_msg`` user/agent messages repeat the ``response_item`` messages in newer
versions; a message whose (role, text) matches one of the last few messages is skipped.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..model import SEQ_STRIDE, Event, Problem, SessionMeta, recent_digests
from .base import (
    ImportResult,
    clean_meta,
    clean_text,
    compact_json,
    dict_at,
    ensure_session,
    flatten_text,
    loads,
    parse_time,
    read_jsonl,
    str_at,
)

HARNESS = "codex"

_EXIT = re.compile(r"(?:Exit code|exit_code|\"exit_code\")\s*[:=]?\s*(-?\d+)", re.IGNORECASE)

_SILENT_EVENTS = frozenset(
    [
        "token_count",
        "task_started",
        "thread_settings_applied",
        "world_state",
        "agent_reasoning_delta",
        "agent_message_delta",
        "sub_agent_activity",
        "thread_goal_updated",
        "item_completed",
        "thread_name_updated",
        "guardian_assessment",
        "account/rateLimits/updated",
        "exec_command_begin",
        "patch_apply_begin",
        "mcp_tool_call_begin",
        "web_search_begin",
        "turn_diff",
        "session_configured",
    ]
)
_SILENT_RECORDS = frozenset(["world_state", "inter_agent_communication_metadata", "state"])


def _real(v: Any) -> bool:
    return isinstance(v, str) and bool(v) and not v.startswith("[")


def import_file(
    path: str,
    offset: int = 0,
    line: int = 0,
    pending_newline: bool = False,
    ctx: dict[str, Any] | None = None,
) -> ImportResult:
    if not ctx:
        stem = os.path.splitext(os.path.basename(path))[0]
        ctx = {"session": None, "stem": stem, "calls": {}, "recent": []}
    else:
        ctx = {**ctx, "recent": recent_digests(ctx.get("recent") or [])}
    return read_jsonl(
        path, _handle, offset=offset, line=line, pending_newline=pending_newline, ctx=ctx
    )


def _sess(res: ImportResult, ctx: dict[str, Any], path: str) -> SessionMeta:
    if not ctx.get("session"):
        ctx["session"] = ctx.get("stem") or "codex"
    return ensure_session(res, ctx["session"], HARNESS, path)


def _dup(ctx: dict[str, Any], role: str, text: str, source: str) -> bool:
    """True when this message copies one of the other kind among the last 8: a
    ``response_item`` (``source`` "item") and its ``event_msg`` copy ("event"), in either
    order. Two messages of one kind are two turns (a prompt asked again; a legacy file has
    no ``event_msg`` copies), never duplicates."""
    # Digests, not the text: the context is stored with the file's state, and the text
    # is not redacted yet. A context stored before kept untagged keys (either kind); a
    # repeat of one is still found.
    body = role + "\x00" + text.strip()[:2000]
    other = "event" if source == "item" else "item"
    mine, theirs, untagged = recent_digests([f"{source}\x00{body}", f"{other}\x00{body}", body])
    recent: list[str] = ctx.setdefault("recent", [])
    for key in (theirs, untagged):
        if key in recent:
            recent.remove(key)
            return True
    recent.append(mine)
    del recent[:-8]
    return False


def _output_error(payload: dict[str, Any], text: str) -> bool:
    out = payload.get("output")
    if isinstance(out, dict):
        md = out.get("metadata")
        if isinstance(md, dict) and isinstance(code := md.get("exit_code"), int):
            return code != 0
        if out.get("success") is False:
            return True
    if isinstance(out, str) and out.startswith("{"):
        try:
            j = loads(out)
            md = j.get("metadata") if isinstance(j, dict) else None
            if isinstance(md, dict) and isinstance(code := md.get("exit_code"), int):
                return code != 0
        except ValueError:
            pass
    m = _EXIT.search(text[:400])
    return bool(m and m.group(1) != "0")


def _handle(obj: dict[str, Any], n: int, ctx: dict[str, Any], res: ImportResult, path: str) -> None:  # noqa: C901 - one branch per record and item type of the Codex rollout log, current and legacy layouts
    if (
        "payload" in obj
        and isinstance(obj.get("payload"), dict)
        and isinstance(obj.get("type"), str)
    ):
        rtype = obj["type"]
        p: dict[str, Any] = obj["payload"]
        time = parse_time(obj.get("timestamp")) or parse_time(p.get("timestamp"))
    else:
        # Legacy line: the item itself. The first line is {id, timestamp, instructions}.
        p = obj
        time = parse_time(obj.get("timestamp") or obj.get("created_at"))
        if "record_type" in obj:
            return
        if "id" in obj and "instructions" in obj and "type" not in obj:
            rtype = "session_meta"
        elif "role" in obj and "type" not in obj:
            rtype, p = "response_item", {"type": "message", **obj}
        else:
            rtype = "response_item"
    seq0 = n * SEQ_STRIDE

    if rtype == "session_meta":
        sid = p.get("id") or p.get("session_id")
        if not ctx.get("session") and _real(sid):
            ctx["session"] = sid
        s = _sess(res, ctx, path)
        if ctx["session"] == sid or not ctx.get("meta_seen"):
            ctx["meta_seen"] = True
            if _real(p.get("cwd")) and not s.cwd:
                s.cwd = p["cwd"]
            t = parse_time(p.get("timestamp")) or time
            if t and (s.created_at is None or t < s.created_at):
                s.created_at = t
            if _real(p.get("forked_from_id")):
                s.forked_from_id = p["forked_from_id"]
            src = p.get("source")
            if isinstance(src, dict):
                sub = src.get("subagent")
                spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
                if isinstance(spawn, dict):
                    if _real(spawn.get("parent_thread_id")):
                        s.parent_session_id = spawn["parent_thread_id"]
                    if isinstance(spawn.get("depth"), int):
                        s.spawn_depth = spawn["depth"]
                    s.is_sidechain = True
                    s.agent_preset = (
                        spawn.get("agent_role")
                        if _real(spawn.get("agent_role"))
                        else s.agent_preset
                    )
            if (
                _real(p.get("parent_thread_id"))
                and not s.parent_session_id
                and ctx["session"] == sid
            ):
                s.parent_session_id = p["parent_thread_id"]
        else:
            # A resumed/forked file embeds the history of another session; note it.
            meta = {
                "embedded_session": sid if _real(sid) else None,
                "forked_from_id": p.get("forked_from_id")
                if _real(p.get("forked_from_id"))
                else None,
            }
            if _real(p.get("forked_from_id")) and not s.forked_from_id:
                s.forked_from_id = p["forked_from_id"]
            ctx["embedded"] = meta.get("embedded_session")
        return
    s = _sess(res, ctx, path)
    sid = ctx["session"]
    if time and (s.created_at is None or time < s.created_at):
        s.created_at = time

    def emit(etype: str, text: str, **kw: Any) -> None:
        meta = kw.pop("meta", {}) or {}
        if ctx.get("embedded"):
            meta["embedded_session"] = ctx["embedded"]
        res.events.append(
            Event(
                session_id=sid,
                seq=seq0,
                event_type=etype,
                text=clean_text(text),
                time=time,
                meta=clean_meta(meta),
                **kw,
            )
        )

    if rtype == "turn_context":
        if _real(p.get("model")):
            s.model = p["model"]
        if _real(p.get("cwd")) and not s.cwd:
            s.cwd = p["cwd"]
        return
    if rtype in _SILENT_RECORDS:
        return
    if rtype == "compacted":
        text = str_at(p, "message") or ""
        if text and text.strip():
            emit("summary", text)
        return
    ptype = p.get("type")
    if rtype == "response_item":
        if ptype == "message" or (ptype is None and "role" in p):
            role = str(p.get("role") or "")
            text = flatten_text(p.get("content")) or (str_at(p, "message") or "")
            if not text.strip():
                return
            if role in ("developer", "system") or text.lstrip().startswith(
                ("<environment_context>", "<user_instructions>", "<permissions", "# AGENTS.md")
            ):
                emit("system", text)
                return
            if _real(p.get("model")) and not s.model:
                s.model = p["model"]
            etype = "assistant/message" if role == "assistant" else "user/message"
            if not _dup(ctx, etype, text, "item"):
                emit(etype, text)
            return
        if ptype == "reasoning":
            text = flatten_text(p.get("summary")) + "\n" + flatten_text(p.get("content"))
            text = text.strip()
            if text:
                emit("reasoning", text)
            return
        if ptype in ("function_call", "custom_tool_call", "tool_call", "local_shell_call"):
            fn = p.get("function")
            name = p.get("name") or (fn.get("name") if isinstance(fn, dict) else None) or ptype
            name = str(name)
            args = p.get("arguments", p.get("input", p.get("action")))
            calls = ctx.setdefault("calls", {})
            if isinstance(p.get("call_id"), str):
                calls[p["call_id"]] = name
                if len(calls) > 500:
                    for k in list(calls)[:-500]:
                        del calls[k]
            meta = {"call_id": p.get("call_id")}
            if p.get("summary"):
                meta["summary"] = p.get("summary")
            emit(f"tool_use/{name}", f"{name} {compact_json(args)}", tool_name=name, meta=meta)
            return
        if ptype in (
            "function_call_output",
            "custom_tool_call_output",
            "tool_result",
            "function_result",
        ):
            name = ctx.get("calls", {}).get(p.get("call_id")) or p.get("name")
            out = p.get("output", p.get("result"))
            text = flatten_text(out) if not isinstance(out, str) else out
            if isinstance(out, dict) and not text:
                text = compact_json(out)
            err = _output_error(p, text)
            if isinstance(out, dict) and isinstance(out.get("exitCode"), int):
                err = out["exitCode"] != 0
            emit(
                "tool_result",
                text,
                is_error=err,
                tool_name=name,
                meta={"call_id": p.get("call_id")},
            )
            return
        if ptype == "web_search_call":
            action = dict_at(p, "action")
            emit(
                "tool_use/web_search",
                "web_search " + str(action.get("query") or ""),
                tool_name="web_search",
            )
            return
        if ptype in ("tool_search_call", "image_generation_call"):
            emit(
                f"tool_use/{ptype.removesuffix('_call')}",
                f"{ptype} {compact_json(p.get('arguments') or p.get('revised_prompt') or '')}",
                tool_name=ptype.removesuffix("_call"),
            )
            return
        if ptype in ("tool_search_output", "ghost_snapshot", "agent_message"):
            if ptype == "agent_message":
                text = flatten_text(p.get("content"))
                if text.strip():
                    emit("system", text, meta={"inter_agent": True})
            return
        res.problems.append(Problem("unknown", path, n, f"response_item {str(ptype)[:40]}"))
        return
    if rtype == "event_msg":
        if ptype in _SILENT_EVENTS:
            if ptype == "thread_settings_applied":
                ts = p.get("thread_settings")
                if isinstance(ts, dict) and _real(ts.get("model")):
                    s.model = ts["model"]
            return
        if ptype in ("user_message", "agent_message"):
            text = str_at(p, "message") or ""
            etype = "user/message" if ptype == "user_message" else "assistant/message"
            if text.strip() and not _dup(ctx, etype, text, "event"):
                emit(etype, text)
            return
        if ptype == "agent_reasoning":
            text = str_at(p, "text") or ""
            if text.strip() and not _dup(ctx, "reasoning", text, "event"):
                emit("reasoning", text)
            return
        if ptype in ("task_complete", "turn.completed"):
            error = p.get("error")
            failed = isinstance(error, dict) or (isinstance(error, str) and bool(error))
            text = "task complete"
            if isinstance(p.get("last_agent_message"), str):
                text += ": " + p["last_agent_message"]
            if failed:
                text += "\n" + flatten_text(error)
            emit(
                "system",
                text,
                is_error=failed,
                signal="failure" if failed else "success",
                meta={"kind": "task_complete"},
            )
            return
        if ptype == "turn_aborted":
            emit(
                "system",
                "turn aborted: " + str(p.get("reason") or ""),
                is_error=True,
                signal="failure",
                meta={"kind": "turn_aborted"},
            )
            return
        if ptype in ("error", "stream_error"):
            error = p.get("error")
            text = flatten_text(error) or p.get("message") or "error"
            if isinstance(error, dict) and error.get("kind"):
                text = f"{error.get('kind')}: {text}"
            emit(
                "system",
                "error: " + str(text),
                is_error=True,
                signal="failure",
                meta={"kind": "error"},
            )
            return
        if ptype == "context_compacted":
            emit("system", "context compacted", meta={"kind": "context_compacted"})
            return
        if ptype == "exec_command_end":
            code = p.get("exit_code")
            cmd = p.get("command")
            cmd_s = " ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd or "")
            out = p.get("aggregated_output") or p.get("formatted_output") or p.get("stdout") or ""
            err = isinstance(code, int) and code != 0
            emit(
                "tool_result",
                f"$ {cmd_s}\n{flatten_text(out)}",
                is_error=err,
                tool_name="exec_command",
                meta={"exit_code": code if isinstance(code, int) else None},
            )
            return
        if ptype == "patch_apply_end":
            ok = p.get("success")
            changes = p.get("changes")
            files = " ".join(changes) if isinstance(changes, dict) else ""
            emit(
                "tool_result",
                f"apply_patch {files}\n{flatten_text(p.get('stderr'))}",
                is_error=ok is False,
                tool_name="apply_patch",
            )
            return
        if ptype == "mcp_tool_call_end":
            inv = dict_at(p, "invocation")
            name = f"mcp:{inv.get('server')}/{inv.get('tool')}"
            result = p.get("result")
            err = isinstance(result, dict) and (
                "Err" in result
                or (isinstance(result.get("Ok"), dict) and bool(result["Ok"].get("isError")))
            )
            emit(
                f"tool_use/{name}",
                f"{name} {compact_json(inv.get('arguments'))}\n{flatten_text(result)}",
                is_error=err,
                tool_name=name,
            )
            return
        if ptype in (
            "collab_agent_spawn_end",
            "collab_close_end",
            "collab_waiting_end",
            "collab_agent_interaction_end",
        ):
            meta = {
                "kind": ptype,
                "new_thread_id": p.get("new_thread_id"),
                "agent_role": p.get("new_agent_role"),
                "agent_nickname": p.get("new_agent_nickname"),
            }
            emit("system", f"{ptype} {flatten_text(p.get('prompt'))}".strip(), meta=meta)
            return
        if ptype in (
            "web_search_end",
            "view_image_tool_call",
            "dynamic_tool_call_request",
            "dynamic_tool_call_response",
            "image_generation_end",
            "entered_review_mode",
            "exited_review_mode",
            "undo_completed",
        ):
            text = flatten_text(p) or compact_json(
                {k: v for k, v in p.items() if k != "type"}, 1000
            )
            emit("system", f"{ptype} {text}", meta={"kind": ptype})
            return
        res.problems.append(Problem("unknown", path, n, f"event_msg {str(ptype)[:40]}"))
        return
    res.problems.append(Problem("unknown", path, n, f"record type {str(rtype)[:40]}"))
