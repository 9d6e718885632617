"""The one LLM client of the document graph: an OpenAI-compatible chat endpoint over httpx.

States the callers must tell apart (seed 003 §3.3):

* not configured (``LLMSettings.configured`` is false) -> callers answer ``collected=false`` with
  :data:`NOT_CONFIGURED_REASON`;
* unavailable (network, quota, 5xx after retries) -> :class:`LLMUnavailable` whose ``reason``
  carries the driver code, e.g. ``LLM_UNAVAILABLE: http 503``;
* local model (``provider="local"``) -> same contract; the model identity enters fingerprints.

The API key is read from an environment variable or a key file named by the settings; it never
lives in a configuration file itself.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from knowledge_server.httpcall import AnswerTooLarge, post_json

__all__ = [
    "NOT_CONFIGURED_REASON",
    "LLMClient",
    "LLMRetryable",
    "LLMSettings",
    "LLMUnavailable",
    "make_client",
    "without_delimiters",
]

NOT_CONFIGURED_REASON = "LLM not configured"
# Passes of a delimiter's substitution before the blunt one (without_delimiters): each
# pass undoes one level of nesting, and a text nested deeper was written to get past it.
DELIMITER_PASSES = 8


def without_delimiters(text: str, delimiter: re.Pattern[str], blunt: re.Pattern[str]) -> str:
    """Untrusted ``text`` for a prompt that frames it between delimiters: every match of
    ``delimiter`` replaced by a space, until none is left (taking one out can join the
    text around it into another: ``CHUNKCHUNK>>>>>>``). Past DELIMITER_PASSES passes (each
    reads the whole text again) every match of ``blunt`` goes instead, in one pass after
    which no delimiter can be left."""
    for _ in range(DELIMITER_PASSES):
        clean = delimiter.sub(" ", text)
        if clean == text:
            return clean
        text = clean
    return blunt.sub(" ", text)


_RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class LLMSettings:
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    provider: str = "openai"  # "openai" (any compatible endpoint) or "local"
    model_version: str = ""  # for local models: enters the fingerprint
    temperature: float = 0.0
    timeout_seconds: float = 60.0
    max_retries: int = 2
    backoff_seconds: float = 0.5

    @property
    def configured(self) -> bool:
        return bool(self.base_url) and bool(self.model)

    @property
    def identity(self) -> str:
        """What a fingerprint or cache key must know about the model."""
        return f"{self.provider}:{self.model}:{self.model_version}"


class LLMUnavailable(Exception):
    """The endpoint could not answer (after retries). ``reason`` is safe to return to clients."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        self.reason = f"LLM_UNAVAILABLE: {detail}"
        super().__init__(self.reason)


class LLMRetryable(LLMUnavailable):
    """A failure a retry may not repeat: a timeout, a connection error, 408/409/425/429/5xx."""


class LLMClient:
    """Calls ``POST {base_url}/v1/chat/completions`` and returns the assistant message text.

    Parsing that text is the caller's job: a malformed answer is a validation outcome to count,
    not a transport failure.
    """

    def __init__(
        self,
        settings: LLMSettings,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not settings.configured:
            raise ValueError(NOT_CONFIGURED_REASON)
        self.settings = settings
        self._sleep = sleep
        self._http = httpx.Client(
            timeout=settings.timeout_seconds, transport=transport, follow_redirects=False
        )
        self.calls = 0  # requests actually sent (retries included)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _api_key(self) -> str | None:
        s = self.settings
        if s.api_key_env:
            value = os.environ.get(s.api_key_env)
            if value:
                return value.strip()
        if s.api_key_file:
            path = Path(s.api_key_file).expanduser()
            if path.is_file():
                return path.read_text(encoding="utf-8").strip() or None
        return None

    def _body(self, system: str, user: str, *, json_mode: bool) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "temperature": s.temperature,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        }
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        return body

    def send_once(self, body: dict[str, Any], *, timeout: float | None = None) -> str:
        """One request, no retry: the message content, or :class:`LLMRetryable` (timeout,
        connection error, a retryable status) / :class:`LLMUnavailable` (any other failure,
        which a retry would repeat)."""
        s = self.settings
        url = s.base_url.rstrip("/") + "/v1/chat/completions"  # type: ignore[union-attr]
        headers = {"Content-Type": "application/json"}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.calls += 1
        try:
            resp = post_json(self._http, url, body, timeout=timeout, headers=headers)
        except AnswerTooLarge:
            raise LLMUnavailable("answer too large") from None
        except httpx.TimeoutException:
            raise LLMRetryable("timeout") from None
        except httpx.TransportError:
            raise LLMRetryable("connect error") from None
        if resp.status_code in _RETRY_STATUSES:
            raise LLMRetryable(f"http {resp.status_code}")
        if resp.status_code != 200:
            # 4xx other than the retryable ones: retrying will not help (auth, bad request).
            raise LLMUnavailable(f"http {resp.status_code}")
        try:
            payload = resp.json()
            content = payload["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise LLMUnavailable("bad envelope") from None
        if not isinstance(content, str):
            raise LLMUnavailable("bad envelope")
        return content

    def chat_text_once(self, system: str, user: str, *, timeout: float) -> str:
        """One plain-text chat completion within ``timeout`` seconds, no retry (the caller
        retries inside its own budget)."""
        return self.send_once(self._body(system, user, json_mode=False), timeout=timeout)

    def chat_json(self, system: str, user: str, *, until: float | None = None) -> str:
        """One chat completion asking for a JSON object; returns the message content.
        ``until`` (a ``time.monotonic()`` instant): every attempt, retry and wait ends by
        then (a caller answering a search has that long, not the endpoint's minutes)."""
        s = self.settings
        body = self._body(system, user, json_mode=True)
        last = "no attempt"
        for attempt in range(s.max_retries + 1):
            if attempt:
                pause = s.backoff_seconds * (2 ** (attempt - 1))
                if until is not None and time.monotonic() + pause >= until:
                    break
                self._sleep(pause)
            timeout = None
            if until is not None:
                timeout = min(s.timeout_seconds, until - time.monotonic())
                if timeout <= 0:
                    last = "timeout"
                    break
            try:
                return self.send_once(body, timeout=timeout)
            except LLMRetryable as exc:
                last = exc.detail
        raise LLMUnavailable(last)


def make_client(settings: LLMSettings | None) -> LLMClient | None:
    """A client when configured, else ``None`` (callers then report ``LLM not configured``)."""
    if settings is None or not settings.configured:
        return None
    return LLMClient(settings)
