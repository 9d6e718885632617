"""Identifier-aware tokens for the lexical index.

FTS5's ``unicode61`` tokenizer keeps ``getUserName`` as one token and has no idea
that it means "get user name". We therefore index a pre-tokenised column in which
every identifier is split into lower-case words (camelCase, snake_case, digits) and
the whole identifier is kept too, so both ``user name`` and ``getUserName`` match.
"""

from __future__ import annotations

import re
from functools import lru_cache

from knowledge_server.textlang import STOP_WORDS

_WORD = re.compile(r"\w+")
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^\W\d_]+")


def _split(word: str) -> tuple[str, ...]:
    # No alternative of _PART matches "_", so snake_case needs no separate split.
    parts = [p.lower() for p in _PART.findall(word)]
    if len(parts) > 1:
        parts.append("".join(parts))
    return tuple(parts)


@lru_cache(maxsize=200_000)
def split_identifier(word: str) -> tuple[str, ...]:
    """``getUserName`` -> (``get``, ``user``, ``name``, ``getusername``). Cached, for
    indexing; a question's words go through ``split_uncached``."""
    return _split(word)


split_uncached = _split


class _JoinedCache(dict[str, str]):
    """word -> its tokens joined by spaces. A plain dict lookup per word (indexing
    looks up millions of words; an ``lru_cache`` hit costs more), emptied
    when it grows past its bound."""

    MAX_WORDS = 200_000

    def __missing__(self, word: str) -> str:
        if len(self) >= self.MAX_WORDS:
            self.clear()
        joined = self[word] = " ".join(_split(word))
        return joined


_joined = _JoinedCache()

# ASCII text: every character that ``\w`` does not match becomes a space, so
# ``str.split`` yields exactly the words of ``_WORD.findall`` at a fraction of the cost.
_ASCII_NON_WORD = str.maketrans(
    {c: " " for c in map(chr, range(128)) if not (c.isalnum() or c == "_")}
)


def _words(text: str) -> list[str]:
    if text.isascii():
        return text.translate(_ASCII_NON_WORD).split()
    return _WORD.findall(text)


def index_tokens(text: str) -> str:
    """Space-separated tokens for the FTS column (order kept, repeats kept for tf)."""
    return " ".join(map(_joined.__getitem__, _words(text)))


_WRITTEN_AS_CODE = re.compile(r"`([^`]+)`")
# English contractions: "what's", "I'm", "we'll", "they've", "you'd" lose their ending, and
# a negated auxiliary ("don't", "isn't", "can't") is a stopword whole; otherwise the
# apostrophe splits them into "s", "m", "t", "isn", words in every file.
# The ending needs a word (or a name in backticks) before its apostrophe: a quoted 're' or
# 's-maxage' stays.
_CONTRACTION = re.compile(r"(?i)\b\w+n['\u2019]t\b|(?<=[\w`])['\u2019](?:s|m|re|ve|ll|d)\b")


def query_terms(text: str) -> list[str]:
    """Distinct query terms, in order, without stopwords. A word written as code
    (`` `this` ``, `` `isNot` `` as ``isnot``) is kept whatever it is, its stopword parts
    not; a question of stopwords alone ("what is this", "where's it") has no terms: it
    names nothing to look for, so it finds nothing."""
    seen: dict[str, None] = {}
    # Not through split_identifier's cache: every question brings words no other has, and a
    # question's few words are split in microseconds (bench/RESULTS.md, soak memory).
    for word in _WORD.findall(_CONTRACTION.sub(" ", text)):
        for tok in split_uncached(word):
            seen.setdefault(tok, None)
    # A name written as code is kept whole: the last token of a split word is all its parts.
    written = {
        parts[-1]
        for span in _WRITTEN_AS_CODE.findall(text)
        for word in _WORD.findall(span)
        if (parts := split_uncached(word))
    }
    return [t for t in seen if t not in STOP_WORDS or t in written]


def token_set(text: str) -> set[str]:
    out: set[str] = set()
    for word in set(_WORD.findall(text)):
        out.update(split_identifier(word))
    return out


def matched_terms(text: str, terms: list[str]) -> list[str]:
    """The ``terms`` that are tokens of ``text``: the same answer as ``token_set``.

    A token is a lower-cased part of a word, or all its parts joined (the word without
    underscores), so only the words where an ASCII term occurs, or that spell it with
    underscores, are split instead of the whole text. Terms whose case mapping may
    change lengths are checked against the full token set."""
    low = text.lower()
    simple = len(low) == len(text)
    flat = low.replace("_", "") if "_" in low else low
    full: set[str] | None = None
    around: _Around | None = None
    out = []
    for term in terms:
        if term.isascii() and simple:
            found = False
            if term in flat:
                around = _Around(text, low) if around is None else around
                found = around.has(term)
        else:
            full = token_set(text) if full is None else full
            found = term in full
        if found:
            out.append(term)
    return out


# A run of word characters (regex \w: letters, digits, "_"), possibly empty.
_WORD_RUN = re.compile(r"\w*")


class _Around:
    """One text's words around the places a term occurs. Word boundaries are found by
    the regex engine, forwards in the lower-cased text and backwards in its reverse, where
    a character loop in Python was a chunk explanation's main cost; the words that spell
    a term with underscores are looked up by their joined form, where one regex per term
    scanned the whole text."""

    def __init__(self, text: str, low: str) -> None:
        self.text, self.low = text, low
        self._reverse: str | None = None
        self._joined: dict[str, list[str]] | None = None

    def has(self, term: str) -> bool:
        return self._in_words_around(term) or self._spelled_with_underscores(term)

    def _in_words_around(self, term: str) -> bool:
        """Whether ``term`` is a token of a word in which it occurs."""
        text, low = self.text, self.low
        if self._reverse is None:
            self._reverse = low[::-1]
        reverse, n = self._reverse, len(low)
        seen: set[str] = set()
        pos = low.find(term)
        while pos >= 0:
            before = _WORD_RUN.match(reverse, n - pos).end() - (n - pos)  # type: ignore[union-attr]
            start = pos - before
            end = _WORD_RUN.match(low, pos + len(term)).end()  # type: ignore[union-attr]
            word = text[start:end]
            if word not in seen:
                seen.add(word)
                if term in split_identifier(word):
                    return True
            pos = low.find(term, end)
        return False

    def _spelled_with_underscores(self, term: str) -> bool:
        """Whether ``term`` is the joined form of a word written with underscores."""
        if "_" not in self.text:
            return False
        if self._joined is None:
            self._joined = {}
            for word in _WORD.findall(self.text):
                if "_" in word:
                    self._joined.setdefault(word.lower().replace("_", ""), []).append(word)
        return any(term in split_identifier(w) for w in self._joined.get(term, ()))


def fts_quote(term: str) -> str:
    """A literal FTS5 string: operators, colons, stars and quotes lose their meaning."""
    return '"' + term.replace("\x00", "").replace('"', '""') + '"'
