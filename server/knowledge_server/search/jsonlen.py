"""The UTF-8 length of a message's budget text, computed from its set fields.

Budgets count ``json.dumps(MessageToDict(msg, preserving_proto_field_name=True),
ensure_ascii=False, separators=(",", ":"))`` (docs/search.md). Every search measures its
whole answer once, so this walks ``ListFields`` (protobuf's public API) and adds up the
bytes that text would have, instead of building it: ``json_format`` builds a dictionary
through generic Python for each of the ~70 messages of an answer and took three times as
long, which made every search measurably slower (bench/RESULTS.md).

It counts a field exactly when ``ListFields`` lists it, which is when ``json_format`` writes
it. Kinds it does not model (bytes, 32-bit floats, well-known types other than Timestamp)
are serialised for real, so the result is always exact; ``tests/test_jsonlen.py`` compares
it with the real text on random messages of every response type.
"""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format, message_factory
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


def json_text(msg: Message) -> str:
    """The JSON text that budgets count."""
    return json.dumps(
        json_format.MessageToDict(msg, preserving_proto_field_name=True),
        ensure_ascii=False,
        separators=(",", ":"),
    )


def json_size_of_string(s: str) -> int:
    """Bytes of ``s`` as a JSON string literal (quotes and escapes included)."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return len(s) + 2
    return len(json.dumps(s, ensure_ascii=False).encode("utf-8"))


def json_size(msg: Message) -> int:
    """``len(json_text(msg).encode("utf-8"))``, without building the text."""
    if msg.DESCRIPTOR.full_name.startswith("google.protobuf."):
        return _well_known(msg)
    fields = msg.ListFields()
    # '{' + '}' and a comma between members.
    size = 1 + len(fields) if fields else 2
    for field, value in fields:
        name_size, kind, repeated = _FACTS.get(field) or _facts(field)
        size += name_size
        if kind == _MAP:
            size += _map(field, value)
        elif repeated:
            size += 1 + len(value) if len(value) else 2
            for v in value:
                size += _value_size(field, kind, v)
        else:
            size += _value_size(field, kind, value)
    return size


_MAP, _STRING, _MESSAGE, _PLAIN, _QUOTED, _BOOL, _OTHER = range(7)

# Per field: the bytes of '"name":', its kind and whether it repeats. Descriptors live as
# long as the process and a response has a few dozen fields, so this stays small.
_FACTS: dict[FieldDescriptor, tuple[int, int, bool]] = {}


def _facts(field: FieldDescriptor) -> tuple[int, int, bool]:
    t = field.type
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        kind = _MAP
    elif t == _FD.TYPE_STRING:
        kind = _STRING
    elif t == _FD.TYPE_MESSAGE:
        kind = _MESSAGE
    elif t in _PLAIN_INTS:
        kind = _PLAIN
    elif t in _QUOTED_INTS:
        kind = _QUOTED
    elif t == _FD.TYPE_BOOL:
        kind = _BOOL
    else:
        kind = _OTHER
    facts = (json_size_of_string(field.name) + 1, kind, field.is_repeated)
    _FACTS[field] = facts
    return facts


def _value_size(field: FieldDescriptor, kind: int, value: Any) -> int:
    if kind == _STRING:
        return json_size_of_string(value)
    if kind == _MESSAGE:
        return json_size(value)
    if kind == _PLAIN:
        return len(str(value))
    if kind == _QUOTED:
        return len(str(value)) + 2
    if kind == _BOOL:
        return 4 if value else 5
    return _scalar_or_message(field, value)


def _well_known(msg: Message) -> int:
    if msg.DESCRIPTOR.full_name == _TIMESTAMP:
        return len(msg.ToJsonString()) + 2  # type: ignore[attr-defined]  # Timestamp only
    return len(json_text(msg).encode("utf-8"))


def _map(field: FieldDescriptor, value: Any) -> int:
    entry = _message_type(field)
    entries = list(value.items())
    size = 1 + len(entries) if entries else 2
    key_field = entry.fields_by_name["key"]
    value_field = entry.fields_by_name["value"]
    for k, v in entries:
        key = ("true" if k else "false") if key_field.type == _FD.TYPE_BOOL else str(k)
        size += json_size_of_string(key) + 1 + _scalar_or_message(value_field, v)
    return size


def _message_type(field: FieldDescriptor) -> Descriptor:
    if field.message_type is None:
        raise TypeError(f"{field.full_name} is not a message field")
    return field.message_type


def _scalar_or_message(field: FieldDescriptor, value: Any) -> int:
    t = field.type
    if t == _FD.TYPE_STRING:
        return json_size_of_string(value)
    if t == _FD.TYPE_MESSAGE:
        return json_size(value)
    if t in _PLAIN_INTS:
        return len(str(value))
    if t in _QUOTED_INTS:
        return len(str(value)) + 2
    if t == _FD.TYPE_BOOL:
        return 4 if value else 5
    if t == _FD.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value) if field.enum_type else None
        return len(named.name) + 2 if named is not None else len(str(value))
    if t == _FD.TYPE_DOUBLE:
        v = float(value)
        if math.isnan(v):
            return len('"NaN"')
        if math.isinf(v):
            return len('"Infinity"') if v > 0 else len('"-Infinity"')
        return len(repr(v))
    # bytes, 32-bit floats: as the serialiser writes them.
    return len(json.dumps(_one_field_value(field, value), ensure_ascii=False).encode("utf-8"))


def _one_field_value(field: FieldDescriptor, value: Any) -> Any:
    """What json_format writes for one value of ``field`` (the kinds sized for real)."""
    if field.containing_type is None:
        raise TypeError(f"{field.full_name} belongs to no message")
    holder = message_factory.GetMessageClass(field.containing_type)()
    if field.is_repeated:
        getattr(holder, field.name).append(value)
        return json_format.MessageToDict(holder, preserving_proto_field_name=True)[field.name][0]
    setattr(holder, field.name, value)
    return json_format.MessageToDict(holder, preserving_proto_field_name=True)[field.name]
