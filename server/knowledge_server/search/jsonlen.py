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
    return _walk(msg)


def _walk(msg: Message) -> int:
    """A message json_format prints field by field (not a well-known type)."""
    fields = msg.ListFields()
    # '{' + '}' and a comma between members.
    size = 1 + len(fields) if fields else 2
    # The common kinds are handled inline: a search answer has some 350 string values.
    for field, value in fields:
        name_size, kind, repeated = _FACTS.get(field) or _facts(field)
        size += name_size
        if repeated:
            size += _map(field, value) if kind == _MAP else _repeated(field, kind, value)
        elif kind == _STRING:
            if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
                size += len(value) + 2
            else:
                size += json_size_of_string(value)
        elif kind == _MESSAGE:
            size += _walk(value)
        elif kind == _DOUBLE:
            size += _double_size(value)
        elif kind == _TIME:
            size += _timestamp_size(value)
        else:
            size += _value_size(field, kind, value)
    return size


def _repeated(field: FieldDescriptor, kind: int, values: Any) -> int:
    size = 1 + len(values) if len(values) else 2
    if kind == _MESSAGE:
        for v in values:
            size += _walk(v)
    elif kind == _STRING:
        for v in values:
            if v.isascii() and v.isprintable() and '"' not in v and "\\" not in v:
                size += len(v) + 2
            else:
                size += json_size_of_string(v)
    else:
        for v in values:
            size += _value_size(field, kind, v)
    return size


_MAP, _STRING, _MESSAGE, _PLAIN, _QUOTED, _BOOL, _DOUBLE, _TIME, _OTHER = range(9)

# Per field: the bytes of '"name":', its kind and whether it repeats. Descriptors live as
# long as the process and a response has a few dozen fields, so this stays small.
_FACTS: dict[FieldDescriptor, tuple[int, int, bool]] = {}


def _facts(field: FieldDescriptor) -> tuple[int, int, bool]:
    t = field.type
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        kind = _MAP
    elif t == _FD.TYPE_STRING:
        kind = _STRING
    elif field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
        kind = _TIME
    elif field.message_type is not None and field.message_type.full_name.startswith(
        "google.protobuf."
    ):
        kind = _OTHER  # other well-known types: sized through json_size
    elif t == _FD.TYPE_MESSAGE:
        kind = _MESSAGE
    elif t == _FD.TYPE_DOUBLE:
        kind = _DOUBLE
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
    if kind == _DOUBLE:
        return _double_size(value)
    if kind == _TIME:
        return _timestamp_size(value)
    return _other_size(field, value)


def _double_size(value: float) -> int:
    if math.isnan(value):
        return len('"NaN"')
    if math.isinf(value):
        return len('"Infinity"') if value > 0 else len('"-Infinity"')
    return len(repr(value))


# Timestamps of years 0001-9999 print as "YYYY-MM-DDTHH:MM:SS" plus 0, 3, 6 or 9 fraction
# digits and "Z" (Timestamp.ToJsonString); answers carry one per episode.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def _timestamp_size(ts: Any) -> int:
    nanos = ts.nanos % 1_000_000_000
    seconds = ts.seconds + (ts.nanos - nanos) // 1_000_000_000
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        return len(ts.ToJsonString()) + 2
    if nanos == 0:
        fraction = 0
    elif nanos % 1_000_000 == 0:
        fraction = 4
    elif nanos % 1000 == 0:
        fraction = 7
    else:
        fraction = 10
    return 22 + fraction


def _well_known(msg: Message) -> int:
    if msg.DESCRIPTOR.full_name == _TIMESTAMP:
        return _timestamp_size(msg)
    return len(json_text(msg).encode("utf-8"))


def _map(field: FieldDescriptor, value: Any) -> int:
    entry = _message_type(field)
    entries = list(value.items())
    size = 1 + len(entries) if entries else 2
    key_field = entry.fields_by_name["key"]
    value_field = entry.fields_by_name["value"]
    kind = (_FACTS.get(value_field) or _facts(value_field))[1]
    for k, v in entries:
        key = ("true" if k else "false") if key_field.type == _FD.TYPE_BOOL else str(k)
        size += json_size_of_string(key) + 1 + _value_size(value_field, kind, v)
    return size


def _message_type(field: FieldDescriptor) -> Descriptor:
    if field.message_type is None:
        raise TypeError(f"{field.full_name} is not a message field")
    return field.message_type


def _other_size(field: FieldDescriptor, value: Any) -> int:
    """The kinds ``_value_size`` does not handle inline: enums, well-known messages other
    than Timestamp, and (as the serialiser writes them) bytes and 32-bit floats."""
    if field.type == _FD.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value) if field.enum_type else None
        return len(named.name) + 2 if named is not None else len(str(value))
    if field.type == _FD.TYPE_MESSAGE:
        return json_size(value)
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
