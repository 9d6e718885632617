"""json_size (search/jsonlen.py) equals the length of the JSON text budgets count, for
any message.

The budget invariant (KC-6: max_tokens is never exceeded) rests on this count, so the
fast sizer is compared with the real serialiser on random messages of every type a
response can carry, including awkward strings (quotes, control characters, non-BMP
text), extreme numbers, maps and timestamps."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server._gen.knowledge.v1 import dispatch_pb2, errors_pb2, search_pb2
from knowledge_server.search.jsonlen import json_size, json_size_of_string, json_text

_FD = FieldDescriptor
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40
) | st.sampled_from(
    ["", 'a"b', "back\\slash", "tab\tnew\nline", "\x7f\x00", "кто чинил", "会员退款", "🙂"]
)
_DOUBLES = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 0.1, 1e-7, 1e16, 123456789.123, 0.25]
)


def _value(field: FieldDescriptor, draw: Any, depth: int) -> Any:
    t = field.type
    if t == _FD.TYPE_STRING:
        return draw(_TEXT)
    if t == _FD.TYPE_BOOL:
        return draw(st.booleans())
    if t in (_FD.TYPE_INT64, _FD.TYPE_SINT64, _FD.TYPE_SFIXED64):
        return draw(st.integers(-(2**63), 2**63 - 1))
    if t in (_FD.TYPE_UINT64, _FD.TYPE_FIXED64):
        return draw(st.integers(0, 2**64 - 1))
    if t in (_FD.TYPE_INT32, _FD.TYPE_SINT32, _FD.TYPE_SFIXED32):
        return draw(st.integers(-(2**31), 2**31 - 1))
    if t in (_FD.TYPE_UINT32, _FD.TYPE_FIXED32):
        return draw(st.integers(0, 2**32 - 1))
    if t == _FD.TYPE_DOUBLE:
        return draw(_DOUBLES)
    if t == _FD.TYPE_FLOAT:
        return draw(st.floats(width=32))
    if t == _FD.TYPE_ENUM:
        return draw(st.sampled_from([v.number for v in field.enum_type.values] + [99]))
    if t == _FD.TYPE_BYTES:
        return draw(st.binary(max_size=12))
    raise AssertionError(t)


def _fill(msg: Message, draw: Any, depth: int) -> None:
    desc: Descriptor = msg.DESCRIPTOR
    if desc.full_name == "google.protobuf.Timestamp":
        # The whole valid range (years 0001..9999), and every fraction width.
        seconds = st.integers(-62135596800, 253402300799) | st.sampled_from([0, -1, 1])
        nanos = st.sampled_from([0, 1, 1000, 1000000, 120000000, 123456789, 999999999])
        msg.seconds = draw(seconds)  # type: ignore[attr-defined]
        msg.nanos = draw(nanos)  # type: ignore[attr-defined]
        return
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        target = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f = field.message_type.fields_by_name["key"]
            val_f = field.message_type.fields_by_name["value"]
            for _ in range(draw(st.integers(0, 3))):
                k = _value(key_f, draw, depth)
                if val_f.message_type is not None:
                    if depth < 3:
                        _fill(target[k], draw, depth + 1)
                else:
                    target[k] = _value(val_f, draw, depth)
        elif field.is_repeated:
            for _ in range(draw(st.integers(0, 3))):
                if field.message_type is not None:
                    if depth < 3:
                        _fill(target.add(), draw, depth + 1)
                else:
                    target.append(_value(field, draw, depth))
        elif field.message_type is not None:
            if depth < 3:
                _fill(target, draw, depth + 1)
                target.SetInParent()
        else:
            setattr(msg, field.name, _value(field, draw, depth))


TYPES = [
    search_pb2.SearchResponse,
    search_pb2.SearchRequest,
    search_pb2.Dropped,
    search_pb2.EpisodeItem,
    search_pb2.CodeItem,
    search_pb2.Actor,
    dispatch_pb2.DispatchResponse,
    errors_pb2.EditionRefusal,
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cls=st.sampled_from(TYPES))
def test_json_size_equals_the_serialised_length(data: st.DataObject, cls: type[Message]) -> None:
    """KC-6 groundwork: the size used for budgets is the real JSON size."""
    msg = cls()
    _fill(msg, data.draw, 0)
    assert json_size(msg) == len(json_text(msg).encode("utf-8"))


def test_empty_and_nested_defaults() -> None:
    msg = search_pb2.SearchResponse()
    assert json_size(msg) == len(json_text(msg).encode()) == 2
    msg.limits.SetInParent()  # a present but empty sub-message prints as {}
    assert json_size(msg) == len(json_text(msg).encode())


@settings(max_examples=500, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list('ab \n\r\t\b\f\x00\x01\x0b\x1b\x1f\x7f"\\é世🙂\u2028'))
        | st.characters(blacklist_categories=("Cs",)),
        max_size=60,
    )
)
def test_string_size_counts_every_escape(text: str) -> None:
    """Strings full of escapes (line breaks, quotes, control characters) and non-ASCII
    characters: the size equals the serialised literal's UTF-8 length."""
    assert json_size_of_string(text) == len(json.dumps(text, ensure_ascii=False).encode("utf-8"))


def _odd_message_class() -> type[Message]:
    """A message type with the field kinds the sizer leaves to the serialiser: bytes,
    float32, a map with bool keys, and a well-known type other than Timestamp."""
    from google.protobuf import descriptor_pb2, descriptor_pool, duration_pb2, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(duration_pb2.DESCRIPTOR.serialized_pb)
    fdp = descriptor_pb2.FileDescriptorProto(
        name="odd_test.proto",
        package="oddtest",
        syntax="proto3",
        dependency=["google/protobuf/duration.proto"],
    )
    odd = fdp.message_type.add(name="Odd")
    entry = odd.nested_type.add(name="FlagsEntry")
    entry.options.map_entry = True
    fd = descriptor_pb2.FieldDescriptorProto
    entry.field.add(name="key", number=1, type=fd.TYPE_BOOL, label=fd.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    fields = [
        ("name", fd.TYPE_STRING, fd.LABEL_OPTIONAL, ""),
        ("blob", fd.TYPE_BYTES, fd.LABEL_OPTIONAL, ""),
        ("ratio", fd.TYPE_FLOAT, fd.LABEL_OPTIONAL, ""),
        ("flags", fd.TYPE_MESSAGE, fd.LABEL_REPEATED, ".oddtest.Odd.FlagsEntry"),
        ("wait", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".google.protobuf.Duration"),
        ("child", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".oddtest.Odd"),
    ]
    for number, (name, kind, label, type_name) in enumerate(fields, start=1):
        field = odd.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("oddtest.Odd"))


def test_unmodelled_kinds_are_sized_by_the_serialiser() -> None:
    """Fields the sizer does not model count only when present, and then the real
    serialiser sizes the message (the result is exact either way)."""
    cls = _odd_message_class()
    cases = [cls(name="plain"), cls(blob=b"\x00\xff"), cls(ratio=0.1), cls(name="x")]
    cases[3].flags[True] = "on"
    deep = cls(name="outer")
    deep.child.wait.seconds = 3
    cases.append(deep)
    cases.append(cls(child=cls(ratio=2.5)))
    for msg in cases:
        assert json_size(msg) == len(json_text(msg).encode("utf-8"))
