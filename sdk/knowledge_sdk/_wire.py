"""Protobuf wire format <-> betterproto2 messages, faster than betterproto2's own.

Reading (``parse``) is about seven times faster than ``Message.parse``.

betterproto2 decodes through a ``BytesIO`` stream one byte per call and builds a record for
every field; a 10 KB search answer takes it about 2.8 ms of client CPU, where the server
needs a tenth of that to write it. This decoder walks the bytes by index, with a decoder
written once per message class from betterproto2's own field metadata (one branch per
field: 2.8M instructions per answer, against 3.6M for a generic loop over a plan), and
produces the same objects: the same classes, values, enum members, datetimes for
Timestamps, map entries, and unknown fields kept byte for byte (``tests/test_sdk_wire.py``
compares it with ``Message.parse`` on random messages of every type the service sends).

Writing (``serialize``) gives the bytes of ``bytes(msg)``, about ten times faster:
betterproto2 enters ``warnings.catch_warnings`` for every field to compare it with its
default and builds each field through a ``BytesIO``; a search request took about 90 us
to write, against 9 us here. The writer follows the same rules from a plan per class: fields in
betterproto2's order, None and default values left out, packed repeated scalars, map
entries written whole, unknown fields appended (``tests/test_sdk_wire.py`` holds it to
``bytes(msg)`` on random messages of every type).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import betterproto2

__all__ = ["deserializer", "parse", "serialize"]

T = TypeVar("T", bound=betterproto2.Message)

_B = betterproto2
# Field kinds of a plan.
(
    _STRING,
    _BYTES,
    _MESSAGE,
    _WRAPPED,
    _MAP,
    _ENUM,
    _BOOL,
    _SIGNED32,
    _SIGNED64,
    _UNSIGNED32,
    _UNSIGNED64,
    _ZIGZAG,
    _FIXED,
) = range(13)

_VARINT_KINDS = {
    _B.TYPE_ENUM: _ENUM,
    _B.TYPE_BOOL: _BOOL,
    _B.TYPE_INT32: _SIGNED32,
    _B.TYPE_INT64: _SIGNED64,
    _B.TYPE_UINT32: _UNSIGNED32,
    _B.TYPE_UINT64: _UNSIGNED64,
    _B.TYPE_SINT32: _ZIGZAG,
    _B.TYPE_SINT64: _ZIGZAG,
}
# Fixed-width types: (struct format, byte width).
_FIXED_FORMATS = {
    _B.TYPE_FLOAT: ("<f", 4),
    _B.TYPE_FIXED32: ("<I", 4),
    _B.TYPE_SFIXED32: ("<i", 4),
    _B.TYPE_DOUBLE: ("<d", 8),
    _B.TYPE_FIXED64: ("<Q", 8),
    _B.TYPE_SFIXED64: ("<q", 8),
}

# Per class: {field number: (attribute, kind, repeated, extra)}; extra is the message
# class, the wrapped class, the enum class, or a struct.Struct, depending on the kind.
_Plan = dict[int, tuple[str, int, bool, Any]]
_plans: dict[type, _Plan] = {}


def parse(cls: type[T], data: bytes) -> T:
    """``cls.parse(data)``, decoded faster."""
    return _parse(cls, data, 0, len(data))  # type: ignore[return-value]


def deserializer(cls: type[T]) -> Callable[[bytes], T]:
    """A ``response_deserializer`` for grpcio."""

    def de(data: bytes) -> T:
        return _parse(cls, data, 0, len(data))  # type: ignore[return-value]

    return de


def _plan(cls: type) -> _Plan:
    plan = _plans.get(cls)
    if plan is not None:
        return plan
    meta = cls._betterproto  # type: ignore[attr-defined]
    plan = {}
    for name, fm in meta.meta_by_field_name.items():
        t = fm.proto_type
        extra: Any = None
        if t == _B.TYPE_STRING:
            kind = _STRING
        elif t == _B.TYPE_BYTES:
            kind = _BYTES
        elif t == _B.TYPE_MAP:
            kind, extra = _MAP, meta.cls_by_field[name]
        elif t == _B.TYPE_MESSAGE:
            if fm.unwrap:
                kind, extra = _WRAPPED, fm.unwrap()
            else:
                kind, extra = _MESSAGE, meta.cls_by_field[name]
        elif t in _VARINT_KINDS:
            kind = _VARINT_KINDS[t]
            if kind == _ENUM:
                extra = meta.cls_by_field[name]
            elif kind == _ZIGZAG:
                extra = 32 if t == _B.TYPE_SINT32 else 64
        elif t in _FIXED_FORMATS:
            kind, extra = _FIXED, struct.Struct(_FIXED_FORMATS[t][0])
        else:
            raise TypeError(f"{cls.__name__}.{name}: unsupported protobuf type {t}")
        plan[fm.number] = (name, kind, bool(fm.repeated), extra)
    _plans[cls] = plan
    return plan


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[pos]  # IndexError on truncated input, as a stream would run dry
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("Too many bytes when decoding varint.")


def _from_varint(kind: int, value: int, extra: Any) -> Any:
    if kind == _SIGNED64 or kind == _ENUM:
        value &= 0xFFFFFFFFFFFFFFFF
        value = (value ^ 0x8000000000000000) - 0x8000000000000000
        return extra(value) if kind == _ENUM else value
    if kind == _BOOL:
        return value > 0
    if kind == _SIGNED32:
        value &= 0xFFFFFFFF
        return (value ^ 0x80000000) - 0x80000000
    if kind == _UNSIGNED32:
        return value & 0xFFFFFFFF
    if kind == _UNSIGNED64:
        return value & 0xFFFFFFFFFFFFFFFF
    if kind == _ZIGZAG:
        value &= (1 << extra) - 1
        return (value >> 1) ^ (-(value & 1))
    raise ValueError("wire type does not match the field")


def _packed(kind: int, extra: Any, data: bytes, pos: int, end: int) -> list[Any]:
    out: list[Any] = []
    if kind == _FIXED:
        size = extra.size
        while pos < end:
            out.append(extra.unpack_from(data, pos)[0])
            pos += size
        return out
    while pos < end:
        value, pos = _varint(data, pos)
        out.append(_from_varint(kind, value, extra))
    return out


def _parse(cls: type, data: bytes, pos: int, end: int) -> Any:
    return (_parsers.get(cls) or _parser(cls))(data, pos, end)


def _parser(cls: type) -> Callable[[bytes, int, int], Any]:
    with _compiling:
        parser = _parsers.get(cls)
        if parser is None:
            built: dict[type, Callable[[bytes, int, int], Any]] = {}
            parser = _compile_parser(cls, built)
            _parsers.update(built)
    return parser


# Per class, a decoder written for it from its plan (``_compile_parser``): one branch per
# field, taken when the tag is the field's number with its usual wire type, which decodes
# the value in place. Anything else (unknown fields, packed lists, a wire type that does
# not match) goes through ``_field``, which follows the plan generically. The branches
# save the plan lookup, the tests on the kind and the attribute access by name that every
# field paid: about 540 fields in a search answer. Only complete decoders are published
# here, each with the decoders of every class it refers to, so a client shared between
# threads never runs one half filled in.
_parsers: dict[type, Callable[[bytes, int, int], Any]] = {}
_compiling = threading.Lock()

_LENGTH_PREFIX = """\
            n = data[pos]
            if n < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:  # two bytes: up to 16383
                n = (n & 0x7F) | data[pos + 1] << 7
                pos += 2
            else:
                n, pos = _varint(data, pos)
            stop = pos + n
            if stop > end:
                raise EOFError("Stream ended unexpectedly while reading a length-delimited field.")"""
_VARINT = """\
            v = data[pos]
            if v < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | data[pos + 1] << 7
                pos += 2
            else:
                v, pos = _varint(data, pos)"""
_CONVERT = {
    _BOOL: "v > 0",
    _UNSIGNED32: "v & 0xFFFFFFFF",
    _UNSIGNED64: "v & 0xFFFFFFFFFFFFFFFF",
    _SIGNED32: "((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000",
    _SIGNED64: "((v & 0xFFFFFFFFFFFFFFFF) ^ 0x8000000000000000) - 0x8000000000000000",
}


def _compile_parser(
    cls: type, built: dict[type, Callable[[bytes, int, int], Any]]
) -> Callable[[bytes, int, int], Any]:
    """Write the decoder of one class into ``built``, and those of the classes it refers
    to. It is entered there before they are compiled, so recursive messages refer to it."""
    plan = _plans.get(cls) or _plan(cls)
    env: dict[str, Any] = {"cls": cls, "_varint": _varint, "_field": _field}
    subs: list[tuple[str, type]] = []
    branches: list[str] = []
    for number, (name, kind, repeated, extra) in sorted(plan.items()):
        store = f"msg.{name}.append(v)" if repeated else f"msg.{name} = v"
        if kind in (_STRING, _BYTES, _MESSAGE, _WRAPPED, _MAP):
            if kind == _STRING:
                value = 'v = data[pos:stop].decode("utf-8")'
            elif kind == _BYTES:
                value = "v = bytes(data[pos:stop])"
            else:
                subs.append((f"_p{number}", extra))
                value = f"v = _p{number}(data, pos, stop)"
                if kind == _WRAPPED:
                    value += ".to_wrapped()"
                elif kind == _MAP:
                    store = f"msg.{name}[v.key] = v.value"
            body = f"{_LENGTH_PREFIX}\n            {value}\n            {store}\n            pos = stop"
            key = number << 3 | 2
        elif kind == _FIXED:
            size = extra.size
            env[f"_s{number}"] = extra
            body = (
                f"            if pos + {size} > end:\n"
                '                raise EOFError("Stream ended unexpectedly while reading a'
                ' fixed-width field.")\n'
                f"            v = _s{number}.unpack_from(data, pos)[0]\n"
                f"            pos += {size}\n            {store}"
            )
            key = number << 3 | (1 if size == 8 else 5)
        else:  # a varint
            if kind in _CONVERT:
                convert = _CONVERT[kind]
            elif kind == _ENUM:
                env[f"_e{number}"] = extra
                convert = f"_e{number}({_CONVERT[_SIGNED64]})"
            else:  # zigzag
                bits = (1 << extra) - 1
                convert = f"((v & {bits}) >> 1) ^ (-(v & 1))"
            body = f"{_VARINT}\n            v = {convert}\n            {store}"
            key = number << 3
        branches.append(f"        {'elif' if branches else 'if'} tag == {key}:\n{body}")
    generic = "pos, unknown = _field(cls, msg, data, start, pos, tag, end, unknown)"
    if branches:
        dispatch = "\n".join(branches) + f"\n        else:\n            {generic}"
    else:
        dispatch = f"        {generic}"
    source = f"""\
def parse(data, pos, end):
    msg = cls()
    unknown = b""
    while pos < end:
        start = pos
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos)
{dispatch}
    if unknown:
        msg._unknown_fields = unknown
    return msg
"""
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<decoder {cls.__name__}>", "exec"), env, namespace)  # noqa: S102
    parser: Callable[[bytes, int, int], Any] = namespace["parse"]
    built[cls] = parser
    for var, sub in subs:
        env[var] = _parsers.get(sub) or built.get(sub) or _compile_parser(sub, built)
    return parser


def _field(
    cls: type, msg: Any, data: bytes, start: int, pos: int, tag: int, end: int, unknown: bytes
) -> tuple[int, bytes]:
    """One field whose tag (read from ``start``; its value from ``pos``) has no branch of
    its own in the class's decoder: returns the position after it, and the unknown fields'
    bytes with it added when the class does not know it."""
    plan = _plans[cls]
    wire = tag & 7
    if wire == 2:
        length = data[pos]
        if length < 0x80:
            pos += 1
        else:
            length, pos = _varint(data, pos)
        value_start, pos = pos, pos + length
        if pos > end:
            raise EOFError("Stream ended unexpectedly while reading a length-delimited field.")
    elif wire == 0:
        value, pos = _varint(data, pos)
    elif wire == 1 or wire == 5:
        value_start = pos
        pos += 8 if wire == 1 else 4
        if pos > end:
            raise EOFError("Stream ended unexpectedly while reading a fixed-width field.")
    else:
        raise ValueError(f"unsupported wire type {wire}")
    field = plan.get(tag >> 3)
    if field is None:
        return pos, unknown + data[start:pos]
    name, kind, repeated, extra = field
    if wire == 2:
        if kind == _STRING:
            value = data[value_start:pos].decode("utf-8")
        elif kind == _MESSAGE:
            value = _parse(extra, data, value_start, pos)
        elif kind == _WRAPPED:
            value = _parse(extra, data, value_start, pos).to_wrapped()
        elif kind == _MAP:
            entry = _parse(extra, data, value_start, pos)
            getattr(msg, name)[entry.key] = entry.value
            return pos, unknown
        elif kind == _BYTES:
            value = bytes(data[value_start:pos])
        elif repeated:
            getattr(msg, name).extend(_packed(kind, extra, data, value_start, pos))
            return pos, unknown
        else:
            raise ValueError(f"{cls.__name__}.{name}: wire type does not match the field")
    elif wire == 0:
        value = _from_varint(kind, value, extra)
    elif kind == _FIXED and extra.size == (8 if wire == 1 else 4):
        value = extra.unpack_from(data, value_start)[0]
    else:
        raise ValueError(f"{cls.__name__}.{name}: wire type does not match the field")
    if repeated:
        getattr(msg, name).append(value)
    else:
        setattr(msg, name, value)
    return pos, unknown


# -- writing ------------------------------------------------------------------------------

# Per class, in betterproto2's field order: (attribute, key bytes, kind, repeated, default,
# extra); extra as in a reading plan, and for maps the (key, value) entry writers.
_EncPlan = list[tuple[str, bytes, int, bool, Any, Any]]
_enc_plans: dict[type, _EncPlan | None] = {}
_PACKED = frozenset(_VARINT_KINDS.values()) | {_FIXED}


def serialize(msg: betterproto2.Message) -> bytes:
    """``bytes(msg)``, written faster."""
    out = bytearray()
    _write(msg, out)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    out = bytearray()
    _put_varint(out, number << 3 | wire)
    return bytes(out)


def _put_varint(out: bytearray, value: int) -> None:
    if value < 0:
        if value < -(1 << 63):
            raise ValueError("Negative value is not representable as a 64-bit integer")
        value += 1 << 64
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def _wire_of(kind: int, extra: Any) -> int:
    if kind in (_STRING, _BYTES, _MESSAGE, _WRAPPED, _MAP):
        return 2
    if kind == _FIXED:
        return 1 if extra.size == 8 else 5
    return 0


def _kind_of(proto_type: str, unwrap: Any, cls: Any) -> tuple[int, Any]:
    if proto_type == _B.TYPE_STRING:
        return _STRING, None
    if proto_type == _B.TYPE_BYTES:
        return _BYTES, None
    if proto_type == _B.TYPE_MESSAGE:
        return (_WRAPPED, unwrap()) if unwrap else (_MESSAGE, cls)
    if proto_type in _VARINT_KINDS:
        return _VARINT_KINDS[proto_type], None  # enums write their number
    if proto_type in _FIXED_FORMATS:
        return _FIXED, struct.Struct(_FIXED_FORMATS[proto_type][0])
    raise TypeError(f"unsupported protobuf type {proto_type}")


def _enc_plan(cls: type) -> _EncPlan | None:
    """The class's writing plan; None for a pydantic message (betterproto2 validates it
    while writing, so it writes those itself)."""
    if cls in _enc_plans:
        return _enc_plans[cls]
    plan: _EncPlan | None = None
    if not _is_pydantic(cls):
        meta = cls._betterproto  # type: ignore[attr-defined]
        plan = []
        for name, fm in meta.meta_by_field_name.items():
            default = meta.default_gen[name]()
            if fm.proto_type == _B.TYPE_MAP:
                key_fm, value_fm = fm.map_meta
                entry = []
                for number, efm, ecls in (
                    (1, key_fm, None),
                    (2, value_fm, meta.cls_by_field.get(f"{name}.value")),
                ):
                    ekind, eextra = _kind_of(efm.proto_type, efm.unwrap, ecls)
                    entry.append((_key(number, _wire_of(ekind, eextra)), ekind, eextra))
                plan.append((name, _key(fm.number, 2), _MAP, False, default, tuple(entry)))
                continue
            kind, extra = _kind_of(fm.proto_type, fm.unwrap, meta.cls_by_field.get(name))
            repeated = bool(fm.repeated)
            wire = 2 if repeated and kind in _PACKED else _wire_of(kind, extra)
            plan.append((name, _key(fm.number, wire), kind, repeated, default, extra))
    _enc_plans[cls] = plan
    return plan


def _is_pydantic(cls: type) -> bool:
    try:
        import pydantic.dataclasses
    except ImportError:
        return False
    return bool(pydantic.dataclasses.is_pydantic_dataclass(cls))


def _write(msg: Any, out: bytearray) -> None:
    plan = _enc_plans.get(type(msg), False)
    if plan is False:
        plan = _enc_plan(type(msg))
    if plan is None:
        out += bytes(msg)
        return
    for name, key, kind, repeated, default, extra in plan:
        value = getattr(msg, name)
        if value is None or value == default:
            continue
        if kind == _MAP:
            for k, v in value.items():
                entry = bytearray()
                for (ekey, ekind, eextra), item in zip(extra, (k, v), strict=True):
                    _value(entry, ekey, ekind, eextra, item)
                out += key
                _put_varint(out, len(entry))
                out += entry
        elif repeated:
            if kind in _PACKED:
                packed = bytearray()
                if kind == _FIXED:
                    for item in value:
                        packed += extra.pack(item)
                else:
                    for item in value:
                        _put_scalar(packed, kind, item)
                out += key
                _put_varint(out, len(packed))
                out += packed
            else:
                for item in value:
                    _value(out, key, kind, extra, item)
        else:
            _value(out, key, kind, extra, value)
    out += msg._unknown_fields


def _put_scalar(out: bytearray, kind: int, value: Any) -> None:
    if kind == _ZIGZAG:
        _put_varint(out, value << 1 if value >= 0 else (value << 1) ^ (~0))
    else:
        _put_varint(out, int(value))


def _value(out: bytearray, key: bytes, kind: int, extra: Any, value: Any) -> None:
    """One field: its key and its value."""
    out += key
    if kind == _STRING:
        data = value.encode("utf-8")
        _put_varint(out, len(data))
        out += data
    elif kind == _MESSAGE or kind == _WRAPPED:
        inner = bytearray()
        _write(extra.from_wrapped(value) if kind == _WRAPPED else value, inner)
        _put_varint(out, len(inner))
        out += inner
    elif kind == _BYTES:
        _put_varint(out, len(value))
        out += value
    elif kind == _FIXED:
        out += extra.pack(value)
    else:
        _put_scalar(out, kind, value)
