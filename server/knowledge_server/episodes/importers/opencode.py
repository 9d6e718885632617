"""OpenCode file storage (``~/.local/share/opencode/storage``).

Layout: ``session/<projectID>/ses_*.json``, ``message/<sessionID>/msg_*.json``,
``part/<messageID>/*.json``. The unit of ingestion is one session file; its change
fingerprint covers the session, message and part files, and a change re-imports the
whole session. Messages are ordered by ``time.created`` then id, parts by file name;
``seq`` = message ordinal * 1000 + part ordinal * 2 (+1 for a tool's result), which is
stable as long as OpenCode only appends messages.
"""

from __future__ import annotations

import os
import re
from typing import Any

from knowledge_server.workspaces import is_under

from ..model import SEQ_STRIDE, Event, Problem, SessionMeta
from .base import (
    ImportResult,
    clean_meta,
    clean_text,
    compact_json,
    dict_at,
    flatten_text,
    load_file,
    parse_time,
    str_at,
)

HARNESS = "opencode"


# A session or message id names a folder (``message/<session id>``, ``part/<message id>``),
# and it is read from file content: only a plain name may become a path component, never
# one with a separator, ``..`` or a NUL that would lead the reader out of the storage.
_PLAIN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


def plain_id(value: Any) -> str | None:
    """``value`` as an id usable as one folder name, or None when it is not one."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return text if _PLAIN_ID.fullmatch(text) and ".." not in text else None


def _message_id(message: Any, message_file: str) -> str | None:
    """A message's id (its folder of parts): the one it states, else its file's name."""
    stated = message.get("id") if isinstance(message, dict) else None
    return plain_id(stated) if stated else plain_id(os.path.basename(message_file)[:-5])


def storage_root(session_file: str) -> str:
    # <root>/session/<project>/ses_x.json
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(session_file))))


def _load(path: str, res: ImportResult) -> dict[str, Any] | None:
    try:
        obj = load_file(path)
    except (OSError, ValueError):
        res.problems.append(Problem("malformed", path, 1, "invalid JSON"))
        return None
    if not isinstance(obj, dict):
        res.problems.append(Problem("malformed", path, 1, "not an object"))
        return None
    return obj


def _json_files(folder: str, root: str) -> list[str]:
    """The JSON files of ``folder`` whose real path stays in the storage ``root``: a linked
    message or part folder (or file) leading elsewhere, such as into another tenant's
    storage, is not read."""
    real_root = os.path.realpath(root)
    try:
        names = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
    except OSError:
        return []
    paths = [os.path.join(folder, f) for f in names]
    # Regular files only: opening a FIFO named like a message would block the ingest.
    return [p for p in paths if is_under(os.path.realpath(p), real_root) and os.path.isfile(p)]


def related_files(session_file: str, session_id: str | None = None) -> list[str]:
    """Every file whose change should re-import this session."""
    root = storage_root(session_file)
    if session_id is None:
        session_id = os.path.basename(session_file)[:-5].removeprefix("ses_")
        try:
            session_id = load_file(session_file).get("id") or session_id
        except (OSError, ValueError, AttributeError):
            pass
    files = [session_file]
    sid = plain_id(session_id)
    if sid is None:
        return files
    msgs = _json_files(os.path.join(root, "message", sid), root)
    files.extend(msgs)
    for m in msgs:
        message: Any = None
        try:
            message = load_file(m)
        except (OSError, ValueError):
            pass
        mid = _message_id(message, m)
        if mid is not None:
            files.extend(_json_files(os.path.join(root, "part", mid), root))
    return files


def fingerprint(session_file: str) -> tuple[int, float]:
    size, mtime = 0, 0.0
    for f in related_files(session_file):
        try:
            st = os.stat(f)
        except OSError:
            continue
        size += st.st_size
        mtime = max(mtime, st.st_mtime)
    return size, mtime


def import_file(path: str) -> ImportResult:  # noqa: C901 - one branch per message part type of the opencode session store
    res = ImportResult()
    ses = _load(path, res)
    if ses is None:
        return res
    sid = plain_id(ses.get("id") or os.path.basename(path)[:-5])
    if sid is None:
        res.problems.append(Problem("malformed", path, 1, "session id is not a plain name"))
        return res
    t = dict_at(ses, "time")
    meta = SessionMeta(
        session_id=sid,
        harness=HARNESS,
        source_path=path,
        cwd=str_at(ses, "directory"),
        created_at=parse_time(t.get("created")),
        title=clean_text(str(ses.get("title"))[:200]) if ses.get("title") else None,
        parent_session_id=str_at(ses, "parentID"),
    )
    if meta.parent_session_id:
        meta.is_sidechain = True
    res.sessions[sid] = meta
    root = storage_root(path)
    messages = []
    for mf in _json_files(os.path.join(root, "message", sid), root):
        m = _load(mf, res)
        if m is not None:
            mt = dict_at(m, "time")
            created = mt.get("created") if isinstance(mt.get("created"), (int, float)) else 0
            mid = _message_id(m, mf)
            if mid is None:
                res.problems.append(Problem("malformed", mf, 1, "message id is not a plain name"))
                continue
            messages.append((created, mid, m, mf))
    messages.sort(key=lambda x: (x[0], x[1]))
    for mi, (_, mid, m, _mf) in enumerate(messages, start=1):
        role = str(m.get("role") or "")
        model = m.get("modelID")
        if not isinstance(model, str) and isinstance(m.get("model"), dict):
            model = m["model"].get("modelID")
        if isinstance(model, str) and model:
            meta.model = model
        if isinstance(m.get("agent"), str) and role == "user" and not meta.agent_preset:
            meta.agent_preset = m["agent"]
        mtime = (
            parse_time((m.get("time") or {}).get("created"))
            if isinstance(m.get("time"), dict)
            else None
        )
        base = mi * SEQ_STRIDE
        parts = []
        for pf in _json_files(os.path.join(root, "part", mid), root):
            p = _load(pf, res)
            if p is not None:
                parts.append(p)
        any_text = False
        for pi, p in enumerate(parts):
            ptype = p.get("type")
            ptime = (
                parse_time((p.get("time") or {}).get("start"))
                if isinstance(p.get("time"), dict)
                else None
            )
            ptime = ptime or mtime
            seq = base + pi * 2
            if ptype == "text":
                text = str(p.get("text") or "")
                if text.strip():
                    any_text = True
                    etype = "user/message" if role == "user" else "assistant/message"
                    res.events.append(
                        Event(
                            sid,
                            seq,
                            etype,
                            clean_text(text),
                            ptime,
                            meta=clean_meta({"synthetic": p.get("synthetic")}),
                        )
                    )
            elif ptype == "reasoning":
                text = str(p.get("text") or "")
                if text.strip():
                    res.events.append(Event(sid, seq, "reasoning", clean_text(text), ptime))
            elif ptype == "tool":
                tool = str(p.get("tool") or "tool")
                st = dict_at(p, "state")
                res.events.append(
                    Event(
                        sid,
                        seq,
                        f"tool_use/{tool}",
                        clean_text(f"{tool} {compact_json(st.get('input'))}"),
                        ptime,
                        tool_name=tool,
                        meta=clean_meta({"call_id": p.get("callID")}),
                    )
                )
                md = dict_at(st, "metadata")
                exit_code = md.get("exit")
                err = st.get("status") == "error" or (isinstance(exit_code, int) and exit_code != 0)
                out = flatten_text(st.get("output")) or flatten_text(st.get("error"))
                if out or err:
                    res.events.append(
                        Event(
                            sid,
                            seq + 1,
                            "tool_result",
                            clean_text(out),
                            ptime,
                            is_error=err,
                            tool_name=tool,
                            meta=clean_meta({"exit_code": exit_code}),
                        )
                    )
            elif ptype == "patch":
                files = given if isinstance(given := p.get("files"), list) else []
                res.events.append(
                    Event(
                        sid,
                        seq,
                        "system",
                        clean_text("patch " + " ".join(map(str, files))),
                        ptime,
                        meta={"kind": "patch"},
                    )
                )
            elif ptype in (
                "file",
                "step-start",
                "step-finish",
                "compaction",
                "snapshot",
                "agent",
                "subtask",
            ):
                continue
            else:
                res.problems.append(
                    Problem(
                        "unknown",
                        os.path.join(root, "part", mid),
                        pi + 1,
                        f"part type {str(ptype)[:40]}",
                    )
                )
        if not any_text and role == "user":
            summ = dict_at(m, "summary")
            body = summ.get("body") or summ.get("title")
            if isinstance(body, str) and body.strip():
                res.events.append(
                    Event(sid, base + SEQ_STRIDE - 2, "user/message", clean_text(body), mtime)
                )
        err = m.get("error")
        if isinstance(err, dict):
            text = f"{err.get('name') or 'error'}: {flatten_text(err.get('data'))}"
            res.events.append(
                Event(
                    sid,
                    base + SEQ_STRIDE - 1,
                    "system",
                    clean_text(text),
                    mtime,
                    is_error=True,
                    signal="failure",
                    meta={"kind": "message_error"},
                )
            )
        elif role == "assistant" and m.get("finish") in ("stop", "end_turn"):
            pass
    try:
        res.end_offset = os.path.getsize(path)
    except OSError:
        pass
    return res
