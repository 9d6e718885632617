"""The outside services retrieval and answering call, each inside one end-to-end budget.

* the embedder (``code/embed.py``): an OpenAI-compatible ``POST /v1/embeddings`` endpoint,
  or a local model (hashing, e5) that needs no network;
* the rerank port: a Cohere / Jina-style ``POST {url}/v1/rerank`` (``{model, query,
  documents, top_n}`` -> ``results[{index, relevance_score}]``) or text-embeddings-
  inference's ``POST {url}/rerank`` (``{query, texts}`` -> ``[{index, score}]``);
* the chat model: the document graph's LLM port (``docgraph/llm.py``), one
  ``/v1/chat/completions`` call.

:func:`call_within` runs one request at a time with a timeout of what is left of the
budget (never more than the call's own cap), and retries transient failures (timeouts,
connection errors, 408/429/5xx) with exponential backoff while the budget allows
(tenacity). A failure a retry would repeat, or a budget that ran out, is
:class:`~knowledge_server.errors.DependencyUnavailable` naming the dependency and the
cause: the caller answers UNAVAILABLE, never "no evidence".

Synchronous: retrieval runs its steps in one worker thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from knowledge_server.code.embed import (
    Embedder,
    EmbeddingError,
    OpenAIEmbedder,
    PermanentEmbeddingError,
)
from knowledge_server.docgraph.llm import LLMClient, LLMRetryable, LLMUnavailable
from knowledge_server.errors import DependencyUnavailable
from knowledge_server.httpcall import AnswerTooLarge, post_json, without_userinfo

__all__ = [
    "RERANK_APIS",
    "Budget",
    "HttpReranker",
    "Permanent",
    "Reranker",
    "Transient",
    "call_within",
    "chat",
    "embed_question",
]

T = TypeVar("T")

RERANK_APIS = ("v1", "tei")
# Below this many seconds of budget a request is not started: it could not finish.
_MIN_CALL_S = 0.005
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


class Transient(Exception):
    """A failure worth another try (timeout, connection error, 408/429/5xx)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Permanent(Exception):
    """A failure a retry would repeat (a 4xx, a malformed answer)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


@dataclass
class Budget:
    """The end-to-end time budget of one call: a monotonic deadline."""

    deadline: float

    @classmethod
    def of_ms(cls, ms: int) -> Budget:
        return cls(time.monotonic() + ms / 1000.0)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, cap: float | None = None) -> float:
        left = self.remaining()
        return left if cap is None else min(cap, left)


def call_within(
    dependency: str,
    budget: Budget,
    attempt: Callable[[float], T],
    *,
    retries: int,
    trace_id: str = "",
    cap_s: float | None = None,
) -> T:
    """``attempt(timeout_s)`` until it answers, at most ``retries + 1`` times, never past
    the budget. Transient failures are retried after a backoff that fits the budget;
    a permanent one, or the budget running out, raises ``DependencyUnavailable``."""
    last = ["budget exhausted"]

    def stop(state: RetryCallState) -> bool:
        return state.attempt_number > retries or budget.remaining() <= _MIN_CALL_S

    def wait(state: RetryCallState) -> float:
        backoff = wait_exponential_jitter(initial=0.05, max=0.5, jitter=0.05)(state)
        # Sleep no longer than leaves a useful slice of the budget for the next try.
        return max(0.0, min(backoff, budget.remaining() / 2))

    def once() -> T:
        left = budget.timeout(cap_s)
        if left <= _MIN_CALL_S:
            raise Transient("budget exhausted")
        try:
            return attempt(left)
        except Transient as exc:
            last[0] = exc.cause
            raise

    retrying = Retrying(
        stop=stop,
        wait=wait,
        retry=retry_if_exception_type(Transient),
        reraise=True,
    )
    try:
        return retrying(once)
    except Transient:
        cause = last[0] if budget.remaining() > _MIN_CALL_S else f"timeout ({last[0]})"
        if last[0] == "budget exhausted":
            cause = "timeout (budget exhausted)"
        raise DependencyUnavailable(dependency, cause, trace_id=trace_id) from None
    except Permanent as exc:
        raise DependencyUnavailable(dependency, exc.cause, trace_id=trace_id) from None


# -- embedding ---------------------------------------------------------------------------


def embed_question(
    embedder: Embedder, text: str, budget: Budget, *, retries: int, trace_id: str = ""
) -> list[float]:
    """The question's vector. A remote embedder gets bounded retries inside the budget; a
    local one (hashing, e5) is called once."""
    if isinstance(embedder, OpenAIEmbedder):

        def attempt(timeout: float) -> list[float]:
            try:
                rows = embedder.call_once([text], timeout=timeout)
            except PermanentEmbeddingError as exc:
                raise Permanent(_short(exc)) from None
            except EmbeddingError as exc:
                raise Transient(_short(exc)) from None
            return [float(x) for x in rows[0]]

        return call_within("embedder", budget, attempt, retries=retries, trace_id=trace_id)
    if budget.remaining() <= _MIN_CALL_S:
        raise DependencyUnavailable("embedder", "timeout (budget exhausted)", trace_id=trace_id)
    try:
        rows = embedder.embed_query([text])
    except EmbeddingError as exc:
        raise DependencyUnavailable("embedder", _short(exc), trace_id=trace_id) from None
    return [float(x) for x in rows[0]]


def _short(exc: Exception) -> str:
    """A failure's cause for the error metadata: the provider's words, without a URL."""
    text = str(exc)
    if "within" in text:
        return "timeout"
    if "HTTP " in text:
        return "http " + text.rsplit("HTTP ", 1)[1].split()[0].strip(":,")
    if "unreachable" in text:
        return "unreachable"
    return "failed"


# -- rerank ------------------------------------------------------------------------------


class Reranker:
    """The rerank port: ``(index, relevance)`` pairs for ``documents`` against ``query``,
    best first. ``max_chars`` is the model's input limit per document; the caller cuts
    longer documents to it (and counts them) before calling."""

    identity: str = ""
    label: str = ""  # the identity as callers may see it (a trace): no server address
    max_chars: int = 2000

    def rerank_once(
        self, query: str, documents: Sequence[str], top_n: int, *, timeout: float
    ) -> list[tuple[int, float]]:
        raise NotImplementedError


class HttpReranker(Reranker):
    """A rerank endpoint over HTTP: ``api = "v1"`` (Cohere, Jina, vLLM, Infinity and
    llama.cpp's ``/v1/rerank``) or ``"tei"`` (text-embeddings-inference ``/rerank``).
    The API key comes from the environment variable ``api_key_env`` names and is sent in
    the ``Authorization`` header only."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api: str = "v1",
        api_key_env: str = "",
        max_chars: int = 2000,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if api not in RERANK_APIS:
            raise ValueError(f"rerank api must be one of {', '.join(RERANK_APIS)}")
        self._base = base_url.rstrip("/")
        self._model = model
        self._api = api
        self.max_chars = max_chars
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(headers=headers, transport=transport, follow_redirects=False)
        self.identity = f"{api}:{without_userinfo(self._base)}:{model}"
        self.label = f"{api}:{model}"  # as callers may see it: without the server's address

    def close(self) -> None:
        self._client.close()

    def rerank_once(
        self, query: str, documents: Sequence[str], top_n: int, *, timeout: float
    ) -> list[tuple[int, float]]:
        if self._api == "v1":
            url = f"{self._base}/v1/rerank"
            body: dict[str, object] = {
                "model": self._model,
                "query": query,
                "documents": list(documents),
                "top_n": top_n,
            }
        else:
            url = f"{self._base}/rerank"
            body = {"query": query, "texts": list(documents), "raw_scores": False}
        try:
            resp = post_json(self._client, url, body, timeout=timeout)
        except AnswerTooLarge:
            raise Permanent("malformed answer (too large)") from None
        except httpx.TimeoutException:
            raise Transient("timeout") from None
        except httpx.TransportError:
            raise Transient("unreachable") from None
        if resp.status_code in _RETRY_STATUSES:
            raise Transient(f"http {resp.status_code}")
        if resp.status_code != 200:
            raise Permanent(f"http {resp.status_code}")
        return self._parse(resp, len(documents))

    def _parse(self, resp: httpx.Response, n: int) -> list[tuple[int, float]]:
        try:
            data = resp.json()
            rows = data["results"] if self._api == "v1" else data
            key = "relevance_score" if self._api == "v1" else "score"
            pairs = [(int(r["index"]), float(r[key])) for r in rows]
        except (ValueError, KeyError, TypeError):
            raise Permanent("malformed answer") from None
        if any(not 0 <= i < n for i, _ in pairs) or len({i for i, _ in pairs}) != len(pairs):
            raise Permanent("malformed answer (index out of range or repeated)")
        pairs.sort(key=lambda p: (-p[1], p[0]))
        return pairs


# -- chat --------------------------------------------------------------------------------


def chat(
    client: LLMClient,
    system: str,
    user: str,
    budget: Budget,
    *,
    retries: int,
    trace_id: str = "",
) -> str:
    """One chat completion inside the budget (retried while transient failures leave
    time)."""

    def attempt(timeout: float) -> str:
        try:
            text = client.chat_text_once(system, user, timeout=timeout)
        except LLMRetryable as exc:
            raise Transient(exc.detail) from None
        except LLMUnavailable as exc:
            raise Permanent(exc.detail) from None
        try:
            text.encode("utf-8")  # JSON can carry a lone surrogate (half an emoji); UTF-8 not
        except UnicodeEncodeError:
            raise Permanent("malformed answer (not UTF-8 text)") from None
        return text

    return call_within("chat", budget, attempt, retries=retries, trace_id=trace_id)
