"""Identifier-aware tokens for the lexical index.

FTS5's ``unicode61`` tokenizer keeps ``getUserName`` as one token and has no idea
that it means "get user name". We therefore index a pre-tokenised column in which
every identifier is split into lower-case words (camelCase, snake_case, digits) and
the whole identifier is kept too, so both ``user name`` and ``getUserName`` match.
"""

from __future__ import annotations

import re
from functools import lru_cache

_WORD = re.compile(r"\w+")
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^\W\d_]+")

# Query words that match nearly every chunk and carry no meaning for "where is it".
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "with",
    ]
)


@lru_cache(maxsize=200_000)
def split_identifier(word: str) -> tuple[str, ...]:
    """``getUserName`` -> (``get``, ``user``, ``name``, ``getusername``)."""
    parts: list[str] = []
    for piece in word.split("_"):
        if piece:
            parts.extend(p.lower() for p in _PART.findall(piece))
    if not parts:
        return ()
    if len(parts) > 1:
        parts.append("".join(parts))
    return tuple(parts)


@lru_cache(maxsize=200_000)
def _joined(word: str) -> str:
    return " ".join(split_identifier(word))


def index_tokens(text: str) -> str:
    """Space-separated tokens for the FTS column (order kept, repeats kept for tf)."""
    return " ".join(map(_joined, _WORD.findall(text)))


def query_terms(text: str) -> list[str]:
    """Distinct query terms, in order, without stopwords (unless nothing else is left)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text):
        for tok in split_identifier(word):
            seen.setdefault(tok, None)
    terms = list(seen)
    kept = [t for t in terms if t not in STOPWORDS]
    return kept or terms


def token_set(text: str) -> set[str]:
    out: set[str] = set()
    for word in set(_WORD.findall(text)):
        out.update(split_identifier(word))
    return out


def fts_quote(term: str) -> str:
    """A literal FTS5 string: operators, colons, stars and quotes lose their meaning."""
    return '"' + term.replace("\x00", "").replace('"', '""') + '"'
