"""The SDK's fast decoder (knowledge_sdk._wire) builds exactly what betterproto2 builds,
and its fast writer writes exactly the bytes betterproto2 writes.

Every response the SDK receives goes through ``_wire.parse`` instead of ``Message.parse``;
the typed objects a harness sees must not change. Random messages of every top-level
type in the contracts (from the server's protobuf classes, so the bytes are what the server
sends) are decoded both ways and compared field by field and byte by byte; unknown
fields (a newer server) are kept the same way."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_sdk import _wire
from knowledge_sdk._gen.knowledge import v1
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    docgraph_pb2,
    errors_pb2,
    index_service_pb2,
    knowledge_service_pb2,
    search_pb2,
)

from tests.test_jsonsize import _fill

MODULES = [
    search_pb2,
    dispatch_pb2,
    docgraph_pb2,
    errors_pb2,
    index_service_pb2,
    knowledge_service_pb2,
]
TYPES = sorted(
    (getattr(m, name) for m in MODULES for name in m.DESCRIPTOR.message_types_by_name),
    key=lambda c: c.DESCRIPTOR.full_name,
)


def _sdk_class(cls: type[Message]) -> type:
    return getattr(v1, cls.DESCRIPTOR.name)


def test_every_contract_message_has_an_sdk_class() -> None:
    assert len(TYPES) > 60
    for cls in TYPES:
        assert _sdk_class(cls) is not None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cls=st.sampled_from(TYPES))
def test_same_objects_as_betterproto2(data: st.DataObject, cls: type[Message]) -> None:
    msg = cls()
    _fill(msg, data.draw, 0)
    raw = msg.SerializeToString()
    sdk_cls = _sdk_class(cls)
    expected = sdk_cls.parse(raw)
    got = _wire.parse(sdk_cls, raw)
    assert type(got) is type(expected)
    # repr compares every field of every nested message, and NaN equal to NaN.
    assert repr(got) == repr(expected)
    assert bytes(got) == bytes(expected)
    assert repr(got.to_dict()) == repr(expected.to_dict())


@settings(max_examples=200, deadline=None)
@given(
    number=st.integers(200, 10_000),
    payload=st.one_of(
        st.integers(0, 2**64 - 1).map(lambda v: ("varint", v)),
        st.binary(max_size=20).map(lambda b: ("bytes", b)),
    ),
)
def test_unknown_fields_kept_like_betterproto2(number: int, payload: tuple[str, object]) -> None:
    """A field this SDK does not know (sent by a newer server) is kept, not lost."""
    base = search_pb2.SearchResponse(query="q", found=True).SerializeToString()
    kind, value = payload
    if kind == "varint":
        extra = _enc_varint(number << 3) + _enc_varint(int(value))  # type: ignore[arg-type]
    else:
        blob = bytes(value)  # type: ignore[arg-type]
        extra = _enc_varint(number << 3 | 2) + _enc_varint(len(blob)) + blob
    raw = base + extra
    got = _wire.parse(v1.SearchResponse, raw)
    expected = v1.SearchResponse.parse(raw)
    assert got == expected and got._unknown_fields == expected._unknown_fields == extra
    assert bytes(got) == bytes(expected)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), cls=st.sampled_from(TYPES))
def test_serialize_writes_the_bytes_of_betterproto2(
    data: st.DataObject, cls: type[Message]
) -> None:
    """Every request the SDK sends goes through ``_wire.serialize`` instead of ``bytes()``:
    random messages of every contract type, as betterproto2 objects (optional fields set
    to zero, enums, maps, Timestamps as datetimes, nested and repeated messages), write
    the same bytes both ways."""
    msg = cls()
    _fill(msg, data.draw, 0)
    obj = _sdk_class(cls).parse(msg.SerializeToString())
    assert _wire.serialize(obj) == bytes(obj)


@settings(max_examples=200, deadline=None)
@given(
    query=st.text(max_size=40),
    limit=st.integers(-(2**31), 2**31 - 1),
    workspaces=st.lists(st.text(max_size=8), max_size=3),
    include=st.none() | st.lists(st.sampled_from(["episodes", "code", "skills"]), max_size=3),
    max_tokens=st.integers(-(2**31), 2**31 - 1),
    trace=st.booleans(),
    commit=st.booleans(),
)
def test_serialize_sdk_requests(
    query: str,
    limit: int,
    workspaces: list[str],
    include: list[str] | None,
    max_tokens: int,
    trace: bool,
    commit: bool,
) -> None:
    """The requests the SDK builds (defaults left out, negative numbers as ten-byte
    varints, empty lists and sub-messages) write the same bytes as betterproto2."""
    from knowledge_sdk.client import dispatch_request, search_request

    query = query.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
    req = search_request(
        query,
        limit=limit,
        workspaces=workspaces,
        include=include,
        max_tokens=max_tokens,
        trace=trace,
    )
    assert _wire.serialize(req) == bytes(req)
    task = dispatch_request(query, acceptance=workspaces, commit=commit, workspaces=workspaces)
    assert _wire.serialize(task) == bytes(task)


def test_search_time_window_without_a_zone_is_utc() -> None:
    """``since``/``until`` without a time zone are UTC, as the service reads them; the
    request carries the same instants as with an explicit UTC zone."""
    from datetime import UTC, datetime, timedelta, timezone

    from knowledge_sdk.client import search_request

    naive = search_request("x", since=datetime(2026, 3, 1, 9), until=datetime(2026, 3, 2))
    aware = search_request(
        "x", since=datetime(2026, 3, 1, 9, tzinfo=UTC), until=datetime(2026, 3, 2, tzinfo=UTC)
    )
    assert _wire.serialize(naive) == _wire.serialize(aware) == bytes(aware)
    tokyo = timezone(timedelta(hours=9))
    shifted = search_request("x", since=datetime(2026, 3, 1, 18, tzinfo=tokyo))
    parsed = search_pb2.SearchRequest.FromString(_wire.serialize(shifted))
    assert parsed.filters.since.ToJsonString() == "2026-03-01T09:00:00Z"


def test_serialize_keeps_unknown_fields() -> None:
    extra = _enc_varint(999 << 3) + _enc_varint(7)
    raw = search_pb2.SearchResponse(query="q").SerializeToString() + extra
    obj = v1.SearchResponse.parse(raw)
    assert _wire.serialize(obj) == bytes(obj) == raw


def test_truncated_input_fails() -> None:
    raw = search_pb2.SearchResponse(query="a longer query text").SerializeToString()
    with pytest.raises((EOFError, IndexError)):
        _wire.parse(v1.SearchResponse, raw[:-3])


def _enc_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 129, 16383, 16384, 16385, 300_000])
def test_lengths_and_numbers_at_varint_widths(size: int) -> None:
    """Lengths and numbers on either side of the one-, two- and three-byte varint widths
    (the decoder reads one and two bytes inline): the same objects as betterproto2."""
    msg = search_pb2.SearchResponse(query="q" * size)
    item = msg.lanes.code.items.add(id="chunk:" + "é" * size, path="p", snippet="s" * size)
    item.start_line = size
    item.end_line = size + 1
    msg.limits.returned = size
    raw = msg.SerializeToString()
    assert _wire.parse(v1.SearchResponse, raw) == v1.SearchResponse.parse(raw)
    with pytest.raises((EOFError, IndexError)):
        _wire.parse(v1.SearchResponse, raw[:-1] if size else raw + b"\x0a")
