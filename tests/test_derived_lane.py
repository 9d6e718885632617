"""Skills lane search: ranking, filters, workspaces and query safety."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.derived import DerivedStore, InvalidQuery, rebuild, search_skills
from knowledge_server.episodes import EpisodeStore, ingest

FIX = Path(__file__).parent / "fixtures" / "derived"
ROOT1 = "actor:claude-code:root_session:sess-skill-1"
ROOT2 = "actor:claude-code:root_session:sess-skill-2"
SIDE = "actor:claude-code:subagent:sess-skill-1:ag1"


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("lane")
    shutil.copytree(FIX / "logs", d / "logs")
    eps = EpisodeStore(str(d))
    ingest(eps, [str(d / "logs")])
    store = DerivedStore(str(d))
    rebuild(eps, store, [str(FIX / "skills")])
    yield store
    store.close()


def test_exact_name_first_with_uses(ds) -> None:  # type: ignore[no-untyped-def]
    hits = search_skills(ds, "brainstorming", limit=5)
    assert hits[0].name == "brainstorming" and "exact skill name" in hits[0].why
    h = hits[0]
    assert h.uses == 4 and h.content_hash.startswith("sha256:") and h.when_to_use
    assert h.used_by[0] == (ROOT2, "ep:sess-skill-2:3000")
    assert {a for a, _ in h.used_by} == {ROOT1, ROOT2, SIDE}


def test_description_match_and_name_words(ds) -> None:  # type: ignore[no-untyped-def]
    assert search_skills(ds, "merge PDF documents", limit=3)[0].name == "pdf-tools"
    assert search_skills(ds, "code review", limit=3)[0].name == "review-helper"
    assert search_skills(ds, "review helper", limit=3)[0].name == "review-helper"
    assert search_skills(ds, "nothing-matches-this-xyzzy", limit=3) == []


def test_filters_and_workspaces(ds) -> None:  # type: ignore[no-untyped-def]
    hits = search_skills(ds, "brainstorming", limit=5, workspaces=["/home/dev/proj-alpha"])
    assert hits[0].uses == 2 and {a for a, _ in hits[0].used_by} == {ROOT1, SIDE}
    assert search_skills(ds, "brainstorming", limit=5, workspaces=[])[0].uses == 0
    assert search_skills(ds, "brainstorming", limit=5, workspaces=["/home/dev/proj"])[0].uses == 0
    assert (
        search_skills(ds, "pdf brainstorming", limit=5, skills=["pdf-tools"])[0].name == "pdf-tools"
    )
    assert search_skills(ds, "pdf", limit=5, skills=[]) == []
    by_actor = search_skills(ds, "pdf brainstorming review", limit=5, actor_ids=[ROOT2])
    assert [h.name for h in by_actor] == ["brainstorming"] and by_actor[0].uses == 2
    assert search_skills(ds, "pdf", limit=5, actor_ids=[]) == []
    assert search_skills(ds, "pdf", limit=0) == []


@pytest.mark.parametrize("bad", ["", "   ", '"*():-^', "\x00", "x" * 2001])
def test_invalid_queries(ds, bad: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidQuery):
        search_skills(ds, bad, limit=5)


@pytest.mark.parametrize(
    "q", ['brainstorming"', "NEAR(pdf tools)", "pdf*", "name:pdf", "pdf AND OR NOT", "^review"]
)
def test_fts_syntax_is_literal(ds, q: str) -> None:  # type: ignore[no-untyped-def]
    """Operator characters and words change nothing: the query's words alone find the same."""
    hits = [h.name for h in search_skills(ds, q, limit=5)]
    assert hits and hits == [
        h.name for h in search_skills(ds, " ".join(re.findall(r"\w+", q)), limit=5)
    ]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=80))
def test_arbitrary_text_never_raises_other_errors(ds, q: str) -> None:  # type: ignore[no-untyped-def]
    try:
        hits = search_skills(ds, q, limit=5, workspaces=["/home/dev/proj-alpha"])
    except InvalidQuery:
        return
    assert len(hits) <= 5


def test_real_skills_search(shared_data: Path, tmp_path: Path) -> None:
    eps = EpisodeStore(str(tmp_path))
    store = DerivedStore(str(tmp_path))
    rebuild(eps, store, [str(shared_data / "skills")])
    assert (
        search_skills(store, "debugging a failing test", limit=3)[0].name == "systematic-debugging"
    )
    assert search_skills(store, "slack gif", limit=3)[0].name == "slack-gif-creator"
    assert search_skills(store, "git worktrees", limit=3)[0].name == "using-git-worktrees"


def test_remembered_actor_facts_follow_the_derived_revision(tmp_path: Path) -> None:
    """Actor facts (name, outcome counts, skills with uses) are remembered per derived
    revision: once the revision moves, searches read the facts afresh."""
    from knowledge_server.lanes.derived import DerivedLane
    from knowledge_server.lanes.episodes import EpisodesLane

    shutil.copytree(FIX / "logs", tmp_path / "logs")
    eps = EpisodeStore(str(tmp_path))
    ingest(eps, [str(tmp_path / "logs")])
    eps.close()
    lane = DerivedLane(tmp_path, skill_roots=[str(FIX / "skills")])
    source = EpisodesLane(tmp_path)
    try:
        lane.rebuild_sync(source, True, lambda *a: None)
        with lane._readers.get() as store:
            info, skills, folders = lane._actor_facts(store, store.index_rev(), ROOT1)
        assert info is not None and (info.actor_id, info.kind) == (ROOT1, "root_session")
        assert dict(skills) == {"brainstorming": 1, "pdf-tools": 1, "review-helper": 1}
        assert len(folders) == 1 and None not in folders
        # What a rebuild that dropped this actor's skill uses commits: new rows, new revision.
        with lane._writer.conn:
            lane._writer.conn.execute("DELETE FROM skill_use WHERE actor_id = ?", (ROOT1,))
        with lane._readers.get() as store:
            # Same revision: remembered.
            assert lane._actor_facts(store, store.index_rev(), ROOT1)[1] == skills
        with lane._writer.conn:
            lane._writer.conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES('index_rev', 'derived:test:2')"
            )
        with lane._readers.get() as store:
            assert lane._actor_facts(store, store.index_rev(), ROOT1)[1] == []
    finally:
        lane.close()
        source.close()


def test_stop_words_do_not_select_skills(ds) -> None:  # type: ignore[no-untyped-def]
    """Stop words are dropped unless nothing else remains (as in the episodes lane)."""
    assert search_skills(ds, "where is the") == search_skills(ds, "the where is")
    assert search_skills(ds, "where is the zzzunknownword") == []
    assert [h.name for h in search_skills(ds, "where is the brainstorming")] == [
        h.name for h in search_skills(ds, "brainstorming")
    ]


def _skill(root: Path, name: str, description: str, when: str) -> None:
    folder = root / ".claude" / "skills" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\nwhen_to_use: {when}\n---\n\n# {name}\n"
    )


def test_another_workspaces_skills_move_no_scoped_answer(tmp_path: Path) -> None:
    """ISO-1, statistics: a skills search scoped to workspace A answers the same (names,
    order, scores, explanations) whether or not workspace B's catalog, in the same store,
    holds the question's words; B's skills do move an unscoped search's scores, so the case
    can fail (with FTS5's bm25() over every skill, A's scores moved too)."""
    a, b = tmp_path / "a", tmp_path / "b"
    _skill(a, "deploy-parcel", "Ship the parcel service to production.", "a release is due")
    _skill(a, "review-parcel", "Review a parcel change before merging.", "a pull request")
    _skill(a, "pdf-notes", "Turn PDF files into notes.", "reading papers")
    for i in range(12):
        _skill(b, f"zentrik-{i}", f"Zentrik parcel deploy number {i}.", "zentrik work")
    (tmp_path / "data").mkdir()
    eps = EpisodeStore(str(tmp_path / "data"))
    store = DerivedStore(str(tmp_path / "data"))
    try:
        questions = ["deploy the parcel service", "parcel review", "zentrik parcel", "pdf"]

        def answers(scope: list[str] | None) -> list[object]:
            return [
                [(h.name, h.score, tuple(h.why)) for h in search_skills(store, q, scope=scope)]
                for q in questions
            ]

        rebuild(eps, store, [str(a / ".claude" / "skills")])
        before, unscoped = answers([str(a)]), answers(None)
        assert any(before), "A's questions found nothing: the case cannot fail"
        rebuild(eps, store, [str(a / ".claude" / "skills"), str(b / ".claude" / "skills")])
        assert answers(None) != unscoped
        assert answers([str(a)]) == before
    finally:
        store.close()
        eps.close()


def test_one_skill_name_in_two_workspaces_each_sees_its_own(tmp_path: Path) -> None:
    """ISO-1: workspaces A and B each hold a skill called "deploy" with their own text; a
    search scoped to B finds B's (its path, its description), one scoped to A finds A's,
    and an unscoped one both. Keyed by name, the store kept A's alone: B's caller got
    nothing, or A's path had it been in scope."""
    a, b = tmp_path / "a", tmp_path / "b"
    _skill(a, "deploy", "Ship the parcel service with helm.", "a release is due")
    _skill(b, "deploy", "Ship the ledger service with terraform.", "a release is due")
    (tmp_path / "data").mkdir()
    eps = EpisodeStore(str(tmp_path / "data"))
    store = DerivedStore(str(tmp_path / "data"))
    try:
        rebuild(eps, store, [str(a / ".claude" / "skills"), str(b / ".claude" / "skills")])
        got_b = search_skills(store, "deploy", scope=[str(b)])
        assert [(h.name, h.description) for h in got_b] == [
            ("deploy", "Ship the ledger service with terraform.")
        ]
        assert got_b[0].path.startswith(str(b.resolve()) + "/")
        got_a = search_skills(store, "deploy terraform helm", scope=[str(a)])
        assert [h.description for h in got_a] == ["Ship the parcel service with helm."]
        assert len(search_skills(store, "deploy", scope=None)) == 2
        assert store.counts([str(b)])["skills"] == 1
    finally:
        store.close()
        eps.close()
