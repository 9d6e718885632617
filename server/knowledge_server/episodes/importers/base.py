"""Shared importer machinery: the result type, line reading, time parsing, text helpers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...redact import redact
from ...regular import read_regular
from ..model import Event, Problem, SessionMeta

MAX_TEXT = 20_000  # characters kept per event; tool outputs can be megabytes
# Largest side file read whole (an OpenCode session or message file, a subagent's
# metadata): these are small JSON objects; a larger one is not read.
MAX_SIDE_FILE_BYTES = 4 * 1024 * 1024
# Longest JSONL line read (bytes, newline excluded). A longer line is skipped and reported
# as an ``oversized`` problem naming the file and line; the rest of the file is read.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Bytes a format probe may read from the start of a file (whole lines, so a first record
# of a few megabytes is still recognised).
HEAD_SCAN_BYTES = 2 * MAX_LINE_BYTES


# A ``\uXXXX`` escape of a UTF-16 surrogate: JSON allows a lone one (JavaScript writes
# it for a string cut inside an emoji), and it decodes to a character no UTF-8 text holds.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _map_strings(value: Any, fn: Callable[[str], str], *, keys: bool = False) -> Any:
    """``value`` (a JSON value) with ``fn`` applied to each string in it (``keys``: the
    objects' keys too)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {(fn(k) if keys else k): _map_strings(v, fn, keys=keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn, keys=keys) for v in value]
    return value


def _without_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    return _map_strings(value, lambda text: _SURROGATE.sub("\ufffd", text), keys=True)


def loads(data: str | bytes) -> Any:
    """``json.loads``, with a document nested too deeply to parse refused as ValueError as
    any other invalid JSON (the parser raises RecursionError at about a thousand levels:
    one such line in a log stopped the whole ingest), and lone surrogates replaced by
    U+FFFD (one made the store refuse the whole file)."""
    try:
        value = json.loads(data)
        escaped = (
            _SURROGATE_ESCAPE_BYTES.search(data)
            if isinstance(data, bytes)
            else _SURROGATE_ESCAPE.search(data)
        )
        return _without_surrogates(value) if escaped else value
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def load_file(path: str) -> Any:
    """The JSON of a small side file (``MAX_SIDE_FILE_BYTES``), a regular file only
    (``regular.read_regular``): OSError or ValueError otherwise."""
    return loads(read_regular(path, MAX_SIDE_FILE_BYTES))


@dataclass(slots=True)
class ImportResult:
    events: list[Event] = field(default_factory=list)
    sessions: dict[str, SessionMeta] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    end_offset: int = 0
    end_line: int = 0
    # True when the last consumed line had no trailing newline (see read_jsonl).
    pending_newline: bool = False
    ctx: dict[str, Any] = field(default_factory=dict)
    lines_read: int = 0


def parse_time(value: Any) -> datetime | None:
    """ISO-8601 string or epoch seconds/milliseconds -> aware UTC datetime (None if unusable)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            v = float(value)
            if v > 1e11:  # milliseconds
                v /= 1000.0
            return datetime.fromtimestamp(v, tz=UTC)
        if isinstance(value, str):
            s = value.strip()
            if not s or not s[0].isdigit():
                return None
            if s.endswith("Z"):
                s = s[:-1] + "+00:00"
            dt = datetime.fromisoformat(s)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=UTC)
            return dt.astimezone(UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


# Text past a cut that is still read for secrets: a secret the cut goes through is found
# whole (a cut one no longer matches its rule, and its first part would be stored). Longer
# than any secret the rules know but a private key, whose rule runs to the end of the text.
REDACT_MARGIN = 4096


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters; when it is cut, redacted first (with
    REDACT_MARGIN more), so the cut never leaves part of a secret behind."""
    if len(text) <= limit:
        return text
    return redact(text[: limit + REDACT_MARGIN])[:limit]


def clean_text(text: str) -> str:
    """Cap and redact a text before it can reach the store."""
    return cut(text, MAX_TEXT) if len(text) > MAX_TEXT else redact(text)


def dict_at(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` if it is a JSON object, else an empty one (a log's fields are read as
    they come, whatever their type)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def str_at(obj: Mapping[str, Any], key: str) -> str | None:
    """``obj[key]`` if it is a string, else None."""
    value = obj.get(key)
    return value if isinstance(value, str) else None


def clean_meta(meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if v is None:
            continue
        if isinstance(v, str):
            out[k] = redact(cut(v, 500))
        elif isinstance(v, (int, float, bool)):
            out[k] = v
        else:
            try:
                v = redacted_strings(v)
            except RecursionError:
                pass  # nested past Python's stack: the dumped text is still redacted below
            out[k] = redact(cut(json.dumps(v, ensure_ascii=False), 500))
    return out


def redacted_strings(value: Any) -> Any:
    """``value`` (a JSON value) with each string in it redacted. Dumped as JSON, a string's
    quotes are escaped (``export PASSWORD=\\"...\\"``), which the rules do not read as
    quotes: the strings are redacted before they are dumped, and the dumped text again for
    what only its structure shows (``"password": "..."``)."""
    return _map_strings(value, redact)


def compact_json(value: Any, limit: int = 4000) -> str:
    """A tool's input as one line of JSON, its strings redacted (``redacted_strings``). A
    string that holds a JSON object or array (Codex's ``arguments``) is read as one."""
    if isinstance(value, str):
        if not value.lstrip().startswith(("{", "[")):
            return cut(value, limit)
        try:
            value = loads(value)
        except ValueError:
            return cut(value, limit)
    try:
        return cut(
            json.dumps(redacted_strings(value), ensure_ascii=False, separators=(",", ":")),
            limit,
        )
    except (TypeError, ValueError, RecursionError):
        return cut(str(value), limit)


def flatten_text(value: Any, limit: int = MAX_TEXT) -> str:
    """Collect human-readable strings from nested content blocks / outputs."""
    parts: list[str] = []
    size = 0

    def walk(v: Any) -> None:
        nonlocal size
        if size > limit:
            return
        if isinstance(v, str):
            parts.append(v)
            size += len(v)
        elif isinstance(v, dict):
            for key in (
                "text",
                "content",
                "output",
                "stdout",
                "stderr",
                "message",
                "result",
                "summary",
            ):
                if key in v:
                    walk(v[key])
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk(value)
    return cut("\n".join(p for p in parts if p), limit)


def head_records(
    path: str, *, max_records: int = 50, max_lines: int = 200
) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects among the first lines of ``path`` and how many lines were too long.

    Lines are read whole up to :data:`MAX_LINE_BYTES` (a longer one is skipped without being
    kept in memory); reading stops after ``max_lines`` lines, ``max_records`` objects or
    :data:`HEAD_SCAN_BYTES` bytes. Raises ``OSError`` when the file cannot be read.
    """
    records: list[dict[str, Any]] = []
    oversized = 0
    used = 0
    with open(path, "rb") as fh:
        for _ in range(max_lines):
            if used >= HEAD_SCAN_BYTES or len(records) >= max_records:
                break
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            used += len(raw)
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                oversized += 1
                while used < HEAD_SCAN_BYTES:  # drain the rest of the line
                    chunk = fh.readline(1 << 20)
                    used += len(chunk)
                    if not chunk or chunk.endswith(b"\n"):
                        break
                continue
            try:
                obj = loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                records.append(obj)
    return records, oversized


LineHandler = Callable[[dict[str, Any], int, dict[str, Any], ImportResult, str], None]


def read_jsonl(
    path: str,
    handler: LineHandler,
    *,
    offset: int = 0,
    line: int = 0,
    pending_newline: bool = False,
    ctx: dict[str, Any] | None = None,
) -> ImportResult:
    """Feed every complete JSON line after ``offset`` to ``handler``.

    ``line`` is the number of physical lines already consumed, so line numbers (and the
    ``seq`` derived from them) do not depend on where reading started. A final line
    without a newline is consumed only when it already parses as JSON (a writer that is
    mid-line almost never leaves valid JSON behind); ``pending_newline`` then tells the
    next read to swallow the newline that completes it without counting a new line. A
    complete line over :data:`MAX_LINE_BYTES` (trailing carriage returns aside) is skipped
    and reported as ``oversized``; an unfinished last line over it is not consumed until its
    writer ends it.
    """
    res = ImportResult(ctx=dict(ctx or {}), end_offset=offset, end_line=line)
    n = line
    pos = offset
    # Line by line, never more than one line of at most MAX_LINE_BYTES in memory: a log
    # holding a line of hundreds of MiB is read in constant memory, the line skipped.
    with open(path, "rb") as fh:
        fh.seek(offset)
        if pending_newline:
            head = fh.read(2)
            pos += 2 if head.startswith(b"\r\n") else 1 if head.startswith(b"\n") else 0
            fh.seek(pos)
            # The newline has not come yet (the file was only touched): still pending.
            res.pending_newline = not head
        while True:
            raw = fh.readline(MAX_LINE_BYTES + 2)
            if not raw:
                break
            consumed = len(raw)  # bytes of the file this line takes, its newline included
            complete = raw.endswith(b"\n")
            body = raw[:-1] if complete else raw
            size = len(body)  # the line's bytes, newline excluded
            content = len(body.rstrip(b"\r"))  # and trailing carriage returns too
            if not complete and len(raw) == MAX_LINE_BYTES + 2:
                # Longer than a line that is kept: the rest is read in pieces and let go.
                tail = raw[-64:]
                while True:
                    more = fh.readline(1 << 20)
                    if not more:
                        break
                    consumed += len(more)
                    complete = more.endswith(b"\n")
                    piece = more[:-1] if complete else more
                    size += len(piece)
                    tail = (tail + piece)[-64:]
                    if complete:
                        break
                content = size - (len(tail) - len(tail.rstrip(b"\r")))
            if content > MAX_LINE_BYTES:
                if not complete:  # an unfinished line at the end: not consumed yet
                    res.problems.append(
                        Problem("malformed", path, n + 1, "incomplete last line (not consumed)")
                    )
                    break
                n += 1
                pos += consumed
                res.lines_read += 1
                res.problems.append(
                    Problem(
                        "oversized",
                        path,
                        n,
                        f"line of {size} bytes over the {MAX_LINE_BYTES >> 20} MiB limit (skipped)",
                    )
                )
                continue
            # Within the limit: whatever is past the first MAX_LINE_BYTES + 2 bytes (if the
            # line was read in pieces) is carriage returns, which strip() drops anyway.
            stripped = body.strip()
            if not complete:
                if not stripped:
                    break
                try:
                    obj = loads(stripped)
                except ValueError:
                    # Partial line: not consumed until the writer finishes it (reported, so a
                    # file that really ends in garbage is visible).
                    res.problems.append(
                        Problem("malformed", path, n + 1, "incomplete last line (not consumed)")
                    )
                    break
                n += 1
                res.lines_read += 1
                _dispatch(obj, n, handler, res, path)
                pos += consumed
                res.pending_newline = True
                break
            n += 1
            pos += consumed
            if not stripped:
                continue
            res.lines_read += 1
            try:
                obj = loads(stripped)
            except ValueError:
                res.problems.append(Problem("malformed", path, n, "invalid JSON"))
                continue
            _dispatch(obj, n, handler, res, path)
    res.end_offset = pos
    res.end_line = n
    return res


def _dispatch(obj: Any, n: int, handler: LineHandler, res: ImportResult, path: str) -> None:
    if not isinstance(obj, dict):
        res.problems.append(Problem("malformed", path, n, f"not an object ({type(obj).__name__})"))
        return
    try:
        handler(obj, n, res.ctx, res, path)
    except Exception as exc:  # noqa: BLE001 - one odd record must never stop a file
        res.problems.append(
            Problem("malformed", path, n, f"unusable record ({type(exc).__name__})")
        )


def add_session(res: ImportResult, meta: SessionMeta) -> SessionMeta:
    """Register (or fetch) the session entry for this import chunk."""
    cur = res.sessions.get(meta.session_id)
    if cur is None:
        res.sessions[meta.session_id] = meta
        return meta
    return cur


def ensure_session(res: ImportResult, session_id: str, harness: str, path: str) -> SessionMeta:
    cur = res.sessions.get(session_id)
    if cur is None:
        cur = SessionMeta(session_id=session_id, harness=harness, source_path=path)
        res.sessions[session_id] = cur
    return cur
