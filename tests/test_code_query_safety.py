"""Query text is literal: FTS5 syntax in a query never raises or changes meaning."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.code import CodeIndex
from knowledge_server.code.tokenize import (
    fts_quote,
    index_tokens,
    matched_terms,
    query_terms,
    split_identifier,
    token_set,
)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> CodeIndex:
    base = tmp_path_factory.mktemp("q")
    ws = base / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def near_star(x):\n    return x  # NEAR AND OR NOT\n")
    ix = CodeIndex(str(base / "code.sqlite"))
    ix.index_workspace(str(ws))
    yield ix
    ix.close()


def test_identifier_splitting() -> None:
    assert split_identifier("getUserName") == ("get", "user", "name", "getusername")
    assert split_identifier("get_user_name") == ("get", "user", "name", "getusername")
    assert split_identifier("HTTPServer2") == ("http", "server", "2", "httpserver2")
    assert split_identifier("x") == ("x",)
    assert index_tokens("parseJSON(data)") == "parse json parsejson data"
    assert query_terms("the user of a name") == ["user", "name"]
    assert fts_quote('a"b\x00') == '"a""b"'


def test_a_question_of_stopwords_alone_has_no_terms_but_code_words_stay() -> None:
    """A question of stopwords alone ("what is this") names nothing to look for: no
    terms, so the code lane finds nothing (it used to search the stopwords themselves and
    return whatever held them). A word written as code is a name, kept whatever it is."""
    assert query_terms("what is this") == []
    assert query_terms("Where is it?") == []
    assert query_terms("remove the `this` binding") == ["remove", "this", "binding"]
    # A name written as code is kept whole; its stopword parts are not words of their own.
    assert query_terms("`isNot` helper") == ["isnot", "helper"]
    assert query_terms("`whatIsThis`") == ["whatisthis"]
    # Contractions: "what's", "I'm" lose their ending; "isn't", "don't" are stopwords whole.
    for question in ("what's this", "what\u2019s this", "I'm here", "where's it", "don't"):
        assert query_terms(question) == [], question
    assert query_terms("user's config isn't loaded") == ["user", "config", "loaded"]
    assert query_terms("`Request`'s body") == ["request", "body"]
    # A quoted word is no contraction: Python's 're', a header's 's-maxage'.
    assert query_terms("why does 're.sub' fail") == ["re", "sub", "fail"]
    assert query_terms("the 's-maxage' header") == ["s", "maxage", "header"]


SYNTAX = [
    '"',
    "*",
    "NEAR",
    "NEAR(",
    "-",
    ":",
    "\x00",
    "(",
    ")",
    "^",
    "AND",
    "OR",
    "NOT",
    "{",
    "}",
    "+",
    "'",
    "tokens:",
    "meta : x",
    "a*",
    "NEAR(a b, 2)",
    "--",
    ";",
    "\\",
]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(st.sampled_from(SYNTAX), st.text(max_size=12)), max_size=8))
def test_any_query_text_is_safe(index: CodeIndex, parts: list[str]) -> None:
    query = " ".join(parts)
    for mode in ("lexical", "hybrid"):
        res = index.search(query, mode=mode, check_fresh=False)
        assert isinstance(res.hits, list)


@pytest.mark.parametrize(
    "query", ['near_star"', "NEAR", "near*", "-near", "a:near", "near\x00star"]
)
def test_operators_are_words(index: CodeIndex, query: str) -> None:
    res = index.search(query, mode="lexical", check_fresh=False)
    assert res.hits and res.hits[0].symbol == "near_star"


_WORDS = st.sampled_from(
    [
        "getUserName",
        "get_user_name",
        "HTTPServer",
        "parse2json",
        "test",
        "latest",
        "ΣΊΣΥΦΟΣ",
        "straße",
        "İstanbul",
        "кто",
        "чинил",
        "会员",
        "user",
        "name",
        "x",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(_WORDS | st.text(min_size=1, max_size=8), max_size=25),
    query=st.lists(_WORDS | st.text(min_size=1, max_size=6), min_size=1, max_size=5),
)
def test_matched_terms_agrees_with_full_tokenisation(words: list[str], query: list[str]) -> None:
    """The cheap `why` explanation names exactly the query terms that are tokens of the chunk."""
    text = " ".join(words)
    terms = query_terms(" ".join(query))
    full = token_set(text)
    assert matched_terms(text, terms) == [t for t in terms if t in full]


def test_a_question_of_more_words_than_one_mask_holds_still_finds(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The relevance floor asks which of the question's telling words each best file
    holds, 62 words to a query (a 64-bit mask): a question of 90 words, all of them in
    one file and none in the other, finds that file first, with every word counted."""
    base = tmp_path_factory.mktemp("many")
    ws = base / "ws"
    ws.mkdir()
    letters = "bcdfghjklmnpqrstvwxz"
    words = [f"kx{a}{b}" for a in letters for b in letters][:90]
    body = "".join(f"    {w} = {i}\n" for i, w in enumerate(words))
    (ws / "many.py").write_text(f"def holder():\n{body}    return 0\n")
    (ws / "other.py").write_text("def unrelated(value):\n    return value\n")
    ix = CodeIndex(str(base / "code.sqlite"))
    try:
        ix.index_workspace(str(ws))
        found = ix.search(" ".join(words), mode="lexical", check_fresh=False)
        assert found.hits and found.hits[0].path.endswith("many.py")
        assert ix.search(" ".join(words[:3]), mode="lexical", check_fresh=False).hits
    finally:
        ix.close()
