"""Tokenisation shared by indexing and querying.

The FTS5 table has two columns:

* ``text`` – the redacted event text, tokenised by ``unicode61 remove_diacritics 2``
  (good for Latin, Cyrillic and other alphabetic scripts);
* ``aux`` – extra terms computed here: overlapping character bigrams of every CJK run
  (CJK has no spaces, so unicode61 would make a whole sentence one token) and the
  Snowball stem of every Cyrillic word (so ``чинил`` matches ``чинили``).

Queries are never passed to FTS5 as syntax: they are split into word tokens with a
Unicode regex (which drops every operator character) and each term is emitted as a
double-quoted string, OR-ed together, so BM25 ranks documents by how many and how rare
the matched terms are.
"""

from __future__ import annotations

import re

from knowledge_server.textlang import STOP_WORDS, stem_ru

__all__ = ["QueryTerm", "aux_terms", "query_terms"]

_WORD = re.compile(r"\w+", re.UNICODE)
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
_CYRILLIC = re.compile(r"[\u0400-\u04ff]")


def _cjk_grams(run: str) -> list[str]:
    if len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def aux_terms(text: str) -> str:
    """Return the ``aux`` column value for a document."""
    out: list[str] = []
    for run in _CJK_RUN.findall(text):
        out.extend(_cjk_grams(run))
    for word in _WORD.findall(text):
        if _CYRILLIC.search(word) and not _CJK_RUN.search(word):
            out.append(stem_ru(word))
    return " ".join(out)


class QueryTerm:
    """One FTS5 phrase: ``column`` is ``text`` or ``aux``; ``needle`` is used for snippets."""

    __slots__ = ("column", "needle", "stop", "term")

    def __init__(self, column: str, term: str, needle: str, stop: bool) -> None:
        self.column = column
        self.term = term
        self.needle = needle
        self.stop = stop

    def fts(self) -> str:
        # Inside an FTS5 string only '"' is special; tokens from _WORD never contain it,
        # but escape anyway so this stays safe if the tokeniser changes.
        return f'{self.column} : "{self.term.replace(chr(34), chr(34) * 2)}"'

    def key(self) -> tuple[str, str]:
        return (self.column, self.term)


def query_terms(query: str) -> list[QueryTerm]:
    """Split a free-text question into de-duplicated literal terms."""
    terms: list[QueryTerm] = []
    seen: set[tuple[str, str]] = set()

    def add(t: QueryTerm) -> None:
        if t.key() not in seen:
            seen.add(t.key())
            terms.append(t)

    for word in _WORD.findall(query.replace("\x00", " ")):
        low = word.lower()
        pos = 0
        for m in _CJK_RUN.finditer(low):
            _add_plain(low[pos : m.start()], add)
            for g in _cjk_grams(m.group(0)):
                add(QueryTerm("aux", g, g, False))
            pos = m.end()
        _add_plain(low[pos:], add)
    return terms


def _add_plain(word: str, add) -> None:  # type: ignore[no-untyped-def]
    word = word.strip("_")
    if not word:
        return
    stop = word in STOP_WORDS
    if _CYRILLIC.search(word):
        st = stem_ru(word)
        add(QueryTerm("aux", st, st, stop))
    else:
        add(QueryTerm("text", word, word, stop))
