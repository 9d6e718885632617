"""Query text is literal: FTS5 syntax in a query never raises or changes meaning."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.code import CodeIndex
from knowledge_server.code.tokenize import fts_quote, index_tokens, query_terms, split_identifier


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
