"""The HTTP face of Retrieve / Answer (seed 002's `POST /knowledge/retrieve` and
`POST /knowledge/answer`) over a real server on real ports, driven by a real HTTP
client (httpx), with a local model server as embedder, reranker and chat model.

Invariants (HTTP-n, docs/kb-retrieve.md "HTTP face"):
HTTP-1 the seed's JSON field for field: camelCase request names, snake_case response
       names, every field printed (`sources: []`, `answerable: false`);
HTTP-2 no evidence is 200 with answerable=false, reason_code=NO_EVIDENCE, sources=[];
HTTP-3 invalid input (empty query, a field the contract does not have, topK over the
       maximum, unknown or inactive tag, malformed JSON, a field given twice or under both
       of its names, a body not in UTF-8, wrong content type) is 400 with the reason code,
       and nothing is retrieved;
HTTP-4 a missing or invalid bearer token is 401, nothing retrieved;
HTTP-5 a token without kb.read is 403: the gRPC method's policy, on both faces;
HTTP-6 a dependency down or past the budget is 503 with the reason code and the trace
       id in body and header, within the budget, never NO_EVIDENCE;
HTTP-7 X-Trace-Id: a valid one is the call's trace id (header and body), another is
       replaced by a new one;
HTTP-8 Answer: the model's answer from the evidence; no evidence, no model call;
HTTP-9 configuration (tests/test_config.py);
HTTP-10 a body over the limit is 413 before it is parsed;
HTTP-11 one schema, two faces: the HTTP answer is the gRPC answer as JSON;
HTTP-12 `knowledge serve --retrieve-http-listen` starts and stops the face with the
       server; with authentication off (loopback) the local principal calls; the
       question is never logged;
HTTP-13 with the server's TLS settings the face serves HTTPS only (and with a client
       CA, to callers with a client certificate only);
HTTP-14 with metrics on, every answer of the face is counted by path and status (any
       path it does not serve under one label), and never under a question's words; a
       caller that leaves before its body arrived is counted as 499, not as a 500;
HTTP-15 a body stalled past the body deadline is 408 and its connection closed; past the
       connection cap a request is 503, served again once connections close.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from knowledge_sdk import InvalidRequest, PermissionDenied
from knowledge_server._gen.knowledge.v1 import kb_retrieve_pb2
from knowledge_server.auth import TokenStore
from knowledge_server.kb import http as kb_http
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from tests.conftest import serve_process, start_server
from tests.kb_world import KbWorld, publish, start_world
from tests.test_auth_e2e import _cert, _write

REFUND = """# Refund policy

## Refund arrival time

Refunds for member orders are returned to the original payment method within 1-3 working days.

## Refund eligibility

Members can ask for a refund within 30 days of delivery when the goods are unused.
"""

CANARY = "zebracanary"
CANARY_DOC = f"""# Internal {CANARY} notes

## Secret {CANARY} section

The {CANARY} vault code rotates every quarter for {CANARY} operators only.
"""

QUESTION = "How many working days until a member refund arrives?"
UNANSWERABLE = "What is the airspeed velocity of an unladen swallow?"

# The seed's response fields (`page` is absent for formats without pages).
SEED_RESPONSE = {"answerable", "trace_id", "sources", "reason_code"}
SEED_SOURCE = {
    "knowledge_id",
    "revision_id",
    "chunk_id",
    "content",
    "title",
    "section",
    "page",
    "version",
    "citation",
    "score",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KbWorld]:
    root = tmp_path_factory.mktemp("kbhttp")
    w = start_world(
        root, "sqlite", retrieve_http_listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"
    )
    try:
        # An agent token holding `read` (search) but not `kb.read`.
        store = TokenStore(root / "data" / "tokens.json")
        w.tokens["search-only"] = store.create("search-only", "org-a", None, "agent", ["read"])[1]
        with w.client("admin-org-a") as kc:
            kc.kb_create_tag("after_sales", "After sales")
            kc.kb_create_tag("refund", "Refund")
            kc.kb_create_tag("retired", "Retired")
            retired = next(t for t in kc.kb_list_tags().tags if t.tag_code == "retired")
            kc.kb_update_tag("retired", retired.version, active=False)
            kc.kb_put_template("DEFAULT", "Answer as a friendly customer service agent.")
            w.topics["refund"], w.topics["refund-v1"] = publish(
                kc,
                "refund",
                "Refund policy",
                "3.0",
                markdown=REFUND,
                tags=("after_sales", "refund"),
            )
        with w.client("admin-org-b") as kc:
            kc.kb_create_tag("after_sales", "After sales")
            w.topics["canary"], _ = publish(
                kc, "vault", "Vault", "1.0", markdown=CANARY_DOC, tags=("after_sales",)
            )
        yield w
    finally:
        w.stop()


@pytest.fixture(autouse=True)
def _healthy_models(world: KbWorld) -> Iterator[None]:
    world.fake.clear()
    yield
    world.fake.clear()


@pytest.fixture(scope="module")
def http(world: KbWorld) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=world.server.rs.http_url, timeout=15) as client:
        yield client


def _auth(world: KbWorld, who: str = "agent-org-a", **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {world.tokens[who]}", **extra}


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"code", "message", "trace_id", "metadata"}
    assert error["trace_id"] == response.headers["x-trace-id"]
    return error  # type: ignore[no-any-return]


def test_http1_retrieve_answers_the_seed_json_field_for_field(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-1: camelCase request fields as in the seed; the response's names are the
    seed's snake_case ones, every source carries the seed's fields."""
    r = http.post(
        "/knowledge/retrieve",
        json={
            "query": QUESTION,
            "allTagCodes": ["after_sales", "refund", "refund"],
            "anyTagCodes": ["refund"],
            "topK": 5,
        },
        headers=_auth(world, **{"X-Trace-Id": "trace_http1"}),
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-trace-id"] == "trace_http1"
    body = r.json()
    assert SEED_RESPONSE <= set(body) <= SEED_RESPONSE | {"trace"}
    assert body["answerable"] is True and body["trace_id"] == "trace_http1"
    assert body["reason_code"] == ""
    assert body["sources"], body
    for source in body["sources"]:
        assert SEED_SOURCE - {"page"} <= set(source) <= SEED_SOURCE
        assert source["knowledge_id"] == world.topics["refund"]
        assert source["revision_id"] == world.topics["refund-v1"]
        assert source["version"] == "3.0" and source["title"] == "Refund policy"
        assert isinstance(source["score"], float) and source["score"] > 0
    assert "1-3 working days" in body["sources"][0]["content"]
    assert body["sources"][0]["section"] == "Refund arrival time"
    # The trace: snake_case counts, zeros printed too.
    assert body["trace"]["score_kind"] == "rerank"
    assert body["trace"]["dropped_other_organisation"] == 0
    assert world.fake.calls["embeddings"] == 1


def test_http1_the_proto_field_names_are_accepted_too(world: KbWorld, http: httpx.Client) -> None:
    """HTTP-1: a request written with the proto's own names (every proto3 JSON parser
    accepts both) is the same request."""
    r = http.post(
        "/knowledge/retrieve",
        json={"query": QUESTION, "all_tag_codes": ["refund"], "top_k": 1},
        headers=_auth(world),
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["sources"]) == 1


def test_http2_no_evidence_is_200_with_every_field_printed(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-2: nothing qualifies -> 200, `answerable: false`, `NO_EVIDENCE`, `sources: []`
    (fields at their defaults are printed, not left out)."""
    r = http.post("/knowledge/retrieve", json={"query": UNANSWERABLE}, headers=_auth(world))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answerable"] is False
    assert body["sources"] == []
    assert body["reason_code"] == "NO_EVIDENCE"
    assert body["trace_id"] == r.headers["x-trace-id"]
    # Organisation B's canary document answers B alone.
    r = http.post(
        "/knowledge/retrieve", json={"query": f"{CANARY} vault code"}, headers=_auth(world)
    )
    assert r.status_code == 200 and CANARY not in r.text
    assert r.json()["answerable"] is False
    r = http.post(
        "/knowledge/retrieve",
        json={"query": f"{CANARY} vault code"},
        headers=_auth(world, "agent-org-b"),
    )
    assert r.status_code == 200 and r.json()["answerable"] is True
    assert r.json()["sources"][0]["knowledge_id"] == world.topics["canary"]


@pytest.mark.parametrize(
    ("body", "reason", "field"),
    [
        ({"query": ""}, "KNOWLEDGE_INVALID_REQUEST", "query"),
        ({"query": "   "}, "KNOWLEDGE_INVALID_REQUEST", "query"),
        ({"topK": 3}, "KNOWLEDGE_INVALID_REQUEST", "query"),
        ({"query": "x" * 1001}, "KNOWLEDGE_INVALID_REQUEST", "query"),
        ({"query": QUESTION, "organId": "org-b"}, "KNOWLEDGE_INVALID_REQUEST", "organId"),
        ({"query": QUESTION, "organ_id": "org-b"}, "KNOWLEDGE_INVALID_REQUEST", "organ_id"),
        ({"query": QUESTION, "model": "gpt"}, "KNOWLEDGE_INVALID_REQUEST", "model"),
        ({"query": QUESTION, "revisionId": "r"}, "KNOWLEDGE_INVALID_REQUEST", "revisionId"),
        ({"query": QUESTION, "filter": "1==1"}, "KNOWLEDGE_INVALID_REQUEST", "filter"),
        ({"query": QUESTION, "templateCode": "X"}, "KNOWLEDGE_INVALID_REQUEST", "templateCode"),
        ({"query": QUESTION, "topK": 21}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": QUESTION, "topK": -1}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": QUESTION, "topK": "many"}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": QUESTION, "topK": 2**40}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": QUESTION, "topK": 2.5}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": QUESTION, "topK": True}, "KNOWLEDGE_INVALID_REQUEST", "topK"),
        ({"query": 42}, "KNOWLEDGE_INVALID_REQUEST", "query"),
        ({"query": QUESTION, "allTagCodes": "refund"}, "KNOWLEDGE_INVALID_REQUEST", "allTagCodes"),
        ({"query": QUESTION, "allTagCodes": ["x"] * 33}, "KNOWLEDGE_INVALID_REQUEST", ""),
        ({"query": QUESTION, "allTagCodes": ["nope"]}, "KNOWLEDGE_UNKNOWN_TAG", "allTagCodes"),
        ({"query": QUESTION, "anyTagCodes": ["retired"]}, "KNOWLEDGE_UNKNOWN_TAG", "anyTagCodes"),
    ],
)
def test_http3_invalid_input_is_400_and_nothing_is_retrieved(
    world: KbWorld, http: httpx.Client, body: dict[str, Any], reason: str, field: str
) -> None:
    """HTTP-3: invalid input -> 400 with the reason code (and the field when one is at
    fault); no embedding, no search."""
    r = http.post("/knowledge/retrieve", json=body, headers=_auth(world))
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["code"] == reason
    if field:
        assert error["metadata"]["field"] == field
    # Refusals quote no internals (message type names, parser errors).
    assert "RetrieveRequest" not in error["message"] and "Traceback" not in r.text
    assert world.fake.calls["embeddings"] == 0


@pytest.mark.parametrize(
    ("content", "content_type", "field"),
    [
        (b'{"query": "refund', "application/json", "request"),
        (b"", "application/json", "request"),
        (b'["refund"]', "application/json", "request"),
        (b'"refund"', "application/json", "request"),
        (b"[" * 5000 + b"]" * 5000, "application/json", "request"),
        (b'{"query": "a", "query": "b"}', "application/json", "query"),
        (
            b'{"query": "a", "allTagCodes": ["refund"], "all_tag_codes": []}',
            "application/json",
            "allTagCodes",
        ),
        (b'{"query": "a", "top_k": 20, "topK": 1}', "application/json", "topK"),
        (
            b'{"query": "a", "anyTagCodes": [], "any_tag_codes": []}',
            "application/json",
            "anyTagCodes",
        ),
        (json.dumps({"query": QUESTION}).encode("utf-16"), "application/json", "request"),
        (json.dumps({"query": QUESTION}).encode("utf-16-le"), "application/json", "request"),
        (json.dumps({"query": QUESTION}).encode("utf-32-be"), "application/json", "request"),
        (b"\xff\xfe\x00garbage", "application/json", "request"),
        (json.dumps({"query": QUESTION}).encode(), "text/plain", "content-type"),
        (json.dumps({"query": QUESTION}).encode(), "", "content-type"),
        (b"query=refund", "application/x-www-form-urlencoded", "content-type"),
        (
            json.dumps({"query": QUESTION}).encode(),
            "application/json; charset=latin-1",
            "content-type",
        ),
    ],
)
def test_http3_malformed_bodies_and_content_types_are_400(
    world: KbWorld, http: httpx.Client, content: bytes, content_type: str, field: str
) -> None:
    """HTTP-3: a body that is not one JSON object of the request in UTF-8 (UTF-16 and
    UTF-32 too), holds a field twice (a key written twice, or a field under both of its
    names, allTagCodes and all_tag_codes), or is not sent as application/json, is 400
    naming the field, never 500, and nothing is retrieved."""
    headers = _auth(world)
    if content_type:
        headers["Content-Type"] = content_type
    r = http.post("/knowledge/retrieve", content=content, headers=headers)
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["code"] == "KNOWLEDGE_INVALID_REQUEST"
    assert error["metadata"]["field"] == field
    assert world.fake.calls["embeddings"] == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/knowledge/retrieve", {"query": "x" * 4001}),
        ("/knowledge/answer", {"query": "x" * 4001}),
        ("/knowledge/retrieve", {"query": QUESTION, "allTagCodes": ["refund"] * 33}),
        ("/knowledge/answer", {"query": QUESTION, "templateCode": "T" * 65}),
    ],
)
def test_http3_a_request_over_the_protos_limits_carries_the_trace_id_on_both_faces(
    world: KbWorld, http: httpx.Client, path: str, body: dict[str, Any]
) -> None:
    """HTTP-3 / KR-8: a request over a limit the proto declares (a 4000-character query,
    32 tag codes, a 64-character template code), refused before the call, carries the
    call's trace id in its error metadata as every other refusal of Retrieve and Answer:
    the caller's X-Trace-Id / x-trace-id, or a new one when it sent none or an invalid
    one; on HTTP and on gRPC."""
    r = http.post(path, json=body, headers=_auth(world, **{"X-Trace-Id": "run-7.limit"}))
    assert r.status_code == 400, r.text
    error = _error(r)
    assert error["metadata"]["trace_id"] == "run-7.limit" and error["metadata"]["field"]
    r = http.post(path, json=body, headers=_auth(world))
    assert _error(r)["metadata"]["trace_id"] == r.headers["x-trace-id"]
    assert r.headers["x-trace-id"].startswith("trace_")
    cls = (
        kb_retrieve_pb2.RetrieveRequest
        if path.endswith("retrieve")
        else kb_retrieve_pb2.AnswerRequest
    )
    req = json_format.ParseDict(body, cls())
    seen = []
    with capture_logs() as logs, world.client("agent-org-a") as kc:
        call = kc.kb_retrieve if path.endswith("retrieve") else kc.kb_answer
        kwargs: dict[str, Any] = {
            "all_tag_codes": list(req.all_tag_codes),
            **({"template_code": req.template_code} if path.endswith("answer") else {}),
        }
        for tid in ("run-7.limit", "", "not a trace id"):
            with pytest.raises(InvalidRequest) as refused:
                call(req.query, trace_id=tid, **kwargs)
            seen.append(refused.value.metadata.get("trace_id", ""))
    assert seen[0] == "run-7.limit"
    assert seen[1].startswith("trace_") and seen[2].startswith("trace_") and seen[1] != seen[2]
    # The server's log has the refusal under the trace id the caller holds.
    logged = {e.get("trace_id") for e in logs if e.get("event") == "kb.request_refused"}
    assert set(seen) <= logged, logs
    assert world.fake.calls["embeddings"] == 0


def test_http3_answer_refuses_an_unknown_template(world: KbWorld, http: httpx.Client) -> None:
    """HTTP-3: Answer's templateCode must name an active template of the organisation."""
    r = http.post(
        "/knowledge/answer",
        json={"query": QUESTION, "templateCode": "NO_SUCH"},
        headers=_auth(world),
    )
    assert r.status_code == 400, r.text
    assert _error(r)["code"] == "KNOWLEDGE_INVALID_REQUEST"
    assert world.fake.calls["embeddings"] == 0 and world.fake.calls["chat"] == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer"},
    ],
)
def test_http4_missing_or_invalid_token_is_401(
    world: KbWorld, http: httpx.Client, headers: dict[str, str]
) -> None:
    """HTTP-4: no token, an unknown one or another scheme -> 401 with a Bearer challenge;
    the body is not even parsed (an invalid body is still 401)."""
    for path in ("/knowledge/retrieve", "/knowledge/answer"):
        r = http.post(path, json={"query": QUESTION, "organId": "x"}, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == "Bearer"
        assert _error(r)["code"] == "KNOWLEDGE_UNAUTHENTICATED"
    assert world.fake.calls["embeddings"] == 0


def test_http4_two_authorization_headers_are_refused(world: KbWorld, http: httpx.Client) -> None:
    """HTTP-4: exactly one Authorization header, as on gRPC (two valid ones still 401)."""
    token = f"Bearer {world.tokens['agent-org-a']}"
    r = http.post(
        "/knowledge/retrieve",
        json={"query": QUESTION},
        headers=[("Authorization", token), ("Authorization", token)],
    )
    assert r.status_code == 401, r.text
    assert world.fake.calls["embeddings"] == 0


@pytest.mark.parametrize("who", ["search-only", "editor-only"])
def test_http5_a_token_without_kb_read_is_403_on_both_faces(
    world: KbWorld, http: httpx.Client, who: str
) -> None:
    """HTTP-5: the capability is the method's `(knowledge.v1.policy)` (kb.read); a token
    holding `read` (search) but not `kb.read` is refused over HTTP and over gRPC alike."""
    for path in ("/knowledge/retrieve", "/knowledge/answer"):
        r = http.post(path, json={"query": QUESTION}, headers=_auth(world, who))
        assert r.status_code == 403, r.text
        error = _error(r)
        assert error["code"] == "KNOWLEDGE_PERMISSION_DENIED"
        assert "'kb.read'" in error["message"]
    with world.client(who) as kc:
        with pytest.raises(PermissionDenied):
            kc.kb_retrieve(QUESTION)
        with pytest.raises(PermissionDenied):
            kc.kb_answer(QUESTION)
    assert world.fake.calls["embeddings"] == 0


@pytest.mark.parametrize(
    ("path", "endpoint", "mode", "dependency"),
    [
        ("/knowledge/retrieve", "embeddings", "hang", "embedder"),
        ("/knowledge/retrieve", "embeddings", "503", "embedder"),
        ("/knowledge/retrieve", "rerank", "hang", "reranker"),
        ("/knowledge/answer", "chat", "503", "chat"),
    ],
)
def test_http6_a_failing_dependency_is_503_with_the_trace_id(
    world: KbWorld, http: httpx.Client, path: str, endpoint: str, mode: str, dependency: str
) -> None:
    """HTTP-6: a dependency hanging or failing -> 503 KNOWLEDGE_DEPENDENCY_UNAVAILABLE
    naming the dependency, the caller's trace id in the body and the header, within the
    budget (2.5 s), never a 200 with NO_EVIDENCE."""
    world.fake.set_fault(endpoint, mode)
    started = time.monotonic()
    r = http.post(
        path, json={"query": QUESTION}, headers=_auth(world, **{"X-Trace-Id": "agent-run:42.7"})
    )
    took = time.monotonic() - started
    assert r.status_code == 503, r.text
    assert r.headers["x-trace-id"] == "agent-run:42.7"
    error = _error(r)
    assert error["code"] == "KNOWLEDGE_DEPENDENCY_UNAVAILABLE"
    assert error["trace_id"] == "agent-run:42.7"
    assert error["metadata"]["dependency"] == dependency
    assert error["metadata"]["trace_id"] == "agent-run:42.7"
    assert "NO_EVIDENCE" not in r.text
    assert took < 2.5 + 1.0


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("trace_abc-123", True),
        ("run.7:step-2", True),
        ("has spaces", False),
        ("x" * 129, False),
        ('quote"d', False),
        ("", False),
    ],
)
def test_http7_x_trace_id_is_propagated_or_replaced(
    world: KbWorld, http: httpx.Client, sent: str, kept: bool
) -> None:
    """HTTP-7: a plain token of at most 128 characters is the call's trace id; anything
    else is replaced by a new `trace_<hex>` (header and body agree, errors included)."""
    headers = _auth(world, **{"X-Trace-Id": sent})
    ok = http.post("/knowledge/retrieve", json={"query": UNANSWERABLE}, headers=headers)
    bad = http.post("/knowledge/retrieve", json={"query": ""}, headers=headers)
    anonymous = http.post(
        "/knowledge/retrieve", json={"query": QUESTION}, headers={"X-Trace-Id": sent}
    )
    assert (ok.status_code, bad.status_code, anonymous.status_code) == (200, 400, 401)
    assert ok.json()["trace_id"] == ok.headers["x-trace-id"]
    for r in (bad, anonymous):
        assert r.json()["error"]["trace_id"] == r.headers["x-trace-id"]
    for r in (ok, bad, anonymous):
        tid = r.headers["x-trace-id"]
        if kept:
            assert tid == sent
        else:
            assert tid != sent and tid.startswith("trace_")


def test_http8_answer_from_the_evidence_and_no_model_call_without_it(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-8: Answer with evidence -> one chat call, the answer cites `[1]`, the
    citation check is printed; no evidence -> zero chat calls, the configured reply,
    `sources: []`."""
    r = http.post(
        "/knowledge/answer",
        json={"query": QUESTION, "allTagCodes": ["refund"], "topK": 2},
        headers=_auth(world, **{"X-Trace-Id": "answer-1"}),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answerable"] is True and body["trace_id"] == "answer-1"
    assert body["sources"] and "[1]" in body["answer"]
    assert body["citation_check"]["status"] == "grounded"
    assert body["citation_check"]["removed"] == []
    assert body["template_code"] == "DEFAULT"
    assert world.fake.calls["chat"] == 1
    world.fake.clear()
    r = http.post("/knowledge/answer", json={"query": UNANSWERABLE}, headers=_auth(world))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answerable"] is False and body["reason_code"] == "NO_EVIDENCE"
    assert body["sources"] == [] and body["model_ms"] == 0
    assert body["answer"] == world.app.config.answer_no_evidence_reply
    assert body["citation_check"] == {"status": "no_evidence", "cited": [], "removed": []}
    assert world.fake.calls["chat"] == 0


def test_http10_a_body_over_the_limit_is_413(world: KbWorld, http: httpx.Client) -> None:
    """HTTP-10: a body over 64 KiB -> 413, with or without a Content-Length, before it is
    parsed or anything retrieved."""
    big = json.dumps({"query": "refund " * 20000}).encode()
    r = http.post(
        "/knowledge/retrieve",
        content=big,
        headers=_auth(world, **{"Content-Type": "application/json"}),
    )
    assert r.status_code == 413, r.text
    assert _error(r)["code"] == "KNOWLEDGE_INVALID_REQUEST"

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    r = http.post(
        "/knowledge/retrieve",
        content=chunks(),
        headers=_auth(world, **{"Content-Type": "application/json"}),
    )
    assert r.status_code == 413, r.text
    assert world.fake.calls["embeddings"] == 0


def test_http_paths_and_methods_it_does_not_serve_answer_json(
    world: KbWorld, http: httpx.Client
) -> None:
    """Other paths are 404 and other methods 405, as JSON errors with a trace id."""
    r = http.get("/knowledge/retrieve", headers=_auth(world))
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert _error(r)["code"] == "KNOWLEDGE_INVALID_REQUEST"
    r = http.post("/knowledge/search", json={"query": QUESTION}, headers=_auth(world))
    assert r.status_code == 404
    assert _error(r)["code"] == "KNOWLEDGE_NOT_FOUND"


def test_http11_the_http_answer_is_the_grpc_answer_as_json(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-11: one schema, two faces: the same request over gRPC and HTTP gives the same
    sources (timings aside), and the HTTP body parses back into the proto message."""
    with world.client("agent-org-a") as kc:
        over_grpc = kc.kb_retrieve(QUESTION, all_tag_codes=["refund"], top_k=3, trace_id="same")
    r = http.post(
        "/knowledge/retrieve",
        json={"query": QUESTION, "allTagCodes": ["refund"], "topK": 3},
        headers=_auth(world, **{"X-Trace-Id": "same"}),
    )
    assert r.status_code == 200, r.text
    parsed = json_format.ParseDict(r.json(), kb_retrieve_pb2.RetrieveResponse())
    assert parsed.trace_id == over_grpc.trace_id == "same"
    assert parsed.answerable == over_grpc.answerable
    assert parsed.sources
    assert [(s.chunk_id, s.citation, s.content, round(s.score, 6)) for s in parsed.sources] == [
        (s.chunk_id, s.citation, s.content, round(s.score, 6)) for s in over_grpc.sources
    ]


def _stderr_lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _event(lines: queue.Queue[str], name: str, seen: list[str], timeout: float = 60) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == name:
            return record  # type: ignore[no-any-return]
    pytest.fail(f"no {name} log line; stderr: {''.join(seen)[-2000:]}")


def test_http12_serve_starts_and_stops_the_face_and_never_logs_the_question(
    tmp_path: Path,
) -> None:
    """HTTP-12: `knowledge serve --retrieve-http-listen` serves the face in the server's
    process and logs its address; authentication off on loopback -> the local principal
    calls (as on gRPC); SIGTERM stops it with the server; no log line holds the question
    or a refused field's value."""
    secret = "quokkaquestion"
    proc = serve_process(
        tmp_path / "data", "--retrieve-http-listen", "127.0.0.1:0", stderr=subprocess.PIPE
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on"), line
        lines = _stderr_lines(proc)
        started = _event(lines, "server.retrieve_http_started", seen)
        url = started["url"]
        assert url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=url, timeout=15) as client:
            r = client.post(
                "/knowledge/retrieve",
                json={"query": f"{secret} refund days"},
                headers={"X-Trace-Id": "serve-1"},
            )
            assert r.status_code == 200, r.text
            assert r.json()["reason_code"] == "NO_EVIDENCE"
            assert r.headers["x-trace-id"] == "serve-1"
            r = client.post("/knowledge/answer", json={"query": secret, "organId": secret})
            assert r.status_code == 400 and r.json()["error"]["metadata"]["field"] == "organId"
        _event(lines, "http.ok", seen)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _event(lines, "server.stopped", seen, timeout=10)
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"{url}/knowledge/retrieve", json={"query": "x"}, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)
    while True:
        try:
            seen.append(lines.get_nowait())
        except queue.Empty:
            break
    text = "".join(seen)
    assert "http.error" in text and "serve-1" in text
    assert secret not in text


@pytest.mark.parametrize("mutual", [False, True])
async def test_http13_the_face_serves_https_with_the_servers_certificate(
    tmp_path: Path, mutual: bool
) -> None:
    """HTTP-13: tls_cert / tls_key -> HTTPS with that certificate, plain HTTP refused;
    tls_client_ca -> a caller without a client certificate is refused."""
    ca_key, ca = _cert("test-ca", ca=True)
    srv_key, srv = _cert("localhost", ca_key, ca.subject, san=True)
    cli_key, cli = _cert("client-1", ca_key, ca.subject)
    ca_pem, _ = _write(tmp_path / "ca", None, ca)
    srv_cert, srv_key_path = _write(tmp_path / "server", srv_key, srv)
    cli_cert, cli_key_path = _write(tmp_path / "client", cli_key, cli)
    tls = {"tls_cert": str(srv_cert), "tls_key": str(srv_key_path)}
    if mutual:
        tls["tls_client_ca"] = str(ca_pem)
    trusted = ssl.create_default_context(cafile=str(ca_pem))
    with_cert = ssl.create_default_context(cafile=str(ca_pem))
    with_cert.load_cert_chain(str(cli_cert), str(cli_key_path))
    body = {"query": "refund days"}
    async with _http_face(tmp_path, **tls) as port:
        async with httpx.AsyncClient(verify=with_cert, timeout=10) as client:
            r = await client.post(f"https://127.0.0.1:{port}/knowledge/retrieve", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["reason_code"] == "NO_EVIDENCE"
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.post(f"http://127.0.0.1:{port}/knowledge/retrieve", json=body)
        async with httpx.AsyncClient(verify=trusted, timeout=5) as client:
            url = f"https://127.0.0.1:{port}/knowledge/retrieve"
            if mutual:
                with pytest.raises(httpx.HTTPError):
                    await client.post(url, json=body)
            else:
                assert (await client.post(url, json=body)).status_code == 200


def _http_counts(world: KbWorld) -> dict[tuple[str, str], float]:
    endpoint = world.server.rs.served.metrics_endpoint
    assert endpoint is not None
    text = httpx.get(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10).text
    assert QUESTION not in text
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "knowledge_http_requests_total":
                out[(sample.labels["path"], sample.labels["status"])] = sample.value
    return out


def test_http14_the_faces_answers_are_counted_by_path_and_status(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-14: a 200, a 401, a 400, a 405 on a served path and a 404 elsewhere each move
    their own counter; unserved paths (a trailing slash included: not redirected) are
    counted as "other", not under their names."""
    before = _http_counts(world)
    ok = http.post("/knowledge/retrieve", json={"query": QUESTION}, headers=_auth(world))
    assert ok.status_code == 200
    assert http.post("/knowledge/answer", json={"query": QUESTION}).status_code == 401
    bad = http.post("/knowledge/retrieve", json={"query": " "}, headers=_auth(world))
    assert bad.status_code == 400
    assert http.get("/knowledge/retrieve").status_code == 405
    assert http.post("/secret-scan-path", json={}).status_code == 404
    assert http.post("/knowledge/retrieve/", json={}, headers=_auth(world)).status_code == 404
    after = _http_counts(world)
    moved = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    assert moved == {
        ("/knowledge/retrieve", "200"): 1.0,
        ("/knowledge/answer", "401"): 1.0,
        ("/knowledge/retrieve", "400"): 1.0,
        ("/knowledge/retrieve", "405"): 1.0,
        ("other", "404"): 2.0,
    }


def test_http14_a_caller_gone_before_its_body_is_499_not_a_server_error(
    world: KbWorld, http: httpx.Client
) -> None:
    """HTTP-14: a request whose body never arrives (the caller closed the connection) is
    counted as 499 and never as a 500 (no alarm on the server's error rate)."""
    before = _http_counts(world)
    host, port = world.server.rs.http_url.removeprefix("http://").split(":")
    head = (
        "POST /knowledge/retrieve HTTP/1.1\r\nHost: face\r\n"
        f"Authorization: Bearer {world.tokens['agent-org-a']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"query": "how long')
    limit = time.monotonic() + 10
    while True:
        after = _http_counts(world)
        if after.get(("/knowledge/retrieve", "499"), 0.0) > before.get(
            ("/knowledge/retrieve", "499"), 0.0
        ):
            break
        assert time.monotonic() < limit, "the dropped call was not counted"
        time.sleep(0.1)
    assert after.get(("/knowledge/retrieve", "500"), 0.0) == before.get(
        ("/knowledge/retrieve", "500"), 0.0
    )
    assert http.post(
        "/knowledge/retrieve", json={"query": QUESTION}, headers=_auth(world)
    ).is_success


@asynccontextmanager
async def _http_face(tmp_path: Path, **settings: Any) -> AsyncIterator[int]:
    """A real server with its HTTP face on a free port (and ``settings``); the port. Both
    are stopped and the app closed at the end."""
    rs = await start_server(tmp_path, retrieve_http_listen="127.0.0.1:0", **settings)
    assert rs.served.http is not None
    try:
        yield rs.served.http.port
    finally:
        await rs.served.http.stop(0)
        await rs.server.stop(0)
        rs.app.close()


async def _status_line(reader: asyncio.StreamReader) -> bytes:
    return (await asyncio.wait_for(reader.readline(), timeout=30)).strip()


async def _trickled_exchange(port: int, head: bytes, within_s: float) -> bytes:
    """Send `head`, then a byte every 50 ms for 20 s (a sender that never finishes its
    body), and return everything the server sends until it closes the connection, within
    `within_s` seconds (a server that holds the connection fails the test).

    A plain socket, not asyncio's streams: a server closing with the caller's bytes
    unread answers them with a reset, and the kernel hands over what arrived before it,
    then the reset; `StreamReader` raises a reset it has stored before returning what it
    had buffered, and a failed write tore the transport down under a pending read."""
    loop = asyncio.get_running_loop()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)

    async def trickle() -> None:
        for _ in range(400):
            try:
                await loop.sock_sendall(sock, b" ")
            except OSError:
                return  # the server closed (reset) the connection
            await asyncio.sleep(0.05)

    async def received() -> bytes:
        got = bytearray()
        while True:
            try:
                piece = await loop.sock_recv(sock, 65536)
            except ConnectionError:
                return bytes(got)
            if not piece:
                return bytes(got)
            got += piece

    try:
        await loop.sock_sendall(sock, head)
        sending = asyncio.create_task(trickle())
        try:
            return await asyncio.wait_for(received(), timeout=within_s)
        finally:
            sending.cancel()
    finally:
        sock.close()


async def test_http15_a_stalled_body_is_408_and_idle_connections_never_shut_others_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-15: a body that has not arrived within the body deadline after its head (sent
    a byte and then a byte now and then) is answered 408 and its connection closed, never
    held; and connections that never finish their head do not shut out the callers that
    do (a cap counting them answered every request 503 once it was full). Real sockets
    against the real server, with the deadline made small."""
    monkeypatch.setattr(kb_http, "BODY_READ_TIMEOUT_S", 0.5, raising=False)
    body = b'{"query": "refund days"}'
    held: list[asyncio.StreamWriter] = []
    async with _http_face(tmp_path) as port:
        try:
            answer = await _trickled_exchange(
                port,
                b"POST /knowledge/retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:1],
                within_s=15,  # before the trickle ends: keep-alive would never end
            )
            assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 408 Request Timeout", answer
            assert b"did not arrive within" in answer and b"KNOWLEDGE_INVALID_REQUEST" in answer
            assert b"connection: close" in answer.lower()

            for _ in range(300):
                _, idle = await asyncio.open_connection("127.0.0.1", port)
                held.append(idle)
            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(
                    f"http://127.0.0.1:{port}/knowledge/retrieve",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
            assert r.status_code == 200, r.text
            assert r.json()["reason_code"] == "NO_EVIDENCE"
        finally:
            for idle in held:
                idle.close()


async def test_http15_every_refusal_before_the_body_closes_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-15: a refusal sent before the body was read (a body declared too large, a
    path not served) closes its connection, after reading what is left of the body for a
    moment, so the caller gets the answer and cannot hold the connection by sending a byte
    now and then (each byte restarted the keep-alive timer: held for as long as it liked,
    without a token). A small body's caller still reads the whole answer."""
    monkeypatch.setattr(kb_http, "DRAIN_S", 0.5, raising=False)
    async with _http_face(tmp_path) as port:
        for head, status in (
            (
                b"POST /knowledge/retrieve HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n",
                b"HTTP/1.1 413 Request Entity Too Large",
            ),
            (
                b"POST /knowledge/other HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
                b"HTTP/1.1 404 Not Found",
            ),
        ):
            answer = await _trickled_exchange(port, head + b"{", within_s=15)
            assert answer.split(b"\r\n", 1)[0] == status, answer
            assert b"connection: close" in answer.lower()
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(
                f"http://127.0.0.1:{port}/knowledge/nowhere",
                content=b'{"query": "x"}',
                headers={"Content-Type": "application/json"},
            )
        assert r.status_code == 404 and r.json()["error"]["code"] == "KNOWLEDGE_NOT_FOUND"


async def test_http15_a_refusal_neither_invites_a_body_nor_waits_for_one_that_has_arrived(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP-15: reading the rest of a refused request's body must not ask a caller waiting
    for `100 Continue` to send it (it answered `100 Continue`, then the refusal; curl's
    large upload then met a reset connection), nor wait for more of a body that has all
    arrived (a chunked body over the limit got its 413 only after the drain's wait)."""
    monkeypatch.setattr(kb_http, "DRAIN_S", 60.0, raising=False)
    async with _http_face(tmp_path) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /knowledge/retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\nExpect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        first = await asyncio.wait_for(_status_line(reader), timeout=20)
        assert first.startswith(b"HTTP/1.1 413"), first
        writer.close()

        body = b'{"query": "' + b"x" * 70_000 + b'"}'
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /knowledge/retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunked
        )
        await writer.drain()
        first = await asyncio.wait_for(_status_line(reader), timeout=20)
        assert first.startswith(b"HTTP/1.1 413"), first
        writer.close()
