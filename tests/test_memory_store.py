"""The memory store's semantics (seed 004), invariants MEM-1..MEM-12 named per test.

MEM-1  an update never forgets: the old version stays with ``valid_until``, the new one
       names it in ``supersedes``, the timeline lists every version in order.
MEM-2  the same value again (case-insensitively, or similar at or above the threshold with
       the same negation words) is a confirmation: confidence and count go up, nothing is
       superseded.
MEM-3  a different value is a contradiction with the seed's severity (High/Medium/Low),
       reported and recorded; the new value becomes current.
MEM-4  reclaim runs only at ``len >= max``, brings the store to ``reclaim_target``, archives
       the retention order's tail before removing it; once per crossing, not per write.
MEM-5  ``reclaim_enabled = false`` still caps the store at ``max``, losslessly.
MEM-6  restore never duplicates a live value and never puts an older value over a newer
       version of its key, live or archived: it files each version in its key's timeline.
MEM-7  budgets: deterministic order with stable tie-breaks, then the cut, which is named.
MEM-8  a consolidate dry run writes nothing and reports what a real run does.
MEM-9  consolidation and compaction archive what they merge or drop.
MEM-10 scopes (organisation, workspace) never see each other's entries.
MEM-11 every value ever written is live or restorable (property test).
MEM-12 decay is deterministic: a second run at the same instant changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_server.memory.policy import MemoryPolicy, reclaim_target
from knowledge_server.memory.store import (
    MIGRATIONS,
    MemoryStore,
    Scope,
    same_value,
    severity,
)
from knowledge_server.schema import Migrations

A = Scope("org-a", "/ws/a")
B = Scope("org-b", "/ws/a")
A2 = Scope("org-a", "/ws/a2")


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.t += timedelta(microseconds=1)
        return self.t


def _store(tmp_path: Path, **policy: object) -> MemoryStore:
    return MemoryStore(tmp_path / "memory.sqlite", replace(MemoryPolicy(), **policy), now=Clock())


def test_mem1_update_keeps_the_timeline(tmp_path: Path) -> None:
    """MEM-1"""
    m = _store(tmp_path)
    w1 = m.remember(A, "facts", "db", "staging-port", "5432", 0.7)
    w2 = m.remember(A, "facts", "db", "staging-port", "5433 since the move", 0.7)
    assert w1.outcome == "created" and w2.outcome == "superseded"
    assert w2.entry.supersedes == w1.entry.id
    versions, cut, archived = m.timeline(A, "facts", "db", "staging-port")
    assert [v.value for v in versions] == ["5432", "5433 since the move"]
    assert versions[0].valid_until is not None and versions[1].valid_until is None
    assert cut.omitted == 0 and archived == 0
    assert [e.value for e in m.recall(A, "facts", "").entries] == ["5433 since the move"]


def test_mem2_same_value_confirms(tmp_path: Path) -> None:
    """MEM-2"""
    m = _store(tmp_path)
    first = m.remember(A, "facts", "ops", "deploy", "Never run migrations on Fridays", 0.7)
    again = m.remember(A, "facts", "ops", "deploy", "never run migrations on fridays", 0.5)
    assert again.outcome == "confirmed" and again.contradiction is None
    assert again.entry.id == first.entry.id
    assert again.entry.confirmations == 2 and again.entry.confidence > first.entry.confidence
    assert len(m.live(A, "facts")) == 1
    assert same_value("a b c d e f g h i j", "a b c d e f g h i j k", 0.85) is True
    assert same_value("port 5432", "port 5433", 0.85) is False


def test_mem3_contradiction_severity(tmp_path: Path) -> None:
    """MEM-3: High needs confidence >= 0.9 and two confirmations; Medium confidence at the
    contradiction threshold; Low otherwise. Recorded, and the new value is current."""
    assert severity(0.9, 2, 0.5) == "high"
    assert severity(0.95, 1, 0.5) == "medium"
    assert severity(0.5, 5, 0.5) == "medium"
    assert severity(0.49, 5, 0.5) == "low"
    m = _store(tmp_path)
    m.remember(A, "facts", "db", "host", "db1.internal", 0.9)
    m.remember(A, "facts", "db", "host", "db1.internal", 0.9)  # confirmed: 1.0, 2
    w = m.remember(A, "facts", "db", "host", "db2.internal", 0.7)
    assert w.contradiction is not None and w.contradiction.severity == "high"
    low = m.remember(A, "facts", "db", "host", "db3.internal", 0.2)
    assert low.contradiction is not None and low.contradiction.severity == "medium"
    m.remember(A, "facts", "x", "y", "one", 0.1)
    w3 = m.remember(A, "facts", "x", "y", "two", 0.1)
    assert w3.contradiction is not None and w3.contradiction.severity == "low"
    assert [s for _, _, s in m.contradictions(A)] == ["high", "medium", "low"]
    assert m.recall(A, "facts", "host").entries[0].value == "db3.internal"


def test_mem4_reclaim_once_per_crossing_to_the_target(tmp_path: Path) -> None:
    """MEM-4"""
    m = _store(tmp_path, max_facts=20, reclaim_headroom_pct=0.25)
    assert reclaim_target(20, 0.25) == 15
    for i in range(20):
        m.remember(A, "facts", "c", f"k{i}", f"value number {i}", 0.5 + i / 100)
    assert m.count(A, "facts") == 20 and m.reclaims == 0
    m.remember(A, "facts", "c", "k20", "value number 20", 0.9)
    assert m.reclaims == 1
    assert m.count(A, "facts") == 16 and m.count(A, "facts", archived=True) == 5
    # the lowest-confidence entries went, the best and the new one stayed
    assert {e.key for e in m.archived(A, "facts")} == {f"k{i}" for i in range(5)}
    for i in range(21, 25):
        m.remember(A, "facts", "c", f"k{i}", f"value number {i}", 0.5)
    assert m.reclaims == 1 and m.count(A, "facts") == 20
    m.remember(A, "facts", "c", "k25", "value number 25", 0.5)
    assert m.reclaims == 2 and m.count(A, "facts") == 16


def test_mem4_superseded_versions_go_before_current_facts(tmp_path: Path) -> None:
    """MEM-4: facts are retained current first."""
    m = _store(tmp_path, max_facts=4, reclaim_headroom_pct=0.5)
    m.remember(A, "facts", "c", "a", "one", 0.99)
    m.remember(A, "facts", "c", "a", "two", 0.1)
    m.remember(A, "facts", "c", "b", "three", 0.1)
    m.remember(A, "facts", "c", "c", "four", 0.1)
    m.remember(A, "facts", "c", "d", "five", 0.1)
    # "one" (0.99 but superseded) goes first; then the least recent of the equal currents
    assert [e.value for e in m.archived(A, "facts")] == ["one", "two"]
    assert {e.value for e in m.live(A, "facts")} == {"three", "four", "five"}


def test_mem5_disabled_reclaim_still_caps_losslessly(tmp_path: Path) -> None:
    """MEM-5"""
    m = _store(tmp_path, max_history=5, reclaim_enabled=False)
    for i in range(12):
        m.remember(A, "history", "events", f"e{i}", f"event {i}", 0.5)
    assert m.count(A, "history") == 5
    assert m.count(A, "history", archived=True) == 7
    assert {e.key for e in m.archived(A, "history")} == {f"e{i}" for i in range(7)}


def test_mem6_restore_never_duplicates_nor_resurrects(tmp_path: Path) -> None:
    """MEM-6"""
    m = _store(tmp_path, max_facts=2, reclaim_headroom_pct=0.5)
    m.remember(A, "facts", "c", "k", "old value", 0.1)
    m.remember(A, "facts", "c", "x", "other", 0.9)
    m.remember(A, "facts", "c", "y", "third", 0.9)  # reclaim archives "old value" (current)
    assert [e.value for e in m.archived(A, "facts")] == ["old value"]
    m.remember(A, "facts", "c", "k", "new value", 0.9)
    rep = m.restore(A, "facts", "old", 10)
    assert [e.value for e in rep.restored] == ["old value"] and rep.as_history == 1
    versions, _, _ = m.timeline(A, "facts", "c", "k")
    current = [v for v in versions if v.current]
    assert [v.value for v in current] == ["new value"]
    # the same value written again while archived: restore leaves it where it is
    m2 = _store(tmp_path / "two", max_facts=1, reclaim_headroom_pct=0.5)
    m2.remember(A, "facts", "c", "k", "alpha", 0.5)
    m2.remember(A, "facts", "c", "j", "beta", 0.5)  # archives alpha
    m2.remember(A, "facts", "c", "k", "alpha", 0.5)  # archives beta, alpha live again
    rep2 = m2.restore(A, "facts", "alpha", 10)
    assert rep2.restored == [] and rep2.already_live == 1
    assert [e.value for e in m2.live(A, "facts")] == ["alpha"]


def test_mem7_recall_budget_orders_then_cuts_and_names_the_cut(tmp_path: Path) -> None:
    """MEM-7"""
    m = _store(tmp_path, recall_facts_limit=3, rooms_limit=2)
    for i in range(6):
        m.remember(A, "facts", f"room{i % 3}", f"k{i}", f"deploy step {i}", 0.5)
    r = m.recall(A, "facts", "deploy", limit=50)
    assert len(r.entries) == 3 and r.cut.total == 6 and r.cut.omitted == 3
    assert r.cut.limit_name == "recall_facts_limit"
    # equal scores: the newest first, then by id; the cut names the next ids
    assert [e.key for e in r.entries] == ["k5", "k4", "k3"]
    assert r.cut.omitted_ids == ("mem:3", "mem:2", "mem:1")
    assert r == m.recall(A, "facts", "deploy", limit=50)
    rooms, cut = m.rooms(A, "facts")
    assert [name for name, _, _ in rooms] == ["room0", "room1"] and cut.omitted_ids == ("room2",)


def test_mem8_dry_run_writes_nothing_and_predicts(tmp_path: Path) -> None:
    """MEM-8"""
    m = _store(tmp_path, similarity_threshold=0.6)
    m.remember(A, "facts", "db", "a", "staging database runs on port 5433", 0.8)
    m.remember(A, "facts", "db", "b", "the staging database runs on port 5433", 0.6)
    m.remember(A, "facts", "db", "c", "something else entirely", 0.1)
    before = (m.live(A, "facts"), m.archived(A, "facts"))
    dry = m.consolidate(A, ["facts"], dry_run=True)
    assert (m.live(A, "facts"), m.archived(A, "facts")) == before
    real = m.consolidate(A, ["facts"])
    assert (dry.merged, dry.compacted, dry.archived_ids) == (
        real.merged,
        real.compacted,
        real.archived_ids,
    )
    assert dry.merged == 1 and dry.compacted == 1


def test_mem9_consolidation_archives_what_it_merges(tmp_path: Path) -> None:
    """MEM-9"""
    m = _store(tmp_path, similarity_threshold=0.6)
    keep = m.remember(A, "facts", "db", "a", "staging database runs on port 5433", 0.8)
    m.remember(A, "facts", "db", "b", "the staging database runs on port 5433", 0.6)
    rep = m.consolidate(A, ["facts"])
    assert rep.merged == 1
    [archived] = m.archived(A, "facts")
    assert archived.key == "b" and archived.reason == "consolidated"
    [live] = m.live(A, "facts")
    assert live.id == keep.entry.id and live.confirmations == 2


def test_mem10_scopes_are_separate(tmp_path: Path) -> None:
    """MEM-10"""
    m = _store(tmp_path)
    m.remember(A, "facts", "c", "k", "alpha", 0.5)
    m.remember(B, "facts", "c", "k", "beta", 0.5)
    m.remember(A2, "facts", "c", "k", "gamma", 0.5)
    assert [e.value for e in m.recall(A, "facts", "").entries] == ["alpha"]
    assert [e.value for e in m.recall(B, "facts", "").entries] == ["beta"]
    assert [e.value for e in m.recall(A2, "facts", "").entries] == ["gamma"]
    assert m.restore(B, "facts", "", 10).restored == []


def test_mem12_decay_is_deterministic(tmp_path: Path) -> None:
    """MEM-12"""
    clock = Clock()
    m = MemoryStore(
        tmp_path / "memory.sqlite",
        replace(MemoryPolicy(), stale_days=10, decay_rate=0.02, low_confidence_threshold=0.3),
        now=clock,
    )
    m.remember(A, "facts", "c", "k", "old fact", 0.5)
    m.remember(A, "facts", "c", "j", "weak fact", 0.35)
    clock.t += timedelta(days=15)
    rep = m.consolidate(A, ["facts"])
    assert rep.decayed == 2 and rep.compacted == 1
    [live] = m.live(A, "facts")
    assert live.confidence == pytest.approx(0.4, abs=1e-3)
    again = m.consolidate(A, ["facts"])
    assert again.compacted == 0
    assert m.live(A, "facts")[0].confidence == pytest.approx(0.4, abs=1e-3)
    assert [e.reason for e in m.archived(A, "facts")] == ["compacted"]


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.sampled_from(["facts", "history", "procedures"]),
            st.sampled_from(["c1", "c2"]),
            st.sampled_from(["k1", "k2", "k3", "k4"]),
            st.sampled_from(
                [
                    "alpha beta",
                    "ALPHA beta",
                    "gamma delta",
                    "delta epsilon zeta",
                    "eta",
                    "theta iota",
                ]
            ),
            st.floats(0.05, 1.0),
        ),
        st.tuples(st.just("consolidate"), st.booleans()),
        st.tuples(
            st.just("restore"),
            st.sampled_from(["facts", "history", "procedures"]),
            st.sampled_from(["", "alpha", "delta", "eta"]),
            st.integers(1, 5),
        ),
        st.tuples(st.just("age"), st.integers(1, 40)),
    ),
    max_size=60,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, enabled=st.booleans(), headroom=st.sampled_from([0.2, 0.5, 0.9]))
def test_mem11_every_value_written_is_live_or_restorable(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[object, ...]],
    enabled: bool,
    headroom: float,
) -> None:
    """MEM-11: random writes (with evictions), consolidations (dry and real), restores
    and time passing: every value ever written is, under its key, equal or similar to one
    that is live or in the archive; no id is in both tables; no key has two current
    entries; no version ends before it began; no store holds more than its max."""
    policy = replace(
        MemoryPolicy(),
        max_facts=3,
        max_history=4,
        max_procedures=2,
        reclaim_enabled=enabled,
        reclaim_headroom_pct=headroom,
        similarity_threshold=0.6,
        stale_days=5,
        decay_rate=0.05,
    )
    clock = Clock()
    m = MemoryStore(tmp_path_factory.mktemp("mem") / "memory.sqlite", policy, now=clock)
    written: list[tuple[str, str, str, str]] = []
    for op in ops:
        if op[0] == "write":
            _, store, cat, key, value, conf = op
            m.remember(A, str(store), str(cat), str(key), str(value), float(conf))  # type: ignore[arg-type]
            written.append((str(store), str(cat), str(key), str(value)))
        elif op[0] == "consolidate":
            m.consolidate(A, ["facts", "history", "procedures"], dry_run=bool(op[1]))
        elif op[0] == "restore":
            _, store, query, limit = op
            m.restore(A, str(store), str(query), int(limit))  # type: ignore[call-overload]
        else:
            clock.t += timedelta(days=int(op[1]))  # type: ignore[call-overload]
    for store in ("facts", "history", "procedures"):
        live, archived = m.live(A, store), m.archived(A, store)
        assert len(live) <= policy.capacity(store)
        assert not {e.id for e in live} & {e.id for e in archived}
        currents = [(e.category, e.key) for e in live if e.current]
        assert len(currents) == len(set(currents))
        # no version ends before it began (a restore files it in its key's timeline)
        assert all(e.valid_until is None or e.valid_until >= e.valid_from for e in live)
        kept = live + archived
        for s, cat, key, value in written:
            if s != store:
                continue
            same_key = [e for e in kept if (e.category, e.key) == (cat, key)]
            # a value merged by consolidation lives on in its keeper (another key)
            same_cat = [e for e in kept if e.category == cat]
            assert any(same_value(e.value, value, 0.6) for e in same_key + same_cat), (
                s,
                cat,
                key,
                value,
            )


def test_mem11_a_value_without_words_or_of_the_opposite_meaning_is_never_taken_for_another(
    tmp_path: Path,
) -> None:
    """MEM-11: every value written is live or restorable. Two values without words ("✅"
    then "❌") are compared by their text, not by their (empty) word sets; a rule whose
    meaning flips by one negation word ("always" to "never", a "not" or "nicht" added)
    shares nearly all its words with the old one and is still another value. Each new value
    becomes current, the old one stays in the timeline; the same symbol again confirms."""
    m = _store(tmp_path)
    rule = "deploy to production on friday afternoons without written approval from the lead"
    changes = [
        ("ci", "build", "✅", "❌"),
        ("ops", "cmp", "==", "!="),
        ("rules", "friday", f"always {rule}", f"never {rule}"),
        (
            "rules",
            "tests",
            "run the whole test suite locally before every merge into the main branch",
            "do not run the whole test suite locally before every merge into the main branch",
        ),
        (
            "rules",
            "merge",
            "wir mergen am freitag nach dem review in den hauptzweig",
            "wir mergen am freitag nicht nach dem review in den hauptzweig",
        ),
        (
            "rules",
            "lint",
            "the linter can block a merge of the release branch today",
            "the linter can't block a merge of the release branch today",
        ),
    ]
    for category, key, old, new in changes:
        m.remember(A, "facts", category, key, old, 0.7)
        w = m.remember(A, "facts", category, key, new, 0.7)
        assert w.outcome == "superseded" and w.entry.value == new, (old, new)
        versions, _, _ = m.timeline(A, "facts", category, key)
        assert [v.value for v in versions] == [old, new]
    again = m.remember(A, "facts", "ci", "build", " ❌ ", 0.7)
    assert again.outcome == "confirmed" and again.entry.value == "❌"
    assert same_value("✅", "✅", 0.85) and not same_value("✅", "❌", 0.85)
    assert same_value(
        "don't deploy on friday evenings ever", "Don’t deploy on friday evenings ever", 0.85
    )


def test_mem9_near_duplicates_far_apart_in_word_order_are_merged(tmp_path: Path) -> None:
    """MEM-9: two values that differ in one word merge even when many entries of the same
    category sort between them by their words (a sort-order window missed them)."""
    m = _store(tmp_path, similarity_threshold=0.7)
    m.remember(A, "facts", "ops", "first", "aardvark staging database moves to port", 0.9)
    for i, word in enumerate(["abacus", "abbey", "acorn", "adder", "aerie", "agate", "aisle"]):
        for j in range(2):
            m.remember(A, "facts", "ops", f"filler-{i}-{j}", f"{word} filler{j} entry{i}", 0.9)
    m.remember(A, "facts", "ops", "second", "zebra staging database moves to port", 0.5)
    rep = m.consolidate(A, ["facts"])
    assert rep.merged == 1
    assert [(e.key, e.reason) for e in m.archived(A, "facts")] == [("second", "consolidated")]


def test_mem9_relations_and_history_are_never_merged(tmp_path: Path) -> None:
    """MEM-9: edges from different sources to one target, and two events of the same text,
    are different entries: Consolidate keeps every one of them."""
    m = _store(tmp_path)
    for source in ("api", "worker", "billing"):
        m.remember(A, "relations", "depends_on", f"{source} -> postgres", "postgres", 0.7)
    m.remember(A, "history", "deploys", "deploy-mon", "deployed release to prod", 0.7)
    m.remember(A, "history", "deploys", "deploy-tue", "deployed release to prod", 0.7)
    m.remember(A, "facts", "db", "a", "staging database runs on port 5433", 0.8)
    m.remember(A, "facts", "db", "b", "the staging database runs on port 5433", 0.6)
    rep = m.consolidate(A, ["facts", "patterns", "history", "procedures", "relations"])
    assert rep.merged == 1  # the two facts only
    assert sorted(e.key for e in m.live(A, "relations")) == [
        "api -> postgres",
        "billing -> postgres",
        "worker -> postgres",
    ]
    assert sorted(e.key for e in m.live(A, "history")) == ["deploy-mon", "deploy-tue"]
    assert m.archived(A, "relations") == [] and m.archived(A, "history") == []


@pytest.mark.parametrize("reclaim", [True, False])
def test_mem6_restore_into_a_full_store_keeps_all_it_restores(
    tmp_path: Path, reclaim: bool
) -> None:
    """MEM-6 / MEM-4: a restore makes room once for everything it brings back; every entry
    it reports restored is live, and what it evicted is in the archive and reported."""
    m = _store(tmp_path, max_facts=3, reclaim_enabled=reclaim, reclaim_headroom_pct=0.34)
    for i in range(6):
        m.remember(A, "facts", "c", f"k{i}", f"value {i}", 0.5)
    assert m.count(A, "facts") + m.count(A, "facts", archived=True) == 6
    before = {e.id for e in m.live(A, "facts")}
    rep = m.restore(A, "facts", "", 3)
    live = {e.id for e in m.live(A, "facts")}
    assert len(rep.restored) == 3
    assert {e.id for e in rep.restored} == live  # each one reported restored is live
    assert set(rep.archived_ids) == before and rep.reclaimed == len(before)
    assert before <= {e.id for e in m.archived(A, "facts")}
    # more than the store holds: at most its capacity comes back
    rep2 = m.restore(A, "facts", "", 10)
    assert len(rep2.restored) == 3 and m.count(A, "facts") == 3


def test_mem4_a_write_names_what_its_reclaim_archived(tmp_path: Path) -> None:
    """MEM-4: the ids a write's reclaim archived are reported (its audit event lists them)."""
    m = _store(tmp_path, max_facts=4, reclaim_headroom_pct=0.5)
    ids = [m.remember(A, "facts", "c", f"k{i}", f"value {i}", 0.5).entry.id for i in range(4)]
    w = m.remember(A, "facts", "c", "k4", "value 4", 0.5)
    assert w.reclaimed == 2 and sorted(w.archived_ids) == ids[:2]
    assert sorted(e.id for e in m.archived(A, "facts")) == ids[:2]


def test_mem7_recall_finds_a_word_whose_case_folding_changes_its_spelling(
    tmp_path: Path,
) -> None:
    """MEM-7: a word is found as it was written and in its other spellings: case folding
    writes "ß" as "ss" (either finds the other, in any case), the "ﬁ" ligature is "fi", and
    full-width letters are the ASCII ones."""
    m = _store(tmp_path)
    m.remember(A, "facts", "addr", "office", "Office is in Hauptstraße 5", 0.8)
    m.remember(A, "facts", "addr", "depot", "Depot is in der GROSSEN STRASSE 2", 0.8)
    m.remember(A, "facts", "docs", "manual", "The manual is the ﬁrst ﬁle to read", 0.8)
    m.remember(A, "facts", "host", "ｗｉｋｉ", "Ｗｉｋｉ runs on ＡＢＣ", 0.8)
    office, depot = "Office is in Hauptstraße 5", "Depot is in der GROSSEN STRASSE 2"
    for query, value in (
        ("Hauptstraße", office),
        ("hauptstraße", office),
        ("hauptstrasse", office),
        ("HAUPTSTRASSE", office),
        ("großen straße", depot),
        ("grossen strasse", depot),
        ("first file", "The manual is the ﬁrst ﬁle to read"),
        ("wiki abc", "Ｗｉｋｉ runs on ＡＢＣ"),
    ):
        assert [e.value for e in m.recall(A, "facts", query).entries] == [value], query
    # Out to the archive (a store of one) and back by the other spelling.
    one = _store(tmp_path / "one", max_facts=1, reclaim_enabled=False)
    one.remember(A, "facts", "addr", "office", office, 0.1)
    one.remember(A, "facts", "addr", "depot", depot, 0.9)
    assert one.recall(A, "facts", "hauptstrasse").entries == []
    assert [e.value for e in one.restore(A, "facts", "HAUPTSTRASSE", 5).restored] == [office]
    assert [e.value for e in one.recall(A, "facts", "hauptstrasse").entries] == [office]


def test_mem7_a_store_written_before_the_folded_word_index_is_migrated(tmp_path: Path) -> None:
    """MEM-7 across versions: a store whose word index holds the text as written (schema
    step 001 only) gets the folded index when opened, and its old entries are found by
    the other spelling; writes after the step keep the index in step."""
    path = tmp_path / "memory.sqlite"
    conn = apsw.Connection(str(path))
    Migrations(MIGRATIONS.store, MIGRATIONS.steps[:1]).migrate(conn, str(path))
    conn.execute(
        "INSERT INTO entries (org, workspace, store, category, key, value, confidence,"
        " confirmations, created_at, updated_at, valid_from, touched)"
        " VALUES ('o', '/ws', 'facts', 'addr', 'office', 'Office is in Hauptstraße 5', 0.8, 1,"
        " '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00',"
        " '2026-01-01T00:00:00+00:00', 1)"
    )
    conn.close()
    m = MemoryStore(path, MemoryPolicy(), now=Clock())
    scope = Scope("o", "/ws")
    assert [e.key for e in m.recall(scope, "facts", "HAUPTSTRASSE").entries] == ["office"]
    m.remember(scope, "facts", "addr", "office", "Office is in Maßstraße 1", 0.8)
    assert [e.value for e in m.recall(scope, "facts", "massstrasse").entries] == [
        "Office is in Maßstraße 1"
    ]
    assert m.recall(scope, "facts", "hauptstrasse").entries == []


def test_mem6_a_restore_never_evicts_the_live_value_of_a_key_it_brings_back(
    tmp_path: Path,
) -> None:
    """MEM-6: "an older value never replaces a live one", also when the store is full and
    the live value is the retention order's tail: the restore makes room elsewhere."""
    m = _store(tmp_path, max_facts=3, reclaim_enabled=False)
    m.remember(A, "facts", "c", "k", "alpha old value", 0.1)
    m.remember(A, "facts", "c", "x", "x value", 0.9)
    m.remember(A, "facts", "c", "y", "y value", 0.9)
    m.remember(A, "facts", "c", "z", "z value", 0.9)  # full: alpha (current) archived
    m.remember(A, "facts", "c", "k", "beta new value", 0.1)  # full: x archived
    assert [e.value for e in m.archived(A, "facts")] == ["alpha old value", "x value"]
    rep = m.restore(A, "facts", "alpha", 10)
    assert [e.value for e in rep.restored] == ["alpha old value"] and rep.as_history == 1
    current = [e.value for e in m.live(A, "facts") if e.key == "k" and e.current]
    assert current == ["beta new value"]


def test_mem4_a_restore_that_brings_nothing_back_evicts_nothing(tmp_path: Path) -> None:
    """MEM-4: only an entry coming in makes room. A store over its capacity (the policy's
    maximum lowered after the writes) keeps its entries through a restore that matches
    nothing."""
    m = _store(tmp_path, max_facts=20)
    for i in range(10):
        m.remember(A, "facts", "c", f"k{i}", f"value {i}", 0.5)
    m.close()
    small = MemoryStore(tmp_path / "memory.sqlite", replace(MemoryPolicy(), max_facts=5))
    rep = small.restore(A, "facts", "no such words", 10)
    assert rep.restored == [] and rep.reclaimed == 0
    assert small.count(A, "facts") == 10


def test_mem6_a_restore_near_capacity_brings_back_only_what_fits_beside_the_live_values(
    tmp_path: Path,
) -> None:
    """MEM-6: restoring older values of keys that have live ones into a small full store
    brings back only as many as fit beside those live values; the current value of every
    key brought back stays current (other keys may make room, as for any write)."""
    m = _store(tmp_path, max_facts=2, reclaim_enabled=False)
    m.remember(A, "facts", "c", "k", "k old value", 0.5)
    m.remember(A, "facts", "c", "j", "j old value", 0.5)
    m.remember(A, "facts", "c", "x", "x filler", 0.9)
    m.remember(A, "facts", "c", "y", "y filler", 0.9)
    m.remember(A, "facts", "c", "k", "k new value", 0.5)
    m.remember(A, "facts", "c", "j", "j new value", 0.5)
    before = {e.key: e.value for e in m.live(A, "facts") if e.current}
    rep = m.restore(A, "facts", "old", 10)
    after = {e.key: e.value for e in m.live(A, "facts") if e.current}
    restored_keys = {e.key for e in rep.restored}
    assert rep.restored and all(after[k] == before[k] for k in restored_keys if k in before)
    assert all(e.value.endswith("old value") for e in rep.restored)
    assert m.count(A, "facts") <= 2


def test_mem6_a_restore_passes_over_what_does_not_fit_and_brings_back_what_does(
    tmp_path: Path,
) -> None:
    """MEM-6: an old value that cannot come back beside its key's live value is passed
    over, and the next one, whose key has none, still comes back."""
    m = _store(tmp_path, max_facts=3, reclaim_enabled=False)
    m.remember(A, "facts", "c", "z", "z old value", 0.1)
    m.remember(A, "facts", "c", "j", "j old value", 0.2)
    m.remember(A, "facts", "c", "k", "k old value", 0.3)
    for key in ("x", "y"):
        m.remember(A, "facts", "c", key, f"{key} filler", 0.9)
    m.remember(A, "facts", "c", "k", "k new value", 0.9)
    m.remember(A, "facts", "c", "j", "j new value", 0.9)
    before = {e.key: e.value for e in m.live(A, "facts") if e.current}
    rep = m.restore(A, "facts", "old", 10)
    after = {e.key: e.value for e in m.live(A, "facts") if e.current}
    assert "z old value" in [e.value for e in rep.restored]
    assert all(after[k] == before[k] for k in {e.key for e in rep.restored} if k in before)
    assert m.count(A, "facts") <= 3


@pytest.mark.parametrize("order", [("oldvalue", "newvalue"), ("newvalue", "oldvalue"), ("port",)])
def test_mem6_a_restore_files_a_version_in_its_keys_timeline(
    tmp_path: Path, order: tuple[str, ...]
) -> None:
    """MEM-6 / MEM-1: an older value restored while a newer version of its key is archived
    too comes back superseded, until the newer one began; the newer one, restored before,
    after or with it, is current. The timeline stays ordered: every version ends where the
    next begins, and only the last has no end."""
    m = _store(tmp_path)
    old = m.remember(A, "facts", "db", "port", "staging port 5432 oldvalue", 0.1).entry
    m.consolidate(A, ["facts"])  # compacted while current
    new = m.remember(A, "facts", "db", "port", "staging port 5433 newvalue", 0.1).entry
    m.consolidate(A, ["facts"])
    assert m.live(A, "facts") == []
    for query in order:
        m.restore(A, "facts", query, 10)
        [older] = [e for e in m.live(A, "facts") if e.id == old.id] or [None]
        if older is not None:
            assert older.valid_until == new.valid_from  # never current over the newer one
    versions, _, archived = m.timeline(A, "facts", "db", "port")
    assert archived == 0
    assert [v.id for v in versions] == [old.id, new.id]
    assert [v.valid_until for v in versions] == [new.valid_from, None]
    assert all(v.valid_until is None or v.valid_until >= v.valid_from for v in versions)
    assert [e.value for e in m.recall(A, "facts", "staging").entries] == [new.value]


def test_mem3_a_contradiction_shows_the_previous_version_as_superseded(tmp_path: Path) -> None:
    """MEM-3 / MEM-1: the contradiction a write reports names the previous version as it is
    stored after the write: superseded, ending where the new value begins, the same as the
    timeline shows it; also when the write's reclaim archived it."""
    m = _store(tmp_path)
    m.remember(A, "facts", "db", "port", "5432", 0.7)
    w = m.remember(A, "facts", "db", "port", "5433", 0.7)
    assert w.contradiction is not None
    previous = w.contradiction.previous
    assert not previous.current and previous.valid_until == w.entry.valid_from
    versions, _, _ = m.timeline(A, "facts", "db", "port")
    assert versions == [previous, w.entry]
    one = _store(tmp_path / "one", max_facts=1, reclaim_enabled=False)
    one.remember(A, "facts", "db", "port", "5432", 0.7)
    w = one.remember(A, "facts", "db", "port", "5433", 0.7)  # full: 5432 archived first
    assert w.contradiction is not None
    previous = w.contradiction.previous
    assert previous.value == "5432" and previous.reason == "evicted"
    assert not previous.current and previous.valid_until == w.entry.valid_from
    assert one.archived(A, "facts") == [previous]


def test_mem7_relations_match_a_source_and_a_target_exactly(tmp_path: Path) -> None:
    """MEM-7: Relations(ref) finds the edges whose source or target is ``ref`` as written,
    both compared exactly like every key: "API" and "api" are two entities, and a
    wildcard character in a name matches only itself."""
    m = _store(tmp_path)
    for source, target in (
        ("api", "db"),
        ("web", "api"),
        ("API", "gateway"),
        ("Web", "API"),
        ("a_b", "x"),
        ("acb", "y"),
    ):
        m.remember(A, "relations", "depends_on", f"{source} -> {target}", target, 0.7)

    def edges(ref: str) -> list[str]:
        return [e.key for e in m.relations(A, ref)[0]]

    assert edges("API") == ["API -> gateway", "Web -> API"]
    assert edges("api") == ["api -> db", "web -> api"]
    assert edges("a_b") == ["a_b -> x"]
    assert edges("a%") == []
