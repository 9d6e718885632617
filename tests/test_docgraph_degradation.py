"""Document graph: "not collected" differs from "empty"; no silent lexical substitution."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from knowledge_server.docgraph.build import BuildSettings, DocGraphBuilder
from knowledge_server.docgraph.llm import (
    NOT_CONFIGURED_REASON,
    LLMClient,
    LLMSettings,
    LLMUnavailable,
    make_client,
)
from knowledge_server.docgraph.model import DocChunk
from knowledge_server.docgraph.ops import NOT_BUILT, DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks, write_sample_corpus
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.testing.fake_llm import FakeLLMServer

_PAYLOAD_LISTS = (
    "themes",
    "neighbors",
    "relations",
    "high_level",
    "low_level",
    "top_themes",
    "top_entities",
)


@pytest.fixture()
def corpus(tmp_path: Path) -> list[DocChunk]:
    write_sample_corpus(tmp_path / "docs")
    return load_markdown_chunks(tmp_path / "docs")


def _client(url: str, retries: int = 2) -> LLMClient:
    return LLMClient(
        LLMSettings(
            base_url=url,
            model="fake-model",
            backoff_seconds=0.0,
            max_retries=retries,
            timeout_seconds=5,
        )
    )


def _all_ops(ops: DocGraphOps) -> list[dict]:
    return [
        ops.themes(limit=5),
        ops.entity_neighbors("EIP-100", depth=1),
        ops.doc_relations(doc="eip-100.md"),
        ops.global_overview(),
        ops.search_levels("fee market"),
    ]


def _items(answer: dict) -> int:
    return sum(len(answer.get(k) or []) for k in _PAYLOAD_LISTS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_layer_is_not_collected(tmp_path):
    """Catches: an empty list returned for a layer that was never built."""
    for answer in _all_ops(DocGraphOps(DocGraphStore(tmp_path / "data"))):
        assert answer["collected"] is False and answer["found"] is False
        assert answer["reason"] == NOT_BUILT and _items(answer) == 0


def test_llm_not_configured_is_not_collected(tmp_path, corpus):
    """Catches: `return []` (empty posing as "no entities") when the LLM is not configured."""
    assert make_client(LLMSettings()) is None and not LLMSettings(model="m").configured
    store = DocGraphStore(tmp_path / "data")
    report = DocGraphBuilder(store, None, BuildSettings(structural=False)).build(corpus)
    assert report.llm_state == "not_configured" and report.reason == NOT_CONFIGURED_REASON
    for answer in _all_ops(DocGraphOps(store)):
        assert answer["collected"] is False, answer["op"]
        assert answer["found"] is False and answer["reason"] == NOT_CONFIGURED_REASON
        assert _items(answer) == 0


def test_llm_unavailable_is_not_collected_with_driver_code(tmp_path, corpus):
    """Catches: HTTP 503 after retries turned into an empty layer without the driver code."""
    with FakeLLMServer(mode="http_503") as down:
        store = DocGraphStore(tmp_path / "data")
        report = DocGraphBuilder(store, _client(down.url), BuildSettings(structural=False)).build(
            corpus
        )
        # One chunk tried with 2 retries, then the run stops instead of hammering the endpoint.
        assert down.calls == 3
    assert report.llm_state == "unavailable" and report.reason == "LLM_UNAVAILABLE: http 503"
    assert report.stopped_by == "llm_unavailable" and not report.complete
    for answer in _all_ops(DocGraphOps(store)):
        assert answer["collected"] is False and answer["reason"] == "LLM_UNAVAILABLE: http 503"
        assert _items(answer) == 0


def test_connect_error_is_named(tmp_path, corpus):
    """Catches: a network failure reported as success or as an unnamed error."""
    store = DocGraphStore(tmp_path / "data")
    client = _client(f"http://127.0.0.1:{_free_port()}", retries=1)
    report = DocGraphBuilder(store, client, BuildSettings(structural=False)).build(corpus)
    assert report.reason == "LLM_UNAVAILABLE: connect error"
    assert DocGraphOps(store).themes()["reason"] == "LLM_UNAVAILABLE: connect error"


def test_unavailable_llm_keeps_structural_facts_but_says_degraded(tmp_path, corpus):
    """Catches: structural-only answers presented as a full layer."""
    with FakeLLMServer(mode="http_503") as down:
        store = DocGraphStore(tmp_path / "data")
        DocGraphBuilder(store, _client(down.url, retries=0)).build(corpus)
    answer = DocGraphOps(store).entity_neighbors("EIP-100")
    assert answer["collected"] is True and answer["capability"] == "degraded"
    assert answer["reason"].startswith("LLM_UNAVAILABLE: http 503")
    assert "structural facts only" in answer["reason"] and answer["found"] is True


def test_recovery_after_unavailable_resumes(tmp_path, corpus):
    """Catches: a failed run recorded as complete (so the next run would be a no-op)."""
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer(mode="http_503") as down:
        DocGraphBuilder(store, _client(down.url, retries=0)).build(corpus)
    with FakeLLMServer() as up:
        report = DocGraphBuilder(store, _client(up.url)).build(corpus)
    assert not report.noop and report.complete and report.llm_state == "ok"
    assert DocGraphOps(store).themes()["capability"] == "full"


def test_empty_but_collected_differs_from_not_collected(tmp_path):
    """Catches: "nothing found" and "not collected" collapsed into the same answer."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "plain.md").write_text("just some lowercase words here.\n")
    chunks = load_markdown_chunks(tmp_path / "docs")
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer() as up:
        report = DocGraphBuilder(store, _client(up.url)).build(chunks)
        answers = _all_ops(DocGraphOps(store, _client(up.url)))
    assert report.complete and report.entities == 0
    for answer in answers:
        assert answer["collected"] is True and answer["found"] is False
        assert answer["capability"] == "full" and answer["error"] is None, answer["op"]


def test_search_without_llm_is_lexical_and_flagged(tmp_path, corpus):
    """Catches: lexical substitution for dual-level search without the `degraded` flag."""
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer() as up:
        DocGraphBuilder(store, _client(up.url)).build(corpus)
    answer = DocGraphOps(store, None).search_levels("base fee oracle")
    assert answer["degraded"] is True and answer["capability"] == "degraded"
    assert answer["reason"].startswith(NOT_CONFIGURED_REASON)
    assert answer["low_level"] and answer["high_level"] == []
    assert {i["match_kind"] for i in answer["low_level"]} == {"lexical"}


def test_search_with_unavailable_llm_is_not_replaced_by_lexical(tmp_path, corpus):
    """Catches: silently answering with lexical matches when the configured LLM is down."""
    store = DocGraphStore(tmp_path / "data")
    with FakeLLMServer() as up:
        DocGraphBuilder(store, _client(up.url)).build(corpus)
    with FakeLLMServer(mode="http_429") as down:
        answer = DocGraphOps(store, _client(down.url, retries=1)).search_levels("base fee oracle")
        assert down.calls == 2
    assert answer["collected"] is False and answer["found"] is False
    assert answer["reason"] == "LLM_UNAVAILABLE: http 429"
    assert answer["low_level"] == [] and answer["high_level"] == []


def test_client_retries_then_succeeds_and_sends_key_from_env(monkeypatch):
    """Catches: no retry on 429/5xx, retrying on 4xx, or a key not taken from the environment."""
    seen: list[httpx.Request] = []
    statuses = iter([429, 502, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = next(statuses)
        if status != 200:
            return httpx.Response(status)
        return httpx.Response(200, json={"choices": [{"message": {"content": "{}"}}]})

    monkeypatch.setenv("DOCGRAPH_TEST_KEY", "k-123")
    client = LLMClient(
        LLMSettings(
            base_url="http://llm.invalid",
            model="m",
            api_key_env="DOCGRAPH_TEST_KEY",
            backoff_seconds=0.0,
        ),
        transport=httpx.MockTransport(handler),
    )
    assert client.chat_json("s", "u") == "{}"
    assert len(seen) == 3 and seen[0].headers["authorization"] == "Bearer k-123"
    body = seen[0].read().decode()
    assert '"temperature": 0.0' in body or '"temperature":0.0' in body
    assert "json_object" in body and seen[0].url.path == "/v1/chat/completions"

    denied = LLMClient(
        LLMSettings(base_url="http://llm.invalid", model="m", backoff_seconds=0),
        transport=httpx.MockTransport(lambda r: httpx.Response(401)),
    )
    with pytest.raises(LLMUnavailable) as err:
        denied.chat_json("s", "u")
    assert err.value.reason == "LLM_UNAVAILABLE: http 401" and denied.calls == 1


def test_client_reads_key_file(tmp_path):
    """Catches: a key that can only come from a config file value (it must be env or file)."""
    key = tmp_path / "key"
    key.write_text("file-key\n")
    got: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        got.append(request.headers.get("authorization", ""))
        return httpx.Response(200, json={"choices": [{"message": {"content": "{}"}}]})

    client = LLMClient(
        LLMSettings(base_url="http://x.invalid", model="m", api_key_file=str(key)),
        transport=httpx.MockTransport(handler),
    )
    client.chat_json("s", "u")
    assert got == ["Bearer file-key"]
