"""One HTTP request to a model server (embedder, reranker, chat) with a limit on the whole
call, not only on each network step.

httpx's ``timeout`` bounds each step (connecting, writing, each read): a server that sends
its answer a byte at a time, each byte within the read timeout, would hold the calling
thread for as long as it likes, and the knowledge base's retrieval pool has two threads for
every organisation. ``post_json`` reads the answer's body in chunks and gives up with
``httpx.ReadTimeout`` once ``timeout`` seconds have passed since the call began (the last
read may take up to ``timeout`` more), so the callers' handling of a timeout applies. The
status line and headers are bounded by httpx's per-read timeout only (a server that sends
them a byte at a time is not cut off until its body starts).

An answer larger than ``MAX_ANSWER_BYTES`` is ``AnswerTooLarge``: not a transport failure,
so the callers do not retry it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

__all__ = ["MAX_ANSWER_BYTES", "AnswerTooLarge", "post_json", "without_userinfo"]

# The largest answer read (a chat completion or a batch of embeddings is far smaller).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class AnswerTooLarge(Exception):
    """A model server's answer is larger than ``MAX_ANSWER_BYTES``: it would be as large
    again, so it is a malformed answer, not a reason to retry."""


def post_json(
    client: httpx.Client,
    url: str,
    body: Any,
    *,
    timeout: float | None,
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    """POST ``body`` as JSON; the response with its whole body, read within ``timeout``
    seconds of the call's start (None: the client's own timeouts only)."""
    started = time.monotonic()
    kwargs: dict[str, Any] = {"json": body, "headers": headers}
    if timeout is not None:
        kwargs["timeout"] = timeout
    with client.stream("POST", url, **kwargs) as resp:
        chunks: list[bytes] = []
        size = 0
        for chunk in resp.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise AnswerTooLarge(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
            if timeout is not None and time.monotonic() - started > timeout:
                raise httpx.ReadTimeout(f"the answer did not end within {timeout:g}s")
        content = b"".join(chunks)
    # The chunks are decoded already: the answer is given without its transfer headers.
    kept = {
        k: v
        for k, v in resp.headers.items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    }
    return httpx.Response(resp.status_code, headers=kept, content=content, request=resp.request)


def without_userinfo(url: str) -> str:
    """``url`` without the ``user:password@`` part of its host, if any: what may be kept
    (an identity stored with vectors) or shown."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
