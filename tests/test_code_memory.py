"""The code store's full-text tables in memory (``code.memory``): a search answered from
the copy returns what SQL returns (the same hits, scores, explanations and snippets, in
the same order), a copy is never used for a state of the store it was not built for, a
new revision tokenises only its new rows, and a one-off search builds nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from knowledge_server.code import CodeIndex, memory
from knowledge_server.code import search as search_mod

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "where is the config loaded",
    "load_config",
    "parse the request headers",
    "Fix: retry the embedding call after a timeout",
    "audit log verify chain",
    "how are secrets redacted before indexing",
    "tenant isolation workspace scope",
    "fts5 bm25 weights",
    "RevisionMemo",
    "gRPC deadline exceeded",
    "release notes changelog",
    "test: licence signature",
    "xyzzy frobnicate 3f2a9c",
    "the and of",
]


def _answers(idx: CodeIndex, q: str, **kw: Any) -> list[tuple[Any, ...]]:
    res = idx.search(q, check_fresh=False, describe_hits=True, **kw)
    return [(h.chunk_id, h.path, h.start_line, h.score, tuple(h.why), h.snippet) for h in res.hits]


def _by_sql(idx: CodeIndex, q: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[Any]:
    with monkeypatch.context() as m:
        m.setattr(memory, "ready", lambda conn, key: None)
        m.setattr(memory, "held", lambda filename: None)
        return _answers(idx, q, **kw)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CodeIndex, list[str]]]:
    """This repository's server package and its docs, two workspaces of one store."""
    roots = [str(ROOT / "server" / "knowledge_server"), str(ROOT / "docs")]
    idx = CodeIndex(str(tmp_path_factory.mktemp("mem") / "code.sqlite"))
    for r in roots:
        idx.index_workspace(r)
    try:
        yield idx, roots
    finally:
        memory.forget(idx.conn.filename)
        idx.close()


def test_the_copy_answers_every_question_as_sql_does(
    store: tuple[CodeIndex, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hits, scores, "lex:" explanations and snippets from the copy equal SQL's, for
    every scope: the whole store, each workspace, both, a path filter; hybrid and
    lexical; with the find_code and find_knowledge priors."""
    idx, roots = store
    mem = memory.warm(idx.conn, wait=True)
    assert mem is not None and len(mem.chunk_meta) > 500
    scopes: list[dict[str, Any]] = [
        {},
        {"workspaces": roots[:1]},
        {"workspaces": roots[1:]},
        {"workspaces": roots},
        {"workspaces": roots[:1], "path_prefixes": ["code/", "lanes/"]},
        {"path_prefixes": ["kb"]},
    ]
    used = 0
    real = search_mod._Held.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *a: Any) -> Any:
        nonlocal used
        held = real(cls, *a)
        used += held is not None
        return held

    compared = 0
    for q in QUESTIONS:
        for scope in scopes:
            for mode, intent in (("hybrid", "find_code"), ("lexical", "find_knowledge")):
                kw = {**scope, "mode": mode, "intent": intent, "limit": 30}
                expected = _by_sql(idx, q, monkeypatch, **kw)
                with monkeypatch.context() as m:
                    m.setattr(search_mod._Held, "of", classmethod(counted))
                    got = _answers(idx, q, **kw)
                assert got == expected, (q, scope, mode)
                compared += bool(expected)
    assert used == len(QUESTIONS) * len(scopes) * 2  # every search was answered from memory
    assert compared > 100


def test_a_copy_serves_only_the_state_it_was_built_for(tmp_path: Path) -> None:
    """After a new revision the held copy is not used (SQL answers, with the new text),
    and the next build tokenises only the new file version's chunks."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    for i in range(8):
        (ws / "pkg" / f"mod{i}.py").write_text(
            f"def handler_{i}(request):\n    return render_template_{i}(request)\n"
        )
    idx = CodeIndex(str(tmp_path / "code.sqlite"))
    try:
        idx.index_workspace(str(ws))
        first = memory.warm(idx.conn, wait=True)
        assert first is not None and first.tokenised == len(first.chunk_meta)
        (ws / "pkg" / "mod3.py").write_text("def quokka_gateway(payload):\n    return payload\n")
        idx.index_workspace(str(ws))
        with idx.conn:
            key = memory.state_key(idx.conn)
        assert key != first.key and memory.ready(idx.conn, key) is None
        hits = idx.search("quokka gateway", check_fresh=False).hits
        assert hits and hits[0].path == "pkg/mod3.py"
        second = memory.warm(idx.conn, wait=True)
        assert second is not None and second.key == key
        new_chunks = len(second.chunk_meta) - len(first.chunk_meta)
        assert new_chunks >= 1 and second.tokenised == new_chunks
        assert idx.search("quokka gateway", check_fresh=False).hits[0].path == "pkg/mod3.py"
    finally:
        memory.forget(idx.conn.filename)
        idx.close()


def test_a_one_off_search_builds_no_copy(tmp_path: Path) -> None:
    """A process that did not enable the store (the CLI's one-off search, a script)
    answers by SQL and builds nothing; an enabled store's search starts one build."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def load_config(path):\n    return read_settings(path)\n")
    idx = CodeIndex(str(tmp_path / "code.sqlite"))
    try:
        idx.index_workspace(str(ws))
        assert idx.search("load config", check_fresh=False).hits
        assert memory.held(idx.conn.filename) is None
        memory.enable(idx.conn.filename)
        assert idx.search("load config", check_fresh=False).hits  # answered by SQL
        assert memory.warm(idx.conn, wait=True) is not None
    finally:
        memory.cancel(idx.conn.filename)
        idx.close()
