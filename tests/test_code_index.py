"""Indexing, revisions, drift, freshness and retrieval of the code lane."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server.code import CodeIndex, HashingEmbedder, IndexOptions
from knowledge_server.code import indexer as indexer_mod
from knowledge_server.code import search as search_mod
from knowledge_server.code.store import open_store, vec_table_for, vec_tables

CANARY = "sk-proj-Q7c4nAryV4lu3XyZ0123456789abcd"


def _write(root: Path, rel: str, data: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    _write(
        root,
        "users/service.py",
        "class UserService:\n"
        "    def getUserName(self, uid):\n"
        "        return self.db.lookup(uid)\n\n"
        "def parse_config_file(path):\n"
        "    return open(path).read()\n",
    )
    _write(root, "web/handlers.js", "function get_user_name(req) {\n  return req.user.name;\n}\n")
    _write(root, "docs/guide.md", "# Guide\nHow to rotate the session cookie.\n")
    _write(root, "settings.py", f'OPENAI_API_KEY = "{CANARY}"\nTIMEOUT = 5\n')
    _write(root, ".env", f"OPENAI_API_KEY={CANARY}\n")
    return root


@pytest.fixture()
def index(tmp_path: Path) -> CodeIndex:
    search_mod._fresh_cache.clear()
    ix = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    yield ix
    ix.close()


def test_index_report_and_identifier_tokens(index: CodeIndex, ws: Path) -> None:
    rep = index.index_workspace(str(ws))
    assert rep.index_rev.startswith("rev-") and len(rep.fingerprint) == 64
    assert rep.files_seen == 4 and rep.files_indexed == 4
    assert rep.files_skipped == {"secret": 1}
    assert rep.vectors_missing == 0
    res = index.search("user name", mode="lexical")
    found = {(h.path, h.symbol) for h in res.hits}
    assert ("users/service.py", "UserService") in found
    assert ("web/handlers.js", "get_user_name") in found
    hit = res.hits[0]
    assert hit.id == "chunk:" + hit.chunk_id and hit.index_rev == rep.index_rev
    assert hit.provenance == "stated" and hit.workspace == str(ws)
    assert any(w.startswith("lex: ") and "user" in w and "name" in w for w in hit.why)
    # The camelCase identifier finds both spellings (compound token "getusername").
    top2 = {h.path for h in index.search("getUserName", mode="lexical").hits[:2]}
    assert top2 == {"users/service.py", "web/handlers.js"}


def test_results_order_snippet_and_get_chunk(index: CodeIndex, ws: Path) -> None:
    index.index_workspace(str(ws))
    res = index.search("parse config file", snippet_chars=20)
    assert res.capability == "full" and res.degradation_reason == ""
    top = res.hits[0]
    assert (top.path, top.symbol, top.start_line, top.end_line) == (
        "users/service.py",
        "parse_config_file",
        5,
        6,
    )
    assert len(top.snippet) <= 20
    keys = [(-h.score, h.path, h.start_line) for h in res.hits]
    assert keys == sorted(keys)
    assert top.why[0].startswith("lex: ")
    assert {w.split(":")[0] for w in top.why} == {"lex", "file", "vec"}
    rec = index.get_chunk(top.id)
    assert rec is not None and rec.text.startswith("def parse_config_file")
    assert rec.index_rev == res.index_rev
    assert index.get_chunk("nope") is None


def test_secret_canary_never_findable(index: CodeIndex, ws: Path) -> None:
    index.index_workspace(str(ws))
    for query in (
        CANARY,
        "Q7c4nAryV4lu3XyZ0123456789abcd",
        "REDACTED openai-key",
        "[REDACTED:openai-key]",
        "OPENAI_API_KEY",
    ):
        for mode in ("lexical", "vector", "hybrid"):
            res = index.search(query, mode=mode, limit=50)
            for h in res.hits:
                assert "Q7c4nAryV4lu3XyZ" not in h.snippet
                rec = index.get_chunk(h.chunk_id)
                assert rec is not None and "Q7c4nAryV4lu3XyZ" not in rec.text
    assert index.search(CANARY, mode="lexical").hits == []
    settings = [
        h for h in index.search("OPENAI_API_KEY", mode="lexical").hits if h.path == "settings.py"
    ]
    assert settings and "[REDACTED:" in index.get_chunk(settings[0].chunk_id).text  # type: ignore[union-attr]


def test_env_file_by_suffix_is_not_indexed_and_a_secrets_module_is(
    index: CodeIndex, tmp_path: Path
) -> None:
    root = tmp_path / "ws2"
    _write(root, "deploy/prod.env", f"OPENAI_API_KEY={CANARY}\nREGION=eu-west-1\n")
    _write(
        root,
        "lib/secrets.py",
        "def token_urlsafe(nbytes):\n"
        "    return base64_of_random_bytes(nbytes)\n\n"
        f'FALLBACK_KEY = "{CANARY}"\n',
    )
    rep = index.index_workspace(str(root))
    assert rep.files_indexed == 1 and rep.files_skipped == {"secret": 1}
    hits = index.search("token_urlsafe", mode="lexical").hits
    assert [h.path for h in hits][:1] == ["lib/secrets.py"]
    assert index.search("REGION", mode="lexical").hits == []
    for h in index.search("FALLBACK_KEY", mode="lexical", limit=50).hits:
        rec = index.get_chunk(h.chunk_id)
        assert rec is not None and "Q7c4nAryV4lu3XyZ" not in rec.text


def test_incremental_reuse_drift_and_unchanged(index: CodeIndex, ws: Path) -> None:
    r1 = index.index_workspace(str(ws))
    r2 = index.index_workspace(str(ws))
    assert r2.unchanged and r2.index_rev == r1.index_rev and r2.files_reused == 4
    assert r2.files_indexed == 0 and not r2.drift_written
    _write(ws, "web/handlers.js", "function rotate_token(req) {\n  return 1;\n}\n")
    _write(ws, "new.py", "def added_later():\n    pass\n")
    os.remove(ws / "docs" / "guide.md")
    r3 = index.index_workspace(str(ws))
    assert r3.index_rev > r1.index_rev and r3.files_indexed == 2 and r3.files_reused == 2
    assert r3.drift_written and r3.vectors_embedded == r3.chunks_new
    drift = index.drift(str(ws))
    assert len(drift) == 1 and drift[0]["rev"] == r3.index_rev
    assert drift[0]["previous_fingerprint"] == r1.fingerprint
    assert "added=1 changed=1 removed=1" in str(drift[0]["reason"])
    assert index.search("get_user_name", mode="lexical").hits[0].path != "web/handlers.js"
    # A touched file with the same content is reused by hash, not re-chunked.
    p = ws / "new.py"
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 5_000_000_000))
    r4 = index.index_workspace(str(ws))
    assert r4.unchanged and r4.files_indexed == 0 and r4.files_reused == 4


def test_document_chunks_are_the_current_revisions_documents(index: CodeIndex, ws: Path) -> None:
    """What other layers read of this store: the documents of a workspace's current
    revision only, in path and line order, with that revision."""
    assert index.indexed_roots() == [] and index.document_chunks(str(ws), ["markdown"]) == ("", [])
    r1 = index.index_workspace(str(ws))
    assert index.indexed_roots() == [str(ws)]
    rev, docs = index.document_chunks(str(ws), ["MarkDown"])
    assert rev == r1.index_rev
    assert [(c.path, c.language, c.index_rev) for c in docs] == [
        ("docs/guide.md", "markdown", r1.index_rev)
    ]
    assert "rotate the session cookie" in docs[0].text and docs[0].workspace == str(ws)
    assert index.document_chunks(str(ws), ["rst"]) == (r1.index_rev, [])
    _write(ws, "docs/a.md", "# A\nFirst.\n")
    os.remove(ws / "docs" / "guide.md")
    r2 = index.index_workspace(str(ws))
    rev, docs = index.document_chunks(str(ws), ["markdown"])
    assert rev == r2.index_rev != r1.index_rev
    assert [c.path for c in docs] == ["docs/a.md"]


def test_embedder_change_is_drift(index: CodeIndex, ws: Path) -> None:
    index.index_workspace(str(ws))
    rep = index.index_workspace(str(ws), embedder=HashingEmbedder(dim=128))
    assert rep.drift_written and rep.files_indexed == 0
    assert "embedder hashing-v4-256 -> hashing-v4-128" in str(index.drift(str(ws))[-1]["reason"])
    # The index's own embedder no longer matches the revision: lexical only, and it says why.
    res = index.search("user name")
    assert res.capability == "degraded" and "another embedder" in res.degradation_reason


def test_readers_see_previous_revision_until_commit(
    index: CodeIndex, ws: Path, tmp_path: Path
) -> None:
    r1 = index.index_workspace(str(ws))
    _write(ws, "users/service.py", "def brand_new_function():\n    pass\n")
    seen: list[tuple[str, int]] = []
    reader = CodeIndex(index.db_path)

    def progress(done: int, total: int, path: str) -> None:
        if done == total:
            res = reader.search("brand new function", mode="lexical", check_fresh=False)
            seen.append((res.index_rev, sum(h.symbol == "brand_new_function" for h in res.hits)))

    r2 = index.index_workspace(
        str(ws), progress_callback=progress, options=IndexOptions(batch_files=1)
    )
    assert seen == [(r1.index_rev, 0)]
    after = reader.search("brand new function", mode="lexical", check_fresh=False)
    assert after.index_rev == r2.index_rev and after.hits[0].symbol == "brand_new_function"
    reader.close()


def test_vectors_filled_later_degraded_then_full(index: CodeIndex, ws: Path) -> None:
    rep = index.index_workspace(str(ws), options=IndexOptions(fill_vectors=False))
    assert rep.vectors_missing == rep.chunks > 0
    res = index.search("user name")
    assert res.capability == "degraded"
    assert res.degradation_reason == (
        f"vectors not ready: 0/{rep.chunks} chunks embedded; lexical only"
    )
    assert res.hits and all(h.why[0].startswith("lex:") for h in res.hits)
    assert not any(w.startswith("vec") for h in res.hits for w in h.why)
    assert index.fill_vectors(str(ws)) == rep.chunks
    res = index.search("user name")
    assert res.capability == "full"
    assert any(w.startswith("vec: ") for h in res.hits for w in h.why)


def test_hybrid_ranks_files_and_answers_with_their_best_chunks(index: CodeIndex, ws: Path) -> None:
    """Hybrid and lexical results are files ranked by code.rank: a file's k-th chunk scores
    at least NEXT_CHUNK_DECAY**k of its best and never more, hits come in score order, every lexical hit's file is
    among the hybrid ones, and vectors add evidence ("vec:") without replacing it."""
    index.index_workspace(str(ws))
    lex = index.search("user name", mode="lexical", limit=50).hits
    vec = index.search("user name", mode="vector", limit=50).hits
    hyb = index.search("user name", mode="hybrid", limit=50).hits
    assert lex and vec and hyb
    for hits in (lex, hyb):
        keys = [(-h.score, h.path, h.start_line) for h in hits]
        assert keys == sorted(keys)
        best: dict[str, float] = {}
        seen: dict[str, int] = {}
        for h in sorted(hits, key=lambda h: -h.score):
            k = seen.get(h.path, 0)
            best.setdefault(h.path, h.score)
            floor = best[h.path] * search_mod.NEXT_CHUNK_DECAY**k
            assert floor - 1e-5 <= h.score <= best[h.path] + 1e-5
            seen[h.path] = k + 1
    assert {h.path for h in lex} <= {h.path for h in hyb}
    assert any(w.startswith("vec: ") for h in hyb for w in h.why)
    assert not any(w.startswith("vec: ") for h in lex for w in h.why)
    for h in vec:
        (why,) = h.why
        assert why.startswith("vec: ") and -1.0 <= float(why[5:]) <= 1.0


def test_vector_lane_ranks_by_exact_cosine_of_stored_vectors(index: CodeIndex, ws: Path) -> None:
    """The vector lane's order is the cosine of the query with each chunk's stored float
    vector, for its own candidates and for the lexical ones it ranks in hybrid mode; a
    chunk whose float vector is missing is no vector hit."""
    import numpy as np
    from knowledge_server.code.store import vec_table_for

    index.index_workspace(str(ws))
    emb = index.embedder
    vtbl = vec_table_for(index.conn, emb.identity, emb.dim, create=False)
    q = emb.embed_query(["user name"])[0]
    stored = {
        cid: float(np.frombuffer(v, dtype=np.float32) @ q)
        for cid, v in index.conn.execute(f"SELECT id, v FROM {vtbl}_f")
    }
    scope = search_mod._scope_sql(None, None)
    lex = search_mod._lexical(index.conn, ["user", "name"], ["user", "name"], scope, 30)
    rows, sims = search_mod._vector(index.conn, vtbl, emb.dim, q, scope, 30, also=lex)
    assert rows and {r[0] for r in lex} <= set(sims)
    for cid, sim in sims.items():
        assert sim == pytest.approx(stored[cid], abs=1e-6)
    assert [round(1.0 - r[11], 6) for r in rows] == sorted(
        (round(stored[r[0]], 6) for r in rows), reverse=True
    )
    gone = rows[0][0]
    with index.conn:
        index.conn.execute(f"DELETE FROM {vtbl}_f WHERE id = ?", (gone,))
    rows, sims = search_mod._vector(index.conn, vtbl, emb.dim, q, scope, 30, also=lex)
    assert gone not in sims and gone not in {r[0] for r in rows}


def test_workspace_and_path_filters(index: CodeIndex, ws: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    _write(other, "lib/user_name.py", "def user_name_helper():\n    pass\n")
    index.index_workspace(str(ws))
    index.index_workspace(str(other))
    both = {h.workspace for h in index.search("user name", limit=50).hits}
    assert both == {str(ws), str(other)}
    only = index.search("user name", workspaces=[str(other)], limit=50)
    assert {h.workspace for h in only.hits} == {str(other)}
    assert index.search("user name", workspaces=[]).hits == []
    pref = index.search("user name", path_prefixes=["web/"], limit=50).hits
    assert pref and {h.path for h in pref} == {"web/handlers.js"}
    assert ";" in index.search("user name").index_rev  # two workspaces, two revisions


def test_freshness_stale_after_touch(index: CodeIndex, ws: Path) -> None:
    index.index_workspace(str(ws))
    fr = index.check_freshness(str(ws))
    assert not fr.stale and fr.verified_by == "mtime"
    p = ws / "users" / "service.py"
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10_000_000_000))
    search_mod._fresh_cache.clear()  # skip the 2 s cache instead of sleeping
    fr = index.check_freshness(str(ws))
    assert fr.stale and fr.verified_by == "mtime"
    assert index.search("user").freshness[str(ws)].stale
    index.index_workspace(str(ws))
    search_mod._fresh_cache.clear()
    assert not index.check_freshness(str(ws)).stale


def test_gc_keeps_recent_revisions(index: CodeIndex, ws: Path) -> None:
    revs = []
    for i in range(4):
        _write(ws, "gen.py", f"def version_{i}():\n    pass\n")
        revs.append(index.index_workspace(str(ws)).index_rev)
    kept = [r[0] for r in index.conn.execute("SELECT rev FROM revisions ORDER BY id")]
    assert kept == revs[-2:]
    n = index.conn.execute("SELECT count(*) FROM file_versions WHERE path='gen.py'").fetchone()[0]
    assert n == 2


def test_skipped_content_files_not_reread(index: CodeIndex, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"\x00\x01binary")
    assert index.index_workspace(str(ws)).files_skipped == {"secret": 1, "binary": 1}
    again = index.index_workspace(str(ws))
    assert again.unchanged and again.files_skipped == {"secret": 1, "binary": 1}
    (ws / "blob.bin").write_text("now text: def became_text(): pass\n")
    rep = index.index_workspace(str(ws))
    assert rep.files_skipped == {"secret": 1} and rep.files_indexed == 1


def test_process_pool_gives_the_same_index(tmp_path: Path) -> None:
    root = tmp_path / "many"
    for i in range(70):
        _write(root, f"pkg/m{i:02d}.py", f"def function_{i}(x):\n    return x * {i}\n")
    ids = []
    for workers in (1, 2):
        with CodeIndex(str(tmp_path / f"w{workers}.sqlite")) as ix:
            rep = ix.index_workspace(str(root), options=IndexOptions(workers=workers))
            assert rep.files_indexed == 70
            rows = ix.conn.execute("SELECT chunk_id FROM chunks ORDER BY chunk_id").fetchall()
            ids.append((rep.fingerprint, [r[0] for r in rows]))
    assert ids[0] == ids[1]


def test_document_frequencies_follow_new_revisions(tmp_path: Path) -> None:
    """The remembered term counts that pick candidate-selecting terms belong to the
    current revisions: a reader sees them change after another connection re-indexes."""
    ws = tmp_path / "ws"
    _write(ws, "a.py", "def walrus_one():\n    pass\n")
    db = str(tmp_path / "data" / "code.sqlite")
    with CodeIndex(db) as writer, CodeIndex(db) as reader:
        writer.index_workspace(str(ws))
        assert search_mod._doc_freqs(reader.conn, ["walrus", "narwhal"])[0] == {
            "walrus": 1,
            "narwhal": 0,
        }
        _write(ws, "b.py", "def walrus_narwhal():\n    pass\n")
        writer.index_workspace(str(ws))
        assert search_mod._doc_freqs(reader.conn, ["walrus", "narwhal"])[0] == {
            "walrus": 2,
            "narwhal": 1,
        }


def test_hits_described_later_equal_hits_described_at_once(index: CodeIndex, ws: Path) -> None:
    """The code lane ranks without texts and describes only the hits an answer keeps
    (``describe``): snippets and "lex:"/"vec:" explanations are exactly those of a search
    that describes every hit, for any subset, in any order."""
    index.index_workspace(str(ws))
    for query in ("user name", "parse config file", "rotate session cookie", "getUserName"):
        whole = index.search(query, limit=10, check_fresh=False)
        ranked = index.search(query, limit=10, check_fresh=False, describe_hits=False)
        assert [h.id for h in ranked.hits] == [h.id for h in whole.hits]
        assert all(h.snippet == "" for h in ranked.hits)
        assert any(h.snippet for h in whole.hits)
        subset = list(reversed(ranked.hits[::2]))
        described = index.describe(ranked, subset, 300)
        expected = {h.id: h for h in whole.hits}
        for h in described:
            assert h.snippet == expected[h.id].snippet
            assert h.why == expected[h.id].why


def _sqlite_steps(ix: CodeIndex, query: str, **filters: object) -> int:
    """SQLite virtual-machine steps (in hundreds, counted by a progress handler) of one
    search in each mode: a cost measure that is deterministic, unlike time."""
    steps = [0]

    def count() -> bool:
        steps[0] += 1
        return False

    ix.conn.setprogresshandler(count, 100)
    try:
        for mode in ("hybrid", "vector", "lexical"):
            assert ix.search(query, mode=mode, **filters).hits  # type: ignore[arg-type]
    finally:
        ix.conn.setprogresshandler(None)
    return steps[0]


def _many_files(root: Path, n: int = 150) -> None:
    for i in range(n):
        _write(
            root,
            f"pkg{i % 10}/mod{i}.py",
            f"def handler_{i}(request, timeout={i}):\n"
            f"    return parse_headers(request.body, limit={i})\n\n"
            f"class Store{i}:\n    def load(self, key):\n        return self.cache[key]\n",
        )


def test_workspace_scope_costs_what_the_unscoped_search_costs(tmp_path: Path) -> None:
    """A workspace filter is looked up per candidate chunk, never by walking the workspace:
    scoped and unscoped searches read about as much (SQLite virtual-machine steps, counted
    by a progress handler: deterministic, unlike time). Started from the workspace, a
    scoped search visited every file of it for every candidate: 1,551 against 357 steps
    here, and growing with the workspace. The scope's statistics (``_scoped_stats``, read
    once per state of the store, walking the workspace's rows once) are read before the
    count starts."""
    search_mod._fresh_cache.clear()
    root = tmp_path / "big"
    _many_files(root)
    ix = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    try:
        ix.index_workspace(str(root))
        query = "parse request headers store"
        _sqlite_steps(ix, query, workspaces=[str(root)])
        cost = {
            "all": _sqlite_steps(ix, query),
            "scoped": _sqlite_steps(ix, query, workspaces=[str(root)]),
        }
        assert cost["scoped"] <= 1.5 * cost["all"] + 50, cost
    finally:
        ix.close()


def test_a_small_workspace_of_a_larger_store_ranks_only_its_own_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace filter that leaves out most of the store (``_SCOPE_SHARE``) scores only
    the chosen workspace's chunks and files: the same hits, in the same order with the
    same scores, as ranking the whole store and keeping the workspace's, at a fraction of
    the cost (SQLite steps, counted)."""
    search_mod._fresh_cache.clear()
    big, small = tmp_path / "big", tmp_path / "small"
    _many_files(big, 600)
    for i in range(6):
        _write(
            small,
            f"app/part{i}.py",
            f"def parse_request_{i}(request):\n    return parse_headers(request, {i})\n\n"
            f"def store_{i}(key):\n    return cache[key]\n",
        )
    ix = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    try:
        ix.index_workspace(str(big))
        ix.index_workspace(str(small))
        query = "parse request headers store"
        scoped = {"workspaces": [str(small)]}
        narrow = {
            m: ix.search(query, mode=m, limit=20, **scoped).hits for m in ("hybrid", "lexical")
        }  # type: ignore[arg-type]
        narrow_cost = _sqlite_steps(ix, query, **scoped)
        monkeypatch.setattr(search_mod, "_SCOPE_SHARE", 0.0)  # rank all, keep the scope's
        wide = {m: ix.search(query, mode=m, limit=20, **scoped).hits for m in ("hybrid", "lexical")}  # type: ignore[arg-type]
        wide_cost = _sqlite_steps(ix, query, **scoped)
        for m in narrow:
            assert narrow[m] and all(h.workspace == str(small) for h in narrow[m])
            assert [(h.row_id, h.score) for h in narrow[m]] == [
                (h.row_id, h.score) for h in wide[m]
            ]
        assert narrow_cost < wide_cost / 2, (narrow_cost, wide_cost)
    finally:
        ix.close()


@pytest.mark.parametrize("prune_from", [5000, 10])
def test_path_filter_ranks_only_chunks_under_the_prefixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prune_from: int
) -> None:
    """A path filter ranks the chunks under its prefixes, in the current revision only:
    lexical results equal a brute-force BM25 ranking of exactly those chunks, every hit
    of every mode is under a prefix, and the filter costs no more than an unfiltered
    search (SQLite steps, counted: 368 against 670 unfiltered here; ranking everything and
    filtering took 3,038, widening the candidate list again and again). Also when frequent
    terms are set aside from picking candidates (``_PRUNE_FROM`` lowered): what is frequent
    across the index may be all a chunk under the prefix has."""
    monkeypatch.setattr(search_mod, "_PRUNE_FROM", prune_from)
    search_mod._fresh_cache.clear()
    root = tmp_path / "big"
    _many_files(root, 600)
    ix = CodeIndex(str(tmp_path / "data" / "code.sqlite"))
    try:
        ix.index_workspace(str(root))
        # A newer revision of one file under the prefix: its old chunks must not appear.
        _write(root, "pkg3/mod3.py", "def handler_3(request):\n    return parse_headers(request)\n")
        ix.index_workspace(str(root))
        prefixes = ["pkg3/mod3.py", "pkg7/mod17"]  # 3 of 600 files
        query = "parse request headers store"
        res = ix.search(query, mode="lexical", path_prefixes=prefixes, limit=50)
        match = " OR ".join(f'"{t}"' for t in ("parse", "request", "headers", "store"))
        rows = ix.conn.execute(
            "SELECT c.id, c.path, c.start_line, bm25(chunks_fts, 1.0, 3.0) AS r"
            " FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid"
            " JOIN rev_file rf ON rf.file_id = c.file_id"
            " JOIN workspaces w ON w.current_rev_id = rf.rev_id"
            " WHERE chunks_fts MATCH ? ORDER BY r, c.path, c.start_line",
            (match,),
        ).fetchall()
        want = [r[0] for r in rows if any(r[1].startswith(p) for p in prefixes)][:50]
        # Files first (code.rank), so the order differs from chunk BM25; the chunks are the same.
        assert sorted(h.row_id for h in res.hits) == sorted(want)
        assert any(h.path == "pkg3/mod3.py" for h in res.hits)
        for mode in ("hybrid", "vector"):
            hits = ix.search(query, mode=mode, path_prefixes=prefixes, limit=50).hits
            assert hits and all(any(h.path.startswith(p) for p in prefixes) for h in hits)
        assert ix.search(query, path_prefixes=["nowhere/"]).hits == []
        assert ix.search(query, path_prefixes=["pkg\ud7ff"]).hits == []  # a bound past U+D7FF

        cost = {
            "all": _sqlite_steps(ix, query),
            "paths": _sqlite_steps(ix, query, path_prefixes=prefixes),
        }
        assert cost["paths"] <= 1.5 * cost["all"] + 50, cost
    finally:
        ix.close()


_PATH_CHARS = ["a", "/", "0", "\x7f", "\x80", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff"]
_PATH_CHARS += ["\U00010000", "é"]


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.text(st.sampled_from(_PATH_CHARS), min_size=1, max_size=3),
    paths=st.lists(st.text(st.sampled_from(_PATH_CHARS), max_size=4), max_size=10),
)
def test_prefix_range_is_starts_with(prefix: str, paths: list[str]) -> None:
    """A path filter's range [p, upper(p)) holds exactly the strings starting with p in
    SQLite's order, also at UTF-8 length boundaries and before the surrogates (a prefix
    ending in U+D7FF once made an upper bound SQLite could not take)."""
    import apsw
    from knowledge_server.schema import prefix_upper

    upper = prefix_upper(prefix)
    assert upper is not None
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(p TEXT)")
    for p in paths:
        conn.execute("INSERT INTO t VALUES(?)", (p,))
    got = sorted(
        r[0] for r in conn.execute("SELECT p FROM t WHERE p >= ? AND p < ?", (prefix, upper))
    )
    assert got == sorted(p for p in paths if p.startswith(prefix))


def test_vector_table_names_are_checked_before_they_reach_sql(tmp_path: Path) -> None:
    """Catches: a table name read back from ``embedders`` interpolated into SQL unchecked."""
    conn = open_store(str(tmp_path / "code.sqlite"))
    made = vec_table_for(conn, "hashing-64", 64, create=True)
    assert made is not None and made.startswith("vec_")
    assert vec_table_for(conn, "hashing-64", 64, create=False) == made
    assert vec_tables(conn) == [made]
    with conn:
        conn.execute(
            "INSERT INTO embedders(identity, dim, tbl) VALUES('evil', 8, 'x; DROP TABLE chunks')"
        )
    with pytest.raises(ValueError, match="not a vector table name"):
        vec_table_for(conn, "evil", 8, create=False)
    with pytest.raises(ValueError, match="not a vector table name"):
        vec_tables(conn)
    conn.close()


def test_a_file_unreadable_once_is_read_on_the_next_run(
    index: CodeIndex, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing lost: a file that could not be read (permissions) was remembered as skipped
    with its size and mtime, and ``chmod`` changes neither, so it was never indexed again.
    Only skips decided by content (binary, encoding) are remembered."""
    billing = ws / "billing.py"
    billing.write_text("def compute_invoice_total(items):\n    return sum(items)\n")
    if os.geteuid() != 0:
        billing.chmod(0)
    else:  # root reads any file: the read fails as it does for another user
        real = indexer_mod.read_text

        def unreadable(
            abspath: str, beneath: str | None = None, root_id: tuple[int, int] | None = None
        ) -> tuple[str | None, bytes, str]:
            if abspath.endswith("billing.py"):
                return None, b"", "unreadable"
            return real(abspath, beneath, root_id)

        monkeypatch.setattr(indexer_mod, "read_text", unreadable)
    first = index.index_workspace(str(ws))
    assert first.files_skipped.get("unreadable") == 1
    assert not index.search("compute_invoice_total", check_fresh=False).hits
    billing.chmod(0o644)
    monkeypatch.undo()
    again = index.index_workspace(str(ws))
    assert "unreadable" not in again.files_skipped and again.files_indexed == 1
    (hit, *_) = index.search("compute_invoice_total", check_fresh=False).hits
    assert hit.path.endswith("billing.py")


def test_a_full_run_reads_a_file_whose_size_and_mtime_were_kept(index: CodeIndex, ws: Path) -> None:
    """``IndexWorkspace(full=true)`` re-reads every file: a copy that keeps size and
    modification time (``cp -p``, ``rsync -t``) is invisible to the incremental run, and
    ``--full`` was not passed on, so the stale text stayed."""
    rates = ws / "rates.py"
    rates.write_text("def alpha_rate():\n    return 1\n")
    index.index_workspace(str(ws))
    st = rates.stat()
    rates.write_text("def omega_rate():\n    return 1\n")  # same length
    os.utime(rates, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert index.index_workspace(str(ws)).unchanged
    assert not any(
        "omega_rate" in h.snippet for h in index.search("omega_rate", check_fresh=False).hits
    )
    rep = index.index_workspace(str(ws), full=True)
    assert rep.files_indexed == 1 and not rep.unchanged
    snippets = [h.snippet for h in index.search("omega_rate", check_fresh=False).hits]
    assert any("def omega_rate" in t for t in snippets)
    assert not any("def alpha_rate" in t for t in snippets)


def test_what_a_full_run_read_stays_in_the_next_incremental_one(index: CodeIndex, ws: Path) -> None:
    """A full run reads a file remembered as binary (it became text with the same size and
    mtime); its skip record stayed, so the next incremental run skipped it again and the
    file left the index."""
    notes = ws / "notes.txt"
    text = b"def omega_rate():\n    return 1\n"
    notes.write_bytes(b"\0" * len(text))
    assert index.index_workspace(str(ws)).files_skipped.get("binary") == 1
    st = notes.stat()
    notes.write_bytes(text)
    os.utime(notes, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "binary" not in index.index_workspace(str(ws), full=True).files_skipped
    again = index.index_workspace(str(ws))
    assert "binary" not in again.files_skipped
    assert any(
        "omega_rate" in h.snippet for h in index.search("omega_rate", check_fresh=False).hits
    )
