"""The UTF-8 size of a message's JSON text, without building the text.

Budgets count the response as ``json.dumps(MessageToDict(msg, preserving_proto_field_name=True),
ensure_ascii=False, separators=(",", ":"))`` (see ``docs/search.md``). Building that
text is generic, slow Python in ``json_format``; a search measures its response
several times while it fits the budget. :func:`json_size` computes the same byte
count from the fields directly. Field kinds it does not model (bytes, float32,
well-known types other than Timestamp) make it fall back to the real serialiser,
so it is exact for every message; ``tests/test_jsonsize.py`` holds it to that.

Each message type is sized by a function written for it once, from its descriptor
(``_compile``): one test per field, in field-number order, reading the field as an
attribute. A field is counted exactly when ``ListFields`` would list it (non-default values
of fields without presence, set fields with presence, non-empty lists and maps), which is
when the serialiser writes it. The generic walk over ``ListFields`` it replaces built a
descriptor and a tuple for each of the ~540 fields of a search answer: fitting an answer to
its budget took 3.7M instructions with it and 2.9M with these (callgrind, 64 answers).
"""

from __future__ import annotations

import json
import keyword
import math
import threading
from collections.abc import Callable
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
        return _sizer(msg.DESCRIPTOR)(msg)
    except _Unmodelled:
        return len(json_text(msg).encode("utf-8"))


def json_size_of_string(s: str) -> int:
    """Bytes of ``s`` as a JSON string literal (quotes and escapes included)."""
    return _string(s)


def _string(s: str) -> int:
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return len(s) + 2
    return len(json.dumps(s, ensure_ascii=False).encode("utf-8"))


def _double(value: float) -> int:
    if math.isnan(value):
        return 5  # "NaN"
    if math.isinf(value):
        return 10 if value > 0 else 11  # "Infinity", "-Infinity"
    return len(repr(float(value)))


def _present_double(value: float) -> bool:
    # Without presence, a double is in the text unless it is +0.0 (-0.0 is not the default).
    return bool(value) or math.copysign(1.0, value) < 0


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


def _refuse(name: str) -> int:
    raise _Unmodelled(name)


def _unmodelled(name: str) -> Callable[[Any], int]:
    def size(_: Any) -> int:
        return _refuse(name)

    return size


_Sizer = Callable[[Any], int]
# Complete sizers only: a type's sizer is published with the sizers of every type it
# refers to, so another thread never runs one whose references are not filled in yet.
_sizers: dict[Descriptor, _Sizer] = {}
_compiling = threading.Lock()


def _sizer(desc: Descriptor) -> _Sizer:
    sizer = _sizers.get(desc)
    if sizer is None:
        with _compiling:
            sizer = _sizers.get(desc)
            if sizer is None:
                built: dict[Descriptor, _Sizer] = {}
                sizer = _compile(desc, built)
                _sizers.update(built)
    return sizer


def _enum_sizes(field: FieldDescriptor) -> dict[int, int]:
    # Known values are written as their quoted names; unknown ones as numbers.
    return {v.number: len(v.name) + 2 for v in field.enum_type.values}


def _compile(desc: Descriptor, built: dict[Descriptor, _Sizer]) -> _Sizer:
    """Write the sizer of one message type into ``built``, and those of the types it refers
    to. It is entered there before they are compiled, so recursive types refer to it."""
    if desc.full_name == _TIMESTAMP:
        built[desc] = _timestamp
        return _timestamp
    if desc.file.name.startswith("google/protobuf/"):
        sizer = _unmodelled(desc.full_name)
        built[desc] = sizer
        return sizer
    env: dict[str, Any] = {
        "_string": _string,
        "_double": _double,
        "_present_double": _present_double,
        "_refuse": _refuse,
    }
    subs: list[tuple[str, Descriptor]] = []
    body: list[str] = []

    def member(test: str, value: str, size: str) -> None:
        body.append(f"    {value}\n    if {test}:\n        n += 1\n        t += {size}")

    for i, field in enumerate(sorted(desc.fields, key=lambda f: f.number)):
        name = field.name
        get = (
            f"m.{name}"
            if name.isidentifier() and not keyword.iskeyword(name)
            else f"getattr(m, {name!r})"
        )
        key = len(name) + 3  # '"name":'
        t = field.type
        if t == _FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            if key_field.type == _FD.TYPE_BOOL:
                member("v", f"v = {get}", f"_refuse({field.full_name!r})")
                continue
            value = _item_expr(value_field, "x", env, subs, f"{i}v")
            # Keys are strings in JSON; each entry is "key":value plus a separating comma.
            size = f"{key + 1} + len(v) + sum(_string(str(k)) + 1 + {value} for k, x in v.items())"
            member("v", f"v = {get}", size)
            continue
        if field.is_repeated:
            item = _item_expr(field, "x", env, subs, str(i))
            member("v", f"v = {get}", f"{key + 1} + len(v) + sum({item} for x in v)")
            continue
        value = _item_expr(field, "v", env, subs, str(i))
        if t == _FD.TYPE_MESSAGE or field.has_presence:
            member(f"m.HasField({name!r})", f"v = {get}", f"{key} + {value}")
        elif t == _FD.TYPE_DOUBLE:
            member("_present_double(v)", f"v = {get}", f"{key} + {value}")
        else:  # a string, number, enum or bool without presence: in the text unless default
            member("v", f"v = {get}", f"{key} + {value}")
    source = (
        "def size(m):\n    n = 0\n    t = 1\n"
        + "\n".join(body)
        + "\n    return t + n if n else 2\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<json sizer {desc.full_name}>", "exec"), env, namespace)  # noqa: S102
    sizer: _Sizer = namespace["size"]
    built[desc] = sizer
    for var, sub in subs:
        env[var] = _sizers.get(sub) or built.get(sub) or _compile(sub, built)
    return sizer


def _item_expr(
    field: FieldDescriptor,
    var: str,
    env: dict[str, Any],
    subs: list[tuple[str, Descriptor]],
    tag: str,
) -> str:
    """An expression for the JSON size of one value ``var`` of ``field``."""
    t = field.type
    if t == _FD.TYPE_STRING:
        return (
            f"(len({var}) + 2 if {var}.isascii() and {var}.isprintable()"
            f" and '\"' not in {var} and '\\\\' not in {var} else _string({var}))"
        )
    if t == _FD.TYPE_MESSAGE:
        subs.append((f"_m{tag}", field.message_type))
        return f"_m{tag}({var})"
    if t == _FD.TYPE_BOOL:
        return f"(4 if {var} else 5)"
    if t in _PLAIN_INTS:
        return f"len(str({var}))"
    if t in _QUOTED_INTS:
        return f"(len(str({var})) + 2)"
    if t == _FD.TYPE_DOUBLE:
        return f"_double({var})"
    if t == _FD.TYPE_ENUM:
        env[f"_e{tag}"] = _enum_sizes(field)
        return f"(_e{tag}.get({var}) or len(str({var})))"
    return f"_refuse({field.full_name!r})"  # bytes, float32: sized by the serialiser
