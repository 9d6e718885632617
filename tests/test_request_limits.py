"""Declared size limits of requests (``(knowledge.v1.rules)`` max_items / max_length),
enforced for every RPC by the transport before the application runs."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from knowledge_server._gen.knowledge.v1 import (
    dispatch_pb2,
    docgraph_pb2,
    index_service_pb2,
    index_service_pb2_grpc,
    knowledge_service_pb2,
    knowledge_service_pb2_grpc,
    search_pb2,
)
from knowledge_server.errors import InvalidRequest
from knowledge_server.transport.policy import FILES
from knowledge_server.transport.rules import check_limits, unlimited_repeated_fields

from tests.conftest import start_server


def _request_types() -> list[object]:
    return [
        method.input_type
        for module in FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def test_every_repeated_request_field_declares_max_items() -> None:
    """A repeated field of any RPC's request (at any depth) without a declared max_items
    would let one request grow without bound."""
    types = _request_types()
    assert {t.name for t in types} >= {"SearchRequest", "DispatchRequest", "IngestSessionsRequest"}
    missing = {t.full_name: unlimited_repeated_fields(t) for t in types}
    assert {name: fields for name, fields in missing.items() if fields} == {}


def _error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


async def test_a_search_with_270000_workspaces_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rs = await start_server(tmp_path)
    try:
        req = search_pb2.SearchRequest(schema="knowledge.search/v1", query="where is the config")
        req.filters.workspaces.extend(f"/w/{i}" for i in range(270_000))
        async with grpc.aio.insecure_channel(rs.address) as channel:
            stub = knowledge_service_pb2_grpc.KnowledgeServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Search(req)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "100" in (info.value.details() or "")
            detail = _error_info(info.value)
            assert detail.reason == "KNOWLEDGE_INVALID_REQUEST"
            assert dict(detail.metadata) == {"field": "filters.workspaces", "limit": "100"}
            # A streaming RPC is held to its limits the same way.
            ingest = index_service_pb2.IngestSessionsRequest(paths=["/x"] * 1001)
            with pytest.raises(grpc.aio.AioRpcError) as streamed:
                async for _ in index_service_pb2_grpc.IndexServiceStub(channel).IngestSessions(
                    ingest
                ):
                    pass
            assert streamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert _error_info(streamed.value).metadata["field"] == "paths"
            # Within the limits the server still answers.
            ok = search_pb2.SearchRequest(schema="knowledge.search/v1", query="config")
            ok.filters.workspaces.extend(f"/w/{i}" for i in range(100))
            assert (await stub.Search(ok)).schema == "knowledge.search/v1"
    finally:
        await rs.server.stop(0)


@pytest.mark.parametrize(
    ("message", "field", "limit"),
    [
        (search_pb2.SearchRequest(include=["code"] * 11), "include", "10"),
        (
            search_pb2.SearchRequest(filters=search_pb2.SearchFilters(paths=["p"] * 101)),
            "filters.paths",
            "100",
        ),
        (
            search_pb2.SearchRequest(filters=search_pb2.SearchFilters(skills=["s" * 4097])),
            "filters.skills",
            "4096",
        ),
        (search_pb2.SearchRequest(query="q" * 2001), "query", "2000"),
        (dispatch_pb2.DispatchRequest(workspaces=["/w"] * 101), "workspaces", "100"),
        (
            dispatch_pb2.DispatchRequest(task=dispatch_pb2.DispatchTask(acceptance=["a"] * 21)),
            "task.acceptance",
            "20",
        ),
        (knowledge_service_pb2.GetEpisodeRequest(id="e" * 4097), "id", "4096"),
        (index_service_pb2.IndexWorkspaceRequest(root="/" * 4097), "root", "4096"),
        (docgraph_pb2.SearchLevelsRequest(query="q" * 4097), "query", "4096"),
    ],
)
def test_limits_name_the_field_and_the_limit(message, field, limit) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest) as info:
        check_limits(message)
    assert info.value.metadata == {"field": field, "limit": limit}
    assert info.value.message.startswith(field + ": ")


def test_requests_within_the_limits_pass() -> None:
    req = search_pb2.SearchRequest(query="q" * 2000, include=["code"] * 10)
    req.filters.workspaces.extend(["w" * 4096] * 100)
    check_limits(req)
    check_limits(dispatch_pb2.DispatchRequest(task=dispatch_pb2.DispatchTask(text="t")))
    assert check_limits(index_service_pb2.GetStatusRequest()) is None
