"""Language data shared by every lane that tokenises text: stop words and stemming.

One stop-word list per language, used by every lane: the episodes, skills and code lanes
drop stop words from a query unless nothing else is left, the code lane's hashing embedder
leaves them out of its word pairs, and the document graph drops them (with
:data:`REQUEST_WORDS`) when it turns a question into keywords without a model.

Russian words are stemmed with the Snowball algorithm, so ``чинил`` and ``чинили`` index
the same term. Stores that keep stemmed terms record :data:`RU_STEMMER` and recompute
them when it changes.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import version

import snowballstemmer

__all__ = [
    "REQUEST_WORDS",
    "RU_STEMMER",
    "STOP_WORDS",
    "STOP_WORDS_EN",
    "STOP_WORDS_RU",
    "stem_ru",
]

STOP_WORDS_EN = frozenset(
    [
        "a",
        "about",
        "all",
        "also",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "done",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "here",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "just",
        "me",
        "more",
        "most",
        "my",
        "no",
        "not",
        "of",
        "on",
        "only",
        "or",
        "our",
        "over",
        "shall",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "under",
        "us",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "yes",
        "you",
        "your",
    ]
)

# Words with ``ё`` are listed in both spellings: most people type ``е`` instead.
STOP_WORDS_RU = frozenset(
    [
        "бы",
        "был",
        "была",
        "были",
        "в",
        "во",
        "вы",
        "где",
        "для",
        "до",
        "его",
        "есть",
        "ещё",
        "еще",
        "её",
        "ее",
        "же",
        "за",
        "зачем",
        "и",
        "из",
        "или",
        "их",
        "к",
        "как",
        "ко",
        "когда",
        "кто",
        "ли",
        "мы",
        "на",
        "не",
        "ни",
        "о",
        "об",
        "он",
        "она",
        "они",
        "от",
        "по",
        "почему",
        "с",
        "со",
        "та",
        "те",
        "тот",
        "ты",
        "у",
        "уже",
        "что",
        "эта",
        "эти",
        "это",
        "этот",
        "я",
    ]
)

STOP_WORDS = STOP_WORDS_EN | STOP_WORDS_RU

# Verbs that phrase a request ("show me the themes", "list all EIPs"): noise when a
# question becomes search keywords, but real words in code and session text.
REQUEST_WORDS = frozenset({"find", "give", "list", "show", "tell"})

# Identity of the Russian stemmer, recorded by stores that keep stemmed terms: a new
# release of the algorithm may stem some words differently.
RU_STEMMER = f"snowball-russian-{version('snowballstemmer')}"

_RUSSIAN = snowballstemmer.stemmer("russian")
_ENGLISH = snowballstemmer.stemmer("english")


@lru_cache(maxsize=100_000)
def stem_ru(word: str) -> str:
    """The Snowball stem of a Russian word, lower-cased (``ё`` folds into ``е``).

    Cached: the stemmer is pure Python and indexing stems every Cyrillic word it meets,
    while a language's inflected forms in real text are comparatively few."""
    return str(_RUSSIAN.stemWord(word.lower()))


@lru_cache(maxsize=20_000)
def stem_en(word: str) -> str:
    """The Snowball (Porter 2) stem of an English word, lower-cased."""
    return str(_ENGLISH.stemWord(word.lower()))
