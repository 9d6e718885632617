"""The UTF-8 size of a message's JSON text, without building the text.

Budgets count the response as ``json.dumps(MessageToDict(msg, preserving_proto_field_name=True),
ensure_ascii=False, separators=(",", ":"))`` (see ``docs/search.md``). Building that
text is generic, slow Python in ``json_format``; a search measures its response
several times while it fits the budget. :func:`json_size` computes the same byte
count from the fields directly. Field kinds it does not model (bytes, float32,
well-known types other than Timestamp) make it fall back to the real serialiser,
so it is exact for every message; ``tests/test_jsonsize.py`` holds it to that.
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["json_size", "json_size_of_string", "json_text"]

_FD = FieldDescriptor
_QUOTED_INTS = frozenset(
    {_FD.TYPE_INT64, _FD.TYPE_UINT64, _FD.TYPE_SINT64, _FD.TYPE_FIXED64, _FD.TYPE_SFIXED64}
)
_PLAIN_INTS = frozenset(
    {_FD.TYPE_INT32, _FD.TYPE_UINT32, _FD.TYPE_SINT32, _FD.TYPE_FIXED32, _FD.TYPE_SFIXED32}
)
_TIMESTAMP = "google.protobuf.Timestamp"


class _Unmodelled(Exception):
    """A field kind this module does not size; the caller serialises for real."""


def json_text(msg: Message) -> str:
    """The JSON text that budgets count."""
    return json.dumps(
        json_format.MessageToDict(msg, preserving_proto_field_name=True),
        ensure_ascii=False,
        separators=(",", ":"),
    )


def json_size(msg: Message) -> int:
    """``len(json_text(msg).encode("utf-8"))``, computed without building the text."""
    try:
        return _message(msg)
    except _Unmodelled:
        return len(json_text(msg).encode("utf-8"))


def json_size_of_string(s: str) -> int:
    """Bytes of ``s`` as a JSON string literal (quotes and escapes included)."""
    return _string(s)


def _string(s: str) -> int:
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return len(s) + 2
    return len(json.dumps(s, ensure_ascii=False).encode("utf-8"))


# Per field: (bytes of '"name":', kind, repeated, map value field or None).
_STRING, _MESSAGE, _BOOL, _INT, _QUOTED, _DOUBLE, _ENUM, _MAP = range(8)
_plans: dict[Any, tuple[int, int, bool, Any]] = {}


def _plan(field: FieldDescriptor) -> tuple[int, int, bool, Any]:
    plan = _plans.get(field)
    if plan is not None:
        return plan
    t = field.type
    value_field = None
    if t == _FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        kind = _MAP
        value_field = field.message_type.fields_by_name["value"]
        if field.message_type.fields_by_name["key"].type == _FD.TYPE_BOOL:
            raise _Unmodelled(field.full_name)
    elif t == _FD.TYPE_STRING:
        kind = _STRING
    elif t == _FD.TYPE_MESSAGE:
        kind = _MESSAGE
    elif t == _FD.TYPE_BOOL:
        kind = _BOOL
    elif t in _PLAIN_INTS:
        kind = _INT
    elif t in _QUOTED_INTS:
        kind = _QUOTED
    elif t == _FD.TYPE_DOUBLE:
        kind = _DOUBLE
    elif t == _FD.TYPE_ENUM:
        kind = _ENUM
    else:
        raise _Unmodelled(field.full_name)
    plan = (len(field.name) + 3, kind, field.is_repeated and kind != _MAP, value_field)
    _plans[field] = plan
    return plan


_PLAIN, _TIMESTAMP_MSG = 0, 1
_message_kinds: dict[Any, int] = {}


def _message_kind(desc: Descriptor) -> int:
    kind = _message_kinds.get(desc)
    if kind is None:
        if desc.full_name == _TIMESTAMP:
            kind = _TIMESTAMP_MSG
        elif desc.file.name.startswith("google/protobuf/"):
            raise _Unmodelled(desc.full_name)
        else:
            kind = _PLAIN
        _message_kinds[desc] = kind
    return kind


# Timestamp JSON is "YYYY-MM-DDTHH:MM:SS[.fff|.ffffff|.fffffffff]Z": 20 characters, the
# fraction as 3, 6 or 9 digits as the nanoseconds need, and the quotes.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799  # 0001-01-01 .. 9999-12-31


def _timestamp(msg: Any) -> int:
    seconds, nanos = msg.seconds, msg.nanos
    if not (_MIN_SECONDS <= seconds <= _MAX_SECONDS and 0 <= nanos < 1_000_000_000):
        return len(msg.ToJsonString()) + 2  # out of range: as the serialiser does (or fails)
    if nanos == 0:
        return 22
    if nanos % 1_000_000 == 0:
        return 26
    return 29 if nanos % 1000 == 0 else 32


def _message(msg: Message) -> int:
    # The hot loop of budget fitting: string and message fields are sized inline, the
    # rest through _value (same results, fewer calls).
    if _message_kind(msg.DESCRIPTOR) == _TIMESTAMP_MSG:
        return _timestamp(msg)
    fields = msg.ListFields()
    if not fields:
        return 2
    total = 1 + len(fields)  # braces and the commas between members
    for field, value in fields:
        plan = _plans.get(field) or _plan(field)
        total += plan[0]
        kind = plan[1]
        if plan[2]:  # repeated: brackets, commas, items
            total += 1 + len(value)
            if kind == _MESSAGE:
                for v in value:
                    total += _message(v)
            elif kind == _STRING:
                for v in value:
                    if v.isascii() and v.isprintable() and '"' not in v and "\\" not in v:
                        total += len(v) + 2
                    else:
                        total += _string(v)
            else:
                for v in value:
                    total += _scalar(kind, field, v)
        elif kind == _STRING:
            if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
                total += len(value) + 2
            else:
                total += _string(value)
        elif kind == _MESSAGE:
            total += _message(value)
        elif kind == _MAP:
            total += _map(plan[3], value)
        else:
            total += _scalar(kind, field, value)
    return total


def _map(value_field: FieldDescriptor, value: Any) -> int:
    if not value:
        return 2
    kind = _plan(value_field)[1]
    # Keys are strings in JSON; each entry is "key":value plus a separating comma.
    return (
        1
        + len(value)
        + sum(_string(str(k)) + 1 + _value(kind, value_field, v) for k, v in value.items())
    )


def _value(kind: int, field: FieldDescriptor, value: Any) -> int:
    if kind == _STRING:
        return _string(value)
    if kind == _MESSAGE:
        return _message(value)
    return _scalar(kind, field, value)


def _scalar(kind: int, field: FieldDescriptor, value: Any) -> int:
    if kind == _DOUBLE:
        if math.isnan(value) or math.isinf(value):
            return (
                len("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")) + 2
            )
        return len(repr(float(value)))
    if kind == _INT:
        return len(str(value))
    if kind == _QUOTED:
        return len(str(value)) + 2
    if kind == _BOOL:
        return 4 if value else 5
    if kind == _ENUM:
        named = field.enum_type.values_by_number.get(value)
        return len(named.name) + 2 if named is not None else len(str(value))
    raise _Unmodelled(field.full_name)
