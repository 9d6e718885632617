"""Bad input answers INVALID_ARGUMENT without internals, over a real server: bytes that do
not decode as the request message (with and without a token), paths with a NUL character,
timestamps outside the Timestamp range, episode sequences beyond 64 bits."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from knowledge_server._gen.knowledge.v1 import (
    index_service_pb2,
    index_service_pb2_grpc,
    knowledge_service_pb2,
    knowledge_service_pb2_grpc,
    search_pb2,
)
from knowledge_server.auth import TokenStore
from knowledge_server.episodes.model import parse_event_id

from tests.conftest import start_server

SEARCH = "/knowledge.v1.KnowledgeService/Search"
INGEST = "/knowledge.v1.IndexService/IngestSessions"

# SearchRequest{schema: "knowledge.search/v1", query: <bytes ff fe>}: not UTF-8.
SCHEMA_FIELD = b"\x0a\x13knowledge.search/v1"
BAD_UTF8 = SCHEMA_FIELD + b"\x1a\x02\xff\xfe"
# The query field says 200 bytes follow; 3 do.
TRUNCATED = SCHEMA_FIELD + b"\x1a\xc8\x01abc"
# IngestSessionsRequest{paths: [<bytes c3 28>]}: not UTF-8.
BAD_PATH = b"\x0a\x02\xc3\x28"

INTERNALS = (
    "DecodeError",
    "Error parsing",
    "knowledge.v1.",
    "Exception",
    "Traceback",
    "Unexpected",
)


def _check_clean_invalid(err: grpc.aio.AioRpcError) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.details() or ""
    assert details.startswith("request: ")
    assert not [word for word in INTERNALS if word in details]
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "KNOWLEDGE_INVALID_REQUEST"
    assert dict(info.metadata) == {"field": "request"}


def _token_store(tmp_path: Path) -> tuple[TokenStore, str]:
    store = TokenStore(tmp_path / "data" / "tokens.json")
    _, operator = store.create("ops-1", "org-a", None, "operator")
    return store, operator


@pytest.mark.parametrize("with_token", [False, True])
async def test_undecodable_bytes_are_invalid_argument(tmp_path: Path, with_token: bool) -> None:
    store, operator = _token_store(tmp_path)
    rs = await start_server(tmp_path, authenticate=store.authenticate, auth="on")
    metadata = (("authorization", f"Bearer {operator}"),) if with_token else ()
    try:
        async with grpc.aio.insecure_channel(rs.address) as channel:
            search = channel.unary_unary(SEARCH)  # bytes in, bytes out
            for raw in (BAD_UTF8, TRUNCATED):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await search(raw, metadata=metadata)
                _check_clean_invalid(info.value)
            ingest = channel.unary_stream(INGEST)
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                async for _ in ingest(BAD_PATH, metadata=metadata):
                    pass
            _check_clean_invalid(streamed.value)
            # A well-formed request still gets the usual answer: refused without a token,
            # served with one.
            good = search_pb2.SearchRequest(schema="knowledge.search/v1", query="config")
            if with_token:
                answer = await search(good.SerializeToString(), metadata=metadata)
                assert search_pb2.SearchResponse.FromString(answer).schema == "knowledge.search/v1"
            else:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await search(good.SerializeToString())
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await rs.server.stop(0)


def _search(**filters: object) -> search_pb2.SearchRequest:
    req = search_pb2.SearchRequest(schema="knowledge.search/v1", query="config")
    for name, (seconds, nanos) in filters.items():  # type: ignore[misc]
        stamp = getattr(req.filters, name)
        stamp.seconds, stamp.nanos = seconds, nanos
    return req


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_search(since=(253_402_300_800, 0)), "filters.since"),  # 10000-01-01
        (_search(until=(-62_135_596_801, 0)), "filters.until"),  # before 0001-01-01
        (_search(until=(2**62, 0)), "filters.until"),
        (_search(since=(0, 1_000_000_000)), "filters.since"),
        (_search(since=(0, -1)), "filters.since"),
    ],
)
async def test_out_of_range_timestamps_are_invalid_argument(  # type: ignore[no-untyped-def]
    running_server, request_, field
) -> None:
    async with grpc.aio.insecure_channel(running_server.address) as channel:
        stub = knowledge_service_pb2_grpc.KnowledgeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(request_)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert not [w for w in INTERNALS if w in (info.value.details() or "")]
        status = rpc_status.from_call(info.value)
        assert status is not None
        detail = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(detail)
        assert detail.metadata["field"] == field
        # The ends of the range are accepted.
        edges = _search(since=(-62_135_596_800, 0), until=(253_402_300_799, 999_999_999))
        assert (await stub.Search(edges)).schema == "knowledge.search/v1"


@pytest.mark.parametrize(
    "episode_id",
    ["ep:x:9223372036854775808", "ep:x:-9223372036854775809", "ep:x:" + "9" * 400],
)
async def test_episode_sequence_beyond_64_bits_is_invalid_argument(  # type: ignore[no-untyped-def]
    running_server, episode_id
) -> None:
    async with grpc.aio.insecure_channel(running_server.address) as channel:
        stub = knowledge_service_pb2_grpc.KnowledgeServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetEpisode(knowledge_service_pb2.GetEpisodeRequest(id=episode_id))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "id: expected ep:<session_id>:<seq>"
        # The largest sequence SQLite holds is a well-formed id: simply not found.
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetEpisode(
                knowledge_service_pb2.GetEpisodeRequest(id="ep:x:9223372036854775807")
            )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_parse_event_id_keeps_to_64_bits() -> None:
    assert parse_event_id("ep:a:b:9223372036854775807") == ("a:b", 2**63 - 1)
    assert parse_event_id("ep:s:-9223372036854775808") == ("s", -(2**63))
    for bad in ("ep:s:9223372036854775808", "ep:s:-9223372036854775809", "ep:s:1e3"):
        with pytest.raises(ValueError, match="not an episode id"):
            parse_event_id(bad)


@pytest.mark.parametrize("scoped", [False, True])
async def test_paths_with_a_nul_character_are_invalid_argument(
    tmp_path: Path, scoped: bool
) -> None:
    """A root or a session path with a NUL character names no file: INVALID_ARGUMENT, not
    the INTERNAL of the ValueError the operating system's path calls raise, for an operator
    scoped to workspaces (the scope check resolves symlinks) and for an unscoped one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    store = TokenStore(tmp_path / "data" / "tokens.json")
    _, operator = store.create("ops-1", "org-a", [str(ws)] if scoped else None, "operator")
    rs = await start_server(tmp_path, authenticate=store.authenticate, auth="on")
    metadata = (("authorization", f"Bearer {operator}"),)
    try:
        async with grpc.aio.insecure_channel(rs.address) as channel:
            stub = index_service_pb2_grpc.IndexServiceStub(channel)
            requests = [
                stub.IndexWorkspace(
                    index_service_pb2.IndexWorkspaceRequest(root=f"{ws}\x00/etc"),
                    metadata=metadata,
                ),
                stub.IngestSessions(
                    index_service_pb2.IngestSessionsRequest(paths=[f"{ws}/a.jsonl\x00x"]),
                    metadata=metadata,
                ),
                # A home-relative one: the user lookup raised before any check saw it.
                stub.IngestSessions(
                    index_service_pb2.IngestSessionsRequest(paths=["", "~ro\x00ot/x"]),
                    metadata=metadata,
                ),
            ]
            for call in requests:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert not [w for w in INTERNALS if w in (info.value.details() or "")]
    finally:
        await rs.server.stop(0)
