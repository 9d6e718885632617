"""Routing cue matching (seed 000 §6): the precompiled matcher finds exactly the cues the
plain rule finds: CJK cues and phrases as substrings, short cues as whole words, cues of
four or more letters as the beginning of a word."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.search.routing import _CJK, CUES, _matches, route

_WORD = re.compile(r"\w+", re.UNICODE)
_ALL_CUES = [c for cues in CUES.values() for c in cues]


def _reference(query: str) -> dict[str, list[str]]:
    words = [w.lower() for w in _WORD.findall(query)]
    lowered = query.lower()
    found: dict[str, list[str]] = {}
    for intent, cues in CUES.items():
        hits = []
        for cue in cues:
            if _CJK.search(cue):
                ok = cue in query
            elif " " in cue:
                ok = cue in lowered
            elif len(cue) >= 4:
                ok = any(w.startswith(cue) for w in words)
            else:
                ok = cue in words
            if ok:
                hits.append(cue)
        if hits:
            found[intent] = hits
    return found


_PIECES = st.sampled_from(_ALL_CUES).flatmap(
    lambda c: st.sampled_from([c, c.upper(), c + "ing", c[:-1], "x" + c, c + " "])
) | st.text(max_size=8)


@settings(max_examples=500, deadline=None)
@given(st.lists(_PIECES, max_size=6))
def test_matches_equal_the_plain_rule(pieces: list[str]) -> None:
    query = " ".join(pieces)
    assert _matches(query) == _reference(query)


def test_routes_of_known_questions() -> None:
    assert route("who fixed the failing test", "auto", ("episodes", "code")).intent == "find_agent"
    assert route("where is the json decoder defined", "auto", ("code",)).intent == "find_code"
    assert route("ничего", "auto", ("code",)).intent == "find_knowledge"
