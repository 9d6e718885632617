"""The code store's full-text tables in memory (``code.memory``): a search answered from
the copy returns what SQL returns (the same hits, scores, explanations and snippets, in
the same order), a copy is never used for a state of the store it was not built for, a
new revision tokenises only its new rows, and a one-off search builds nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from knowledge_server.code import CodeIndex, memory
from knowledge_server.code import search as search_mod
from knowledge_server.code.embed import HashingEmbedder
from knowledge_server.lanes.code import CodeLane

from tests.code_memory_paths import answers, both_ways

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


def test_the_copy_answers_every_question_as_sql_does(store: tuple[CodeIndex, list[str]]) -> None:
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
    used = compared = 0
    for q in QUESTIONS:
        for scope in scopes:
            for mode, intent in (("hybrid", "find_code"), ("lexical", "find_knowledge")):
                kw = {**scope, "mode": mode, "intent": intent, "limit": 30}
                expected, got, from_copy = both_ways(idx, q, **kw)
                assert got == expected, (q, scope, mode)
                used += from_copy
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


def _store_of(tmp_path: Path, files: dict[str, str]) -> CodeIndex:
    ws = tmp_path / "ws"
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    idx = CodeIndex(str(tmp_path / "code.sqlite"))
    idx.index_workspace(str(ws))
    return idx


def test_a_one_off_search_builds_no_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that did not enable the store (the CLI's one-off search, a script)
    answers by SQL and starts no build; an enabled store's search starts one for a state
    it saw SETTLE_S before (not for each commit of an index run)."""
    idx = _store_of(tmp_path, {"a.py": "def load_config(path):\n    return read_settings(path)\n"})
    f = idx.conn.filename
    try:
        assert idx.search("load config", check_fresh=False).hits
        assert f not in memory._builds.building and memory.held(f) is None
        memory.enable(f)
        assert idx.search("load config", check_fresh=False).hits  # first sight of this state
        assert f not in memory._builds.building and memory.held(f) is None
        monkeypatch.setattr(memory, "SETTLE_S", 0.0)
        assert idx.search("load config", check_fresh=False).hits  # answered by SQL ...
        deadline = time.monotonic() + 30  # ... while the search started a build
        while memory.held(f) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert memory.held(f) is not None
    finally:
        memory.cancel(f)
        idx.close()


def test_closing_stops_and_drops_the_copy(tmp_path: Path) -> None:
    """A closed store (``cancel``, what the lane's close does) keeps no copy: a build under
    way is dropped when it ends, a late warm-up builds nothing, until enabled again. A
    lane's close cancels its store."""
    files = {f"m/f{i:03}.py": f"def handler_{i}():\n    return {i}\n" for i in range(300)}
    idx = _store_of(tmp_path, files)
    f = idx.conn.filename
    try:
        memory.enable(f)
        memory.warm(idx.conn, wait=False)
        memory.cancel(f)
        while f in memory._builds.building:
            time.sleep(0.01)
        assert memory.held(f) is None
        assert memory.warm(idx.conn, wait=True) is None and memory.held(f) is None
        memory.enable(f)
        assert memory.warm(idx.conn, wait=True) is not None
    finally:
        memory.cancel(f)
        idx.close()
    data = tmp_path / "lane"
    data.mkdir()
    with CodeIndex(str(data / "code.sqlite")) as ix:
        ix.index_workspace(str(tmp_path / "ws"))
    lane = CodeLane(data)
    lane.preload_memory(wait=True)
    lane_file = lane._db_file
    assert memory.held(lane_file) is not None
    lane.close()
    assert memory.held(lane_file) is None and lane_file not in memory._builds.enabled


def test_past_the_sql_cuts_ties_and_scopes_answer_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where SQL keeps the best matches of the whole table before it applies the scope
    (200 files, 3 x limit chunks), the answer is still the best of the scope: with a path
    filter that leaves out most files, with old revisions' rows in the table, and with
    equal scores across the cut (300 files of the same shape) both ways give the same
    hits in the same order (score, then path and line). The frequent-term pruning of
    chunks and files runs too (its thresholds lowered)."""
    files = {f"gen/f{i:03}.py": "def handler():\n    return 1\n" for i in range(300)}
    files |= {
        f"app/mod{i:02}.py": f"def handler_{i}(request):\n    return render(request, {i})\n"
        for i in range(40)
    }
    files |= {
        f"tests/test_{i:02}.py": f"def test_handler_{i}():\n    assert handler()\n"
        for i in range(20)
    }
    idx = _store_of(tmp_path, files)
    try:
        for i in range(10):  # new versions: higher row ids; the old ones stay as history
            (tmp_path / "ws" / f"gen/f{i:03}.py").write_text("def handler():\n    return 2\n")
        idx.index_workspace(str(tmp_path / "ws"))
        assert idx.conn.execute("SELECT count(*) FROM file_versions").fetchone()[0] > 300
        monkeypatch.setattr(search_mod, "_PRUNE_FROM", 50)
        monkeypatch.setattr(search_mod, "_FILE_PRUNE_FROM", 50)
        mem = memory.warm(idx.conn, wait=True)
        assert mem is not None
        scopes: list[dict[str, Any]] = [
            {},
            {"path_prefixes": ["app/"]},
            {"path_prefixes": ["tests/"]},
            {"path_prefixes": ["gen/"]},
            {"workspaces": [str(tmp_path / "ws")]},
        ]
        used = n = 0
        for q in ["handler", "handler return", "render the request handler", "test handler"]:
            for scope in scopes:
                for mode in ("lexical", "hybrid"):
                    kw = {**scope, "mode": mode, "intent": "find_code", "limit": 10}
                    expected, got, from_copy = both_ways(idx, q, **kw)
                    assert got == expected, (q, scope, mode)
                    used += from_copy
                    n += 1
        assert used == n
    finally:
        memory.forget(idx.conn.filename)
        idx.close()


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


SCOPED_QUESTIONS = [
    "zentrik",
    "zentrik parcel",
    "load the config",
    "config parcel handler",
    "Fix the parcel retry timeout",
]


@pytest.mark.parametrize(("dim", "b_files"), [(256, 60), (256, 12), (250, 60), (250, 12)])
def test_another_workspace_moves_no_scoped_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dim: int, b_files: int
) -> None:
    """ISO-1, statistics: a search scoped to workspace A answers the same (hits, scores,
    explanations, snippets, and whether the relevance floor lets any through) whether or
    not workspace B of the same store holds the question's words, through SQL and from
    the copy in memory, in hybrid, lexical and vector mode; with binary vectors (256
    dimensions) and float ones (250), B larger than A and smaller (a scope of most of the
    store is ranked without narrowing to its ids), and the vectors' KNN bound low (as a
    store of many more vectors than it takes). B's files do move the store-wide
    statistics (a word's document frequency, an unscoped search's scores), so the case
    can fail: ranked with those, A's caller could probe B's code for a word."""
    monkeypatch.setattr(search_mod, "_MAX_K", 80)
    a, b = tmp_path / "a", tmp_path / "b"
    _write_tree(
        a,
        {
            f"src/mod{i}.py": f"def handler_{i}(parcel, timeout={i}):\n"
            f"    return retry(parcel, timeout)\n\n"
            f"def load_config_{i}(path):\n    return read_settings(path, {i})\n"
            for i in range(20)
        }
        | {
            "src/ship.py": "def ship(parcel):\n    return handler_0(parcel, 3)\n",
            "src/__": "{ } ;\n",
        },
    )
    idx = CodeIndex(str(tmp_path / "code.sqlite"), embedder=HashingEmbedder(dim=dim))
    try:
        idx.index_workspace(str(a))
        scope = {"workspaces": [str(a)]}

        def answers_now() -> dict[tuple[str, str], list[Any]]:
            assert memory.warm(idx.conn, wait=True) is not None
            out = {}
            for q in SCOPED_QUESTIONS:
                for mode in ("hybrid", "lexical", "vector"):
                    kw = {**scope, "mode": mode, "intent": "find_code", "limit": 10}
                    by_sql, got, from_copy = both_ways(idx, q, **kw)
                    assert got == by_sql, (q, mode)
                    assert from_copy or mode == "vector", (q, mode)
                    out[(q, mode)] = got
            return out

        before = answers_now()
        assert any(before.values()), "A's own questions found nothing: the case cannot fail"
        unscoped = answers(idx, "config parcel handler", mode="lexical", intent="find_code")
        assert search_mod._doc_freqs(idx.conn, ["zentrik"])[0]["zentrik"] == 0
        # B: files of the probed words, among others.
        _write_tree(
            b,
            {
                f"pkg/zentrik_{i}.py": f"ZENTRIK = {i}\n\ndef zentrik_config(parcel):\n"
                f"    return zentrik(parcel, config={i})  # load the config parcel handler\n"
                for i in range(b_files // 2)
            }
            | {
                f"pkg/other_{i}.py": f"def other_{i}():\n    return {i}\n"
                for i in range(b_files // 2)
            },
        )
        idx.index_workspace(str(b))
        assert search_mod._doc_freqs(idx.conn, ["zentrik"])[0]["zentrik"] > 0
        assert answers(idx, "config parcel handler", mode="lexical", intent="find_code") != (
            unscoped
        )
        assert answers_now() == before
    finally:
        memory.forget(idx.conn.filename)
        idx.close()


def test_a_scope_without_tokens_answers_nothing(tmp_path: Path) -> None:
    """A workspace whose files hold no word at all (punctuation under names of
    underscores) has no token to average over: a search scoped to it answers nothing, by
    SQL and from the copy alike, while another workspace holds the word asked for."""
    z, b = tmp_path / "z", tmp_path / "b"
    _write_tree(z, {"__": "{ } ;\n+ - *\n", "___": "( ) [ ]\n"})
    _write_tree(b, {"parcel.py": "def parcel():\n    return 1\n"})
    idx = CodeIndex(str(tmp_path / "code.sqlite"))
    try:
        idx.index_workspace(str(z))
        idx.index_workspace(str(b))
        assert memory.warm(idx.conn, wait=True) is not None
        for mode in ("hybrid", "lexical"):
            by_sql, got, _ = both_ways(idx, "parcel", workspaces=[str(z)], mode=mode)
            assert by_sql == got == []
    finally:
        memory.forget(idx.conn.filename)
        idx.close()
