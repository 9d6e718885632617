"""Two tenants on one real server: every RPC of the published services keeps tenant B's
data out of tenant A's answers.

Tenant A's workspace is ``x/ws-a``; tenant B's is ``x/ws-a-other``, a root that A's root
is a string prefix of. Each plants a unique canary in code, documents, a ``SKILL.md`` and a
session log; A's workspace is full of links into B's tree at several depths. Scoped
principals of each tenant set the world up themselves (B's operator indexes, ingests and
builds B's document graph; A's likewise), then every RPC the generated descriptors declare
is called as tenant A and its answers searched for B's canary, B's paths, B's session ids
and counts that include B's data. The RPCs are enumerated from the descriptors, so a new
RPC without a case here fails :func:`test_every_rpc_has_an_isolation_case`.

Invariants (ISO-n, named in each case's docstring):

* ISO-1  Search, in every mode and lane, answers only from the caller's workspaces, and its
  lane counts count only them, whatever filters the request names; what another tenant's
  workspace holds moves none of its code or episodes answers (the ranking's statistics are
  the scope's).
* ISO-2  GetEpisode / GetChunk with another tenant's id answer exactly as an unknown id.
* ISO-3  Dispatch (dry run and commit) plans, packs and writes to the outbox only evidence
  and actors of the caller's workspaces.
* ISO-4  Document-graph reads answer only from the caller's workspaces' layers.
* ISO-5  GetStatus counts and names only the caller's workspaces.
* ISO-6  IndexWorkspace and BuildDocGraph refuse a root that is, or resolves into, a path
  outside the operator's workspaces (``..``, ``//``, ``/.``, links at any depth, a string
  prefix of another root) with PERMISSION_DENIED.
* ISO-7  IngestSessions answers a path outside the operator's workspaces (by string or by
  real path) exactly as a missing one, never follows a link out, and its summary counts
  only the operator's workspaces.
* ISO-8  RebuildDerived run by a scoped operator reports counts of its workspaces only.
* ISO-9  A session log's ``cwd`` cannot attribute a session to a workspace outside the
  ingesting operator's (cwd poisoning).
* ISO-10 IngestSessions with no paths reads, for a scoped operator, only the server's
  configured log folders that lie in its workspaces.
* ISO-11 The knowledge base is the organisation's: every KnowledgeBaseAdminService RPC
  refuses an agent's token (PERMISSION_DENIED), answers another organisation's topic,
  revision, task, feedback, tag or template exactly as an unknown one, lists and
  reconciles only the caller's organisation, and keeps keys unique per organisation.
* ISO-11 MemoryService calls answer from and write to the memory of the caller's own
  workspace only; a ``workspace`` naming B's root (by string, ``..``, a link at any depth,
  the string-prefix sibling) is refused with PERMISSION_DENIED and writes nothing.
* ISO-12 KnowledgeBaseService Retrieve and Answer answer from the caller's organisation's
  published knowledge only: another organisation's published text, ids and tag codes never
  appear in sources, answers, traces, counts or errors, and its tag codes are refused
  exactly as unknown ones.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest
from knowledge_sdk import (
    AsyncKnowledgeClient,
    InvalidRequest,
    KnowledgeClient,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from knowledge_sdk._gen.knowledge import v1
from knowledge_server import _gen
from knowledge_server.auth import TokenStore
from knowledge_server.code import memory
from knowledge_server.search.validate import LANES, MODES

from tests.code_memory_paths import copy_answers
from tests.conftest import ServerThread, dev_keys, make_vendor, start_server, write_session_log
from tests.kb_world import publish

CANARY_A = "quokkacanary"
CANARY_B = "zebrafinchcanary"
POISON = "cuckoocanary"
# Markdown documents of one tenant: docs/guide.md, docs/ops.md and its SKILL.md.
A_DOCUMENTS = 3


# -- the world ------------------------------------------------------------------------------


def _code(ws: Path, canary: str) -> None:
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text(
        f"def ship_{canary}(parcel):\n"
        f'    """Ship the parcel through the {canary} deploy service."""\n'
        "    return parcel\n"
    )


def _docs(ws: Path, canary: str) -> None:
    (ws / "docs").mkdir()
    (ws / "docs" / "guide.md").write_text(
        f"---\ntitle: Guide {canary}\nauthor: Ada {canary.title()}\ncategory: {canary}ops\n---\n"
        f"# Deploy guide\n\nThe {canary} deploy service ships parcels. "
        "See [operations](ops.md).\n"
    )
    (ws / "docs" / "ops.md").write_text(
        f"---\ntitle: Operations {canary}\nauthor: Ada {canary.title()}\n---\n"
        f"# Operations\n\nRun the {canary} deploy service; read [the guide](guide.md).\n"
    )


def _skill(ws: Path, canary: str) -> None:
    folder = ws / ".claude" / "skills" / f"{canary}-deploy"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {canary}-deploy\ndescription: the {canary} skill deploys the parcel service\n"
        "---\nRun the deploy service.\n"
    )


def _tenant(ws: Path, canary: str, session: str) -> None:
    _code(ws, canary)
    _docs(ws, canary)
    _skill(ws, canary)
    (ws / "logs").mkdir()
    write_session_log(
        ws / "logs" / "s.jsonl", session, ws, f"deploy the parcel service {canary} please"
    )


def _links_into(a: Path, b: Path) -> None:
    """Links in A's tree into B's, at several depths, to files and folders."""
    (a / "b-link").symlink_to(b, target_is_directory=True)
    (a / "src" / "deep" / "nested").mkdir(parents=True)
    (a / "src" / "deep" / "nested" / "b-dir").symlink_to(b, target_is_directory=True)
    (a / "src" / "stolen.py").symlink_to(b / "src" / "app.py")
    (a / "docs" / "stolen.md").symlink_to(b / "docs" / "guide.md")
    (a / "logs" / "b-logs").symlink_to(b / "logs", target_is_directory=True)
    (a / "logs" / "stolen.jsonl").symlink_to(b / "logs" / "s.jsonl")
    (a / ".claude" / "skills" / "borrowed").symlink_to(
        b / ".claude" / "skills" / f"{CANARY_B}-deploy", target_is_directory=True
    )


@dataclass
class World:
    root: Path
    a: Path
    b: Path
    address: str
    data_dir: Path
    tokens: dict[str, str]
    b_episode_ids: list[str] = field(default_factory=list)
    b_chunk_ids: list[str] = field(default_factory=list)
    b_actor_ids: list[str] = field(default_factory=list)
    a_status: dict[str, dict[str, int]] = field(default_factory=dict)
    kb_b: dict[str, str] = field(default_factory=dict)
    kb_published: dict[str, str] = field(default_factory=dict)
    coordinator: Any = None  # the server's search coordinator (its answer cache)

    def client(self, who: str) -> KnowledgeClient:
        return KnowledgeClient(self.address, token=self.tokens[who], timeout=30)

    @property
    def b_marks(self) -> tuple[str, ...]:
        """What must never reach tenant A: B's canary, B's root (and any path in it) and
        B's session id."""
        return (CANARY_B, self.b.name, "sess-b")


def _summary(events: Iterable[Any]) -> Any:
    summary = None
    for ev in events:
        if ev.summary is not None:
            summary = ev.summary
    assert summary is not None
    return summary


def _leaks(world: World, message: Any, *asked: str) -> list[str]:
    """B's marks found in ``message`` (its text form), after removing what the caller
    itself asked (a request may name B's path; its echo is no leak)."""
    low = str(message).lower()
    for text in sorted(asked, key=len, reverse=True):
        if text:
            low = low.replace(text.lower(), "").replace(os.path.normpath(text).lower(), "")
    return [m for m in world.b_marks if m.lower() in low]


def _no_leak(world: World, message: Any, *asked: str) -> None:
    found = _leaks(world, message, *asked)
    if found:
        blob = str(message)
        at = blob.lower().find(found[0].lower())
        raise AssertionError(f"{found} leaked: ...{blob[max(0, at - 300) : at + 200]}...")


def _counts(status: Any) -> dict[str, dict[str, int]]:
    return {lane.lane: dict(lane.counts) for lane in status.lanes}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("iso")
    a, b = root / "x" / "ws-a", root / "x" / "ws-a-other"
    _tenant(a, CANARY_A, "sess-a")
    _tenant(b, CANARY_B, "sess-b")
    _links_into(a, b)
    data = root / "data"
    store = TokenStore(data / "tokens.json")
    tokens = {}
    for who, scope, role in (
        ("ops-a", [str(a)], "operator"),
        ("agent-a", [str(a)], "agent"),
        ("ops-b", [str(b)], "operator"),
        ("agent-b", [str(b)], "agent"),
        ("admin", None, "operator"),
    ):
        tokens[who] = store.create(who, "org", scope, role)[1]
    # The knowledge base is per organisation: B's knowledge-base operator is in another one.
    tokens["kb-b"] = store.create("kb-b", "org-b", None, "operator")[1]
    make_vendor(root / "vendor").install(data)  # Enterprise: the document graph
    server = ServerThread(
        root,
        authenticate=store.authenticate,
        auth="on",
        workspaces=[str(a), str(b)],
        skill_roots=[str(a / ".claude" / "skills"), str(b / ".claude" / "skills")],
        # A lane past its deadline answers nothing, which would hide a leak as well as
        # the tenant's own data: give lanes time on a loaded machine.
        lane_timeout_ms=10_000,
        **dev_keys(data),
    )
    w = World(root, a, b, server.address, data, tokens)
    assert server.rs is not None
    w.coordinator = server.rs.app.coordinator
    try:
        for who, ws in (("ops-b", b), ("ops-a", a)):
            with w.client(who) as kc:
                _summary(kc.ingest_sessions([str(ws / "logs")]))
                _summary(kc.index_workspace(str(ws)))
                req = v1.BuildDocGraphRequest(root=str(ws), structural_only=True)
                _summary(kc.build_doc_graph(req))
        with w.client("admin") as kc:
            _summary(kc.rebuild_derived(full=True))
        with w.client("agent-b") as kc:
            resp = kc.search(f"{CANARY_B} deploy parcel service", limit=50)
            w.b_episode_ids = [i.id for i in resp.lanes.episodes.items]
            w.b_chunk_ids = [i.id for i in resp.lanes.code.items]
            w.b_actor_ids = [x.actor_id for x in resp.actors]
        assert w.b_episode_ids and w.b_chunk_ids and w.b_actor_ids, "tenant B has no data"
        yield w
    finally:
        server.stop()


# -- the cases, one per RPC -------------------------------------------------------------------


def _search(w: World) -> None:
    """ISO-1: Search in every mode, every lane alone and all lanes, with B's canary, a
    shared question and A's canary, and with filters naming B's root (by itself, by a
    ``..`` path, through a link, as the string-prefix sibling) or B's session id:
    nothing of B, and lane counts of A's workspace only."""
    filters: list[dict[str, Any]] = [
        {},
        {"workspaces": [str(w.b)]},
        {"workspaces": [f"{w.a}/../{w.b.name}"]},
        {"workspaces": [str(w.a / "b-link")]},
        {"workspaces": [str(w.a) + "-other"]},
        {"session_ids": ["sess-b"]},
        {"paths": ["src/app.py"]},
    ]
    own_seen = 0
    with w.client("agent-a") as kc:
        for mode in MODES:
            for include in [[lane] for lane in LANES] + [list(LANES)]:
                for query in (CANARY_B, "deploy the parcel service", CANARY_A):
                    for extra in filters if mode == "auto" else [{}]:
                        resp = kc.search(
                            query, mode=mode, include=include, limit=50, trace=True, **extra
                        )
                        asked = [query, *(str(v) for vs in extra.values() for v in vs)]
                        _no_leak(w, resp, *asked)
                        counts = resp.lanes.episodes.counts
                        assert counts.sessions <= 1, (mode, include, extra, counts)
                        if query == CANARY_A and not extra:
                            lanes = resp.lanes
                            own_seen += len(lanes.episodes.items) + len(lanes.code.items)
    assert own_seen, "tenant A never found its own canary: the case cannot fail"


def _dispatch(w: World) -> None:
    """ISO-3: Dispatch as A (dry run and commit, automatic and with B's actor id, with a
    workspace filter naming B): the plan, context pack, evidence, hand-off package and the
    outbox file it writes hold nothing of B; B's actor is refused like an unknown one; a
    commit that repeats one recorded by a principal seeing B records A's own assignment and
    package, and answers without the other's."""
    task = f"deploy the parcel service {CANARY_B} {CANARY_A}"
    with w.client("agent-a") as kc:
        for commit in (False, True):
            for extra in ({}, {"workspaces": [str(w.b)]}):
                resp = kc.dispatch(task, commit=commit, **extra)
                _no_leak(w, resp, task, *extra.get("workspaces", ()))
                if commit and resp.assignment is not None and resp.assignment.outbox_path:
                    text = Path(resp.assignment.outbox_path).read_text()
                    _no_leak(w, text, task, json.dumps(task)[1:-1])
        for actor in w.b_actor_ids:
            _not_found_like(lambda i: kc.dispatch(task, actor_id=i), actor, "actor:does-not-exist")
        own_actor = kc.search(CANARY_A, limit=10).actors[0].actor_id
    # The same task to A's actor, committed first by a principal that sees both tenants:
    # its recorded package holds B's evidence, and A committing it gets an assignment and
    # a package of its own, built for A, never that package or its file.
    again = f"ship the parcel with the deploy service {CANARY_B} {CANARY_A}"
    with w.client("admin") as kc:
        first = kc.dispatch(again, actor_id=own_actor, commit=True)
        assert _leaks(w, first.handoff, again), "the case cannot fail: the admin's package has no B"
    with w.client("agent-a") as kc:
        resp = kc.dispatch(again, actor_id=own_actor, commit=True)
        _no_leak(w, resp, again)
        assert resp.assignment is not None
        assert resp.assignment.assignment_id != first.assignment.assignment_id
        _no_leak(w, Path(resp.assignment.outbox_path).read_text(), again, json.dumps(again)[1:-1])


def _not_found_like(call: Callable[[str], Any], foreign: str, unknown: str) -> None:
    with pytest.raises(NotFound) as theirs:
        call(foreign)
    with pytest.raises(NotFound) as nobody:
        call(unknown)
    assert (theirs.value.reason, theirs.value.message) == (
        nobody.value.reason,
        nobody.value.message,
    )


def _get_episode(w: World) -> None:
    """ISO-2: GetEpisode with each of B's episode ids answers as an unknown id does."""
    with w.client("agent-a") as kc:
        for eid in w.b_episode_ids:
            _not_found_like(lambda i: kc.get_episode(i, neighbours=5), eid, "ep:sess-nobody:1")
        own = kc.search(CANARY_A, include=["episodes"]).lanes.episodes.items
        assert own
        _no_leak(w, kc.get_episode(own[0].id, neighbours=20))


def _get_chunk(w: World) -> None:
    """ISO-2: GetChunk with each of B's chunk ids answers as an unknown id of the same
    shape does."""
    with w.client("agent-a") as kc:
        for cid in w.b_chunk_ids:
            fake = cid[:-4] + ("0000" if not cid.endswith("0000") else "1111")
            _not_found_like(kc.get_chunk, cid, fake)
        own = kc.search(CANARY_A, include=["code"]).lanes.code.items
        assert own
        _no_leak(w, kc.get_chunk(own[0].id))


def _themes(w: World) -> None:
    """ISO-4: Themes, unscoped and with a scope naming B's root (directly, by ``..``,
    through a link, as the string-prefix sibling), answers from A's layer only."""
    with w.client("agent-a") as kc:
        for scope in ("", str(w.b), f"{w.a}/../{w.b.name}", str(w.a / "b-link"), "docs"):
            resp = kc.themes(scope=scope, limit=50)
            _no_leak(w, resp, scope)


def _entity_neighbors(w: World) -> None:
    """ISO-4: EntityNeighbors of B's entities (its author, its category) finds nothing of
    B; of a shared document name, only A's."""
    with w.client("agent-a") as kc:
        for entity in (f"Ada {CANARY_B.title()}", f"{CANARY_B}ops", "guide.md", "Deploy guide"):
            for kind in ("entity", "theme"):
                resp = kc.entity_neighbors(entity, depth=3, kind=kind, limit=200)
                _no_leak(w, resp, entity)


def _doc_relations(w: World) -> None:
    """ISO-4: DocRelations of a document both tenants have (``docs/guide.md``) and of B's
    entities answers from A's layer only."""
    with w.client("agent-a") as kc:
        seen = 0
        for doc, entity in (
            ("docs/guide.md", ""),
            ("guide.md", ""),
            ("", f"Ada {CANARY_B.title()}"),
        ):
            resp = kc.doc_relations(doc=doc, entity=entity, limit=200)
            _no_leak(w, resp, doc, entity)
            seen += resp.found
        assert seen, "A's own document relations were not found: the case cannot fail"


def _global_overview(w: World) -> None:
    """ISO-4: GlobalOverview counts A's documents only."""
    with w.client("agent-a") as kc:
        resp = kc.global_overview(limit=50)
    _no_leak(w, resp)
    assert resp.documents == A_DOCUMENTS, resp.documents


def _search_levels(w: World) -> None:
    """ISO-4: SearchLevels with B's canary and a shared question answers from A only."""
    with w.client("agent-a") as kc:
        for query in (CANARY_B, "deploy guide operations", f"Ada {CANARY_B.title()}"):
            resp = kc.search_levels(query, limit=50)
            resp.low_level, resp.high_level = [], []  # the query's own words, echoed
            _no_leak(w, resp, query)


def _get_status(w: World) -> None:
    """ISO-5: GetStatus for A names only A's workspace and counts only A's sessions,
    files, skills, actors and documents; B sees its own, the admin the sum."""
    with w.client("agent-a") as kc:
        a = kc.get_status()
    with w.client("agent-b") as kc:
        b = kc.get_status()
    with w.client("admin") as kc:
        everything = kc.get_status()
    _no_leak(w, a)
    ca, cb, call = _counts(a), _counts(b), _counts(everything)
    assert ca["episodes"]["sessions"] == 1 and ca["skills"]["skills"] == 1, ca
    assert ca["docgraph"]["documents"] == A_DOCUMENTS and ca["docgraph"]["workspaces"] == 1, ca
    for lane, counts in call.items():
        for key, total in counts.items():
            if key in ("live",):
                continue
            assert ca[lane].get(key, 0) + cb[lane].get(key, 0) <= total, (lane, key)
            if total:
                assert ca[lane].get(key, 0) < total or cb[lane].get(key, 0) == 0, (lane, key)


def _escapes(w: World) -> list[str]:
    """Roots in A's string range (or next to it) that are, or resolve into, B's tree."""
    a, b = str(w.a), str(w.b)
    return [
        b,
        a + "-other",
        f"{a}/../{w.b.name}",
        f"{a}//..//{w.b.name}",
        f"{a}/b-link",
        f"{a}//b-link",
        f"{a}/b-link/.",
        f"{a}/./b-link/src",
        f"{a}/src/deep/nested/b-dir",
        f"{a}/src/deep/nested/b-dir/docs",
        f"{a}/src/deep/../deep/nested/b-dir/",
    ]


def _index_workspace(w: World) -> None:
    """ISO-6: IndexWorkspace refuses every root that is, or resolves into, B's tree with
    PERMISSION_DENIED; A's own root spelled with ``//`` or ``/.`` indexes A without any of
    B's files (the walker follows no link)."""
    with w.client("ops-a") as kc:
        for root in _escapes(w):
            with pytest.raises(PermissionDenied):
                _summary(kc.index_workspace(root))
        for spelled in (f"{w.a}//", f"{w.a}/.", f"{w.a}/src/../"):
            summary = _summary(kc.index_workspace(spelled, full=True))
            _no_leak(w, summary)
            assert summary.counters["chunks"] >= 1
    with w.client("agent-a") as kc:
        resp = kc.search(f"{CANARY_B} ship parcel", include=["code"], limit=50)
        _no_leak(w, resp, f"{CANARY_B} ship parcel")


def _build_doc_graph(w: World) -> None:
    """ISO-6: BuildDocGraph refuses every root that is, or resolves into, B's tree with
    PERMISSION_DENIED (real paths, not strings); with no root it builds A's layer only."""
    with w.client("ops-a") as kc:
        for root in _escapes(w):
            with pytest.raises(PermissionDenied):
                _summary(kc.build_doc_graph(v1.BuildDocGraphRequest(root=root)))
        summary = _summary(kc.build_doc_graph(v1.BuildDocGraphRequest(structural_only=True)))
        _no_leak(w, summary)
        assert summary.counters["workspaces"] == 1 and summary.counters["documents"] == A_DOCUMENTS


def _ingest_sessions(w: World) -> None:
    """ISO-7: IngestSessions answers each path outside A (B's logs by string, by ``..``,
    ``//``, trailing ``/.``, a link at any depth, a linked file, the string-prefix
    sibling) exactly as a missing path; A's own folder with links into B ingests A's one
    session and counts only A's sessions."""
    a = str(w.a)

    def refusal(kc: KnowledgeClient, path: str) -> tuple[str, str]:
        with pytest.raises(InvalidRequest) as info:
            _summary(kc.ingest_sessions([path]))
        return info.value.reason, info.value.message.replace(os.path.normpath(path), "<path>")

    with w.client("ops-a") as kc:
        missing = refusal(kc, f"{a}/logs/nothing-here.jsonl")
        for path in [
            *(root + "/logs" for root in _escapes(w)),
            f"{w.b}/logs/s.jsonl",
            f"{a}/logs/b-logs",
            f"{a}/logs/b-logs/.",
            f"{a}//logs//b-logs/s.jsonl",
            f"{a}/logs/stolen.jsonl",
        ]:
            assert refusal(kc, path) == missing, path
        for spelled in (f"{a}/logs", f"{a}//logs/.", f"{a}/logs/../logs/"):
            summary = _summary(kc.ingest_sessions([spelled]))
            _no_leak(w, summary)
            assert summary.counters["files_seen"] == 1, summary.counters
            assert summary.counters["sessions"] == 1, summary.counters


def _rebuild_derived(w: World) -> None:
    """ISO-8: RebuildDerived by A's operator reports nothing of B and counts of A's
    workspace only."""
    with w.client("ops-a") as kc:
        summary = _summary(kc.rebuild_derived(full=True))
    _no_leak(w, summary)
    with w.client("agent-a") as kc:
        mine = _counts(kc.get_status())["skills"]
    for key in ("skills", "actors"):
        if key in summary.counters:
            assert summary.counters[key] == mine[key], (key, dict(summary.counters), mine)


def _seed_memory(w: World) -> None:
    """B's agent remembers B's canary (a fact and a relation) in B's memory."""
    with w.client("agent-b") as kc:
        kc.remember("canary", "b", f"{CANARY_B} lives here")
        kc.remember("depends_on", CANARY_B, "db", store="relations")


def _memory_case(rpc: str, call: Callable[[KnowledgeClient, str], Any]) -> Callable[[World], None]:
    def case(w: World) -> None:
        _seed_memory(w)
        with w.client("agent-a") as kc:
            _no_leak(w, call(kc, ""), CANARY_B)
            if rpc == "Policy":
                return
            for root in _escapes(w):
                with pytest.raises(PermissionDenied):
                    call(kc, root)
        with w.client("agent-b") as kc:
            mine = kc.recall(CANARY_B)
            assert [e.key for e in mine.entries] == ["b"], "B's memory changed"

    case.__doc__ = (
        f"ISO-11: {rpc} as A answers from A's memory only (none of B's canary) and refuses "
        "every workspace that is, or resolves into, B's tree"
    )
    return case


_MEMORY_CALLS: dict[str, Callable[[KnowledgeClient, str], Any]] = {
    "Remember": lambda kc, ws: kc.remember("iso", "k", "a value of A", workspace=ws),
    "Recall": lambda kc, ws: kc.recall(CANARY_B, workspace=ws),
    "Timeline": lambda kc, ws: kc.timeline("canary", "b", workspace=ws),
    "Rooms": lambda kc, ws: kc.rooms(workspace=ws),
    "Relations": lambda kc, ws: kc.relations("", workspace=ws),
    "Policy": lambda kc, ws: kc.memory_policy(),
    "Consolidate": lambda kc, ws: kc.consolidate(all=True, dry_run=True, workspace=ws),
    "Restore": lambda kc, ws: kc.restore(query="", limit=50, workspace=ws),
}


CASES: dict[str, Callable[[World], None]] = {
    "knowledge.v1.KnowledgeService/Search": _search,
    "knowledge.v1.KnowledgeService/Dispatch": _dispatch,
    "knowledge.v1.KnowledgeService/GetEpisode": _get_episode,
    "knowledge.v1.KnowledgeService/GetChunk": _get_chunk,
    "knowledge.v1.DocGraphService/Themes": _themes,
    "knowledge.v1.DocGraphService/EntityNeighbors": _entity_neighbors,
    "knowledge.v1.DocGraphService/DocRelations": _doc_relations,
    "knowledge.v1.DocGraphService/GlobalOverview": _global_overview,
    "knowledge.v1.DocGraphService/SearchLevels": _search_levels,
    "knowledge.v1.IndexService/IndexWorkspace": _index_workspace,
    "knowledge.v1.IndexService/IngestSessions": _ingest_sessions,
    "knowledge.v1.IndexService/RebuildDerived": _rebuild_derived,
    "knowledge.v1.IndexService/BuildDocGraph": _build_doc_graph,
    "knowledge.v1.IndexService/GetStatus": _get_status,
    **{
        f"knowledge.v1.MemoryService/{rpc}": _memory_case(rpc, call)
        for rpc, call in _MEMORY_CALLS.items()
    },
}


# -- the knowledge base (ISO-11) ----------------------------------------------------------------

KB = "knowledge.v1.KnowledgeBaseAdminService/"
UNKNOWN = {
    "topic": "top_0000000000000000",
    "revision": "rev_0000000000000000",
    "task": "task_0000000000000000",
    "feedback": "fb_0000000000000000",
    "tag": "nosuchtag",
    "template": "NO_SUCH_TEMPLATE",
}


def _kb_b(w: World) -> dict[str, str]:
    """Organisation B's knowledge base (once): a topic, a revision with an FAQ entry, a
    task, feedback, a tag and a template, each carrying B's canary."""
    if w.kb_b:
        return w.kb_b
    with w.client("kb-b") as kc:
        tag = kc.kb_create_tag(CANARY_B, CANARY_B).tag
        tpl = kc.kb_put_template(CANARY_B.upper(), f"{CANARY_B} template").template
        topic = kc.kb_create_topic(f"{CANARY_B}-key", CANARY_B).topic
        assert topic is not None and tag is not None and tpl is not None
        rev = kc.kb_create_revision(topic.id, "1.0").revision
        assert rev is not None
        rev = kc.kb_put_faq(rev.id, rev.version, f"{CANARY_B}?", CANARY_B).revision
        assert rev is not None
        rev = kc.kb_update_revision(rev.id, rev.version, tags=[CANARY_B]).revision
        assert rev is not None
        kc.kb_set_policy(True, 0)
        rev = kc.kb_submit(rev.id, rev.version).revision
        assert rev is not None
        rev = kc.kb_approve(rev.id, rev.version).revision
        assert rev is not None
        task = kc.kb_process(rev.id, rev.version).task
        fb = kc.kb_create_feedback(topic.id, f"{CANARY_B} feedback").feedback
        assert task is not None and fb is not None
    w.kb_b.update(
        topic=topic.id,
        revision=rev.id,
        task=task.id,
        feedback=fb.id,
        tag=tag.tag_code,
        template=tpl.template_code,
    )
    return w.kb_b


# RPC -> (kind of id it addresses, call with that id) for the RPCs that address one.
_KB_ADDRESSED: dict[str, tuple[str, Callable[[KnowledgeClient, str], Any]]] = {
    "GetTopic": ("topic", lambda kc, i: kc.kb_get_topic(i)),
    "CreateRevision": ("topic", lambda kc, i: kc.kb_create_revision(i, "9")),
    "GetRevision": ("revision", lambda kc, i: kc.kb_get_revision(i)),
    "UpdateRevision": ("revision", lambda kc, i: kc.kb_update_revision(i, 1, version_label="x")),
    "UploadSource": (
        "revision",
        lambda kc, i: kc.kb_upload_source_piece(i, file_name="a.md", data=b"# x", final=True),
    ),
    "PutFaq": ("revision", lambda kc, i: kc.kb_put_faq(i, 1, "q", "a")),
    "RemoveSource": ("revision", lambda kc, i: kc.kb_remove_source(i, 1, "src_x")),
    "SubmitRevision": ("revision", lambda kc, i: kc.kb_submit(i, 1)),
    "ApproveRevision": ("revision", lambda kc, i: kc.kb_approve(i, 1)),
    "ReturnRevision": ("revision", lambda kc, i: kc.kb_return(i, 1, "no")),
    "ProcessRevision": ("revision", lambda kc, i: kc.kb_process(i, 4)),
    "PublishRevision": ("revision", lambda kc, i: kc.kb_publish(i, 1)),
    "RetryTask": ("task", lambda kc, i: kc.kb_retry_task(i, 1)),
    "CancelTask": ("task", lambda kc, i: kc.kb_cancel_task(i, 1)),
    "WatchTask": ("task", lambda kc, i: list(kc.kb_watch_task(i))),
    "RollbackTopic": ("topic", lambda kc, i: kc.kb_rollback(i, "rev_x")),
    "OfflineTopic": ("topic", lambda kc, i: kc.kb_offline(i, "rev_x")),
    "UpdateTag": ("tag", lambda kc, i: kc.kb_update_tag(i, 1, display_name="x")),
    "CreateFeedback": ("topic", lambda kc, i: kc.kb_create_feedback(i, "hello")),
    "ResolveFeedback": ("feedback", lambda kc, i: kc.kb_resolve_feedback(i, 1)),
}

# The other RPCs: a call of organisation A whose answer must hold nothing of B.
_KB_OWN: dict[str, Callable[[KnowledgeClient], Any]] = {
    "CreateTopic": lambda kc: kc.kb_create_topic("a-own-key", "A's own topic"),
    "ListTopics": lambda kc: kc.kb_list_topics(),
    "Reconcile": lambda kc: kc.kb_reconcile(),
    "CreateTag": lambda kc: kc.kb_create_tag("a-own-tag", "A's own tag"),
    "ListTags": lambda kc: kc.kb_list_tags(include_inactive=True),
    "PutTemplate": lambda kc: kc.kb_put_template("A_OWN", "A's own template"),
    "ListTemplates": lambda kc: kc.kb_list_templates(),
    "ListFeedback": lambda kc: kc.kb_list_feedback(),
    "GetPolicy": lambda kc: kc.kb_get_policy(),
    "SetPolicy": lambda kc: kc.kb_set_policy(False, kc.kb_get_policy().policy.version),
}


def _kb_case(name: str) -> Callable[[World], None]:
    def case(w: World) -> None:
        b = _kb_b(w)
        with w.client("agent-a") as kc:
            call = _KB_ADDRESSED[name][1] if name in _KB_ADDRESSED else None
            with pytest.raises(PermissionDenied):
                if call is not None:
                    call(kc, UNKNOWN[_KB_ADDRESSED[name][0]])
                else:
                    _KB_OWN[name](kc)
        with w.client("ops-a") as kc:
            if name in _KB_ADDRESSED:
                kind, call = _KB_ADDRESSED[name]
                _not_found_like(lambda i: call(kc, i), b[kind], UNKNOWN[kind])
            else:
                resp = _KB_OWN[name](kc)
                _no_leak(w, resp)
                if name in ("CreateTopic", "CreateTag", "PutTemplate"):
                    assert "a's own" in str(resp).lower()
        with w.client("kb-b") as kc:  # B's side is as B left it
            rev = kc.kb_get_revision(b["revision"]).revision
            assert (
                rev is not None
                and rev.version_label == "1.0"
                and rev.state
                in (
                    "APPROVED",
                    "PROCESSING",
                    "PROCESSED",
                    "FAILED",
                )
            )
            assert kc.kb_get_policy().policy.allow_self_approval

    case.__doc__ = f"ISO-11: {name} keeps organisation B's knowledge base out of A's answers."
    return case


for _rpc in (*_KB_ADDRESSED, *_KB_OWN):
    CASES[KB + _rpc] = _kb_case(_rpc)


# -- published knowledge: Retrieve and Answer (ISO-12) -------------------------------------------

# The same words in both organisations' published documents, each with its own canary: a
# shared question matches both texts, so only the organisation boundary keeps B's out.
_HANDBOOK = """# Parcel {canary} handbook

## Deploy window

The {canary} parcel deploy service ships refunds within two working days.
"""
_SHARED_QUESTION = "parcel deploy service refunds working days"


def _kb_published(w: World) -> dict[str, str]:
    """Both organisations publish a handbook (once): B's carries B's canary and B's tag,
    A's carries A's canary. B's is checked to be retrievable by B."""
    if w.kb_published:
        return w.kb_published
    b = _kb_b(w)  # B's tag and B's self-approval policy
    with w.client("kb-b") as kc:
        topic_b, rev_b = publish(
            kc,
            f"{CANARY_B}-handbook",
            f"{CANARY_B} handbook",
            "1.0",
            markdown=_HANDBOOK.format(canary=CANARY_B),
            tags=(b["tag"],),
        )
        mine = kc.kb_retrieve(CANARY_B, top_k=5)
        assert mine.answerable and mine.sources[0].knowledge_id == topic_b, "B cannot find B's"
    with w.client("ops-a") as kc:
        policy = kc.kb_get_policy().policy
        if policy is None or not policy.allow_self_approval:
            kc.kb_set_policy(True, policy.version if policy else 0)
        topic_a, rev_a = publish(
            kc, "a-handbook", "A handbook", "1.0", markdown=_HANDBOOK.format(canary=CANARY_A)
        )
        a_chunks = kc.kb_get_revision(rev_a).revision.chunk_count
    w.kb_published.update(
        topic_b=topic_b, rev_b=rev_b, topic_a=topic_a, rev_a=rev_a, a_chunks=str(a_chunks)
    )
    return w.kb_published


def _no_kb_leak(w: World, message: Any, *asked: str) -> None:
    """Nothing of B's knowledge base: its canary and marks (``_no_leak``), its topic and
    revision ids."""
    _no_leak(w, message, *asked)
    pub = w.kb_published
    text = str(message)
    for key in ("topic_b", "rev_b"):
        assert pub[key] not in text, f"B's {key} leaked: {text[:500]}"
    for key in ("topic", "revision"):
        assert w.kb_b[key] not in text, f"B's {key} leaked: {text[:500]}"


def _b_tag_refused_as_unknown(kc: KnowledgeClient, call: Callable[..., Any], b_tag: str) -> None:
    """B's tag code, as either filter, is refused exactly as a code nobody has."""
    for kind in ("all_tag_codes", "any_tag_codes"):
        answers = []
        for code in (b_tag, UNKNOWN["tag"]):
            with pytest.raises(InvalidRequest) as info:
                call(kc, _SHARED_QUESTION, **{kind: [code]})
            answers.append((info.value.reason, info.value.message.replace(code, "<tag>")))
        assert answers[0] == answers[1], answers


def _kb_retrieve(w: World) -> None:
    """ISO-12: Retrieve as A with B's canary, a question both handbooks answer and A's
    canary: sources of A's handbook only, no B text, id or count (no candidate of another
    organisation, at most A's chunks as candidates); B's tag refused as an unknown one."""
    pub = _kb_published(w)
    own_seen = 0
    with w.client("agent-a") as kc:
        for query in (CANARY_B, f"{CANARY_B} {_SHARED_QUESTION}", _SHARED_QUESTION, CANARY_A):
            resp = kc.kb_retrieve(query, top_k=20)
            _no_kb_leak(w, resp, query)
            assert resp.trace is not None
            assert resp.trace.dropped_other_organisation == 0, resp.trace
            assert resp.trace.candidates <= int(pub["a_chunks"]), resp.trace
            assert all(s.knowledge_id == pub["topic_a"] for s in resp.sources)
            if query == CANARY_A:
                own_seen += len(resp.sources)
        _b_tag_refused_as_unknown(kc, lambda c, q, **kw: c.kb_retrieve(q, **kw), w.kb_b["tag"])
    assert own_seen, "A never found its own handbook: the case cannot fail"


def _kb_answer(w: World) -> None:
    """ISO-12: Answer as A. This server has no chat model, so A's own evidence reaches the
    chat step (UNAVAILABLE naming it, with nothing of B in the error), while B's canary
    finds no evidence at all (NO_EVIDENCE, no model call, nothing of B); B's tag refused
    as an unknown one."""
    _kb_published(w)
    with w.client("agent-a") as kc:
        for query in (CANARY_B, f"{CANARY_B} vault codes"):
            resp = kc.kb_answer(query, top_k=20)
            _no_kb_leak(w, resp, query)
            assert not resp.answerable and resp.reason_code == "NO_EVIDENCE", resp
            assert resp.trace is not None and resp.trace.dropped_other_organisation == 0
        for query in (_SHARED_QUESTION, CANARY_A):
            with pytest.raises(Unavailable) as info:
                kc.kb_answer(query)
            assert info.value.metadata.get("dependency") == "chat", info.value
            _no_kb_leak(w, f"{info.value} {info.value.metadata}", query)
        _b_tag_refused_as_unknown(kc, lambda c, q, **kw: c.kb_answer(q, **kw), w.kb_b["tag"])


CASES["knowledge.v1.KnowledgeBaseService/Retrieve"] = _kb_retrieve
CASES["knowledge.v1.KnowledgeBaseService/Answer"] = _kb_answer


def _declared_rpcs() -> list[str]:
    """Every RPC of every service in the generated descriptors of the server's package."""
    out: set[str] = set()
    for info in pkgutil.walk_packages(_gen.__path__, _gen.__name__ + "."):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(info.name)
        for service in module.DESCRIPTOR.services_by_name.values():
            out.update(f"{service.full_name}/{m.name}" for m in service.methods)
    return sorted(out)


RPCS = _declared_rpcs()


def test_every_rpc_has_an_isolation_case() -> None:
    """Every RPC the contracts declare has an ISO case here (a new RPC fails until it does)."""
    assert len(RPCS) >= 14
    assert sorted(CASES) == RPCS


@pytest.mark.parametrize("rpc", RPCS)
def test_rpc_keeps_the_other_tenant_out(world: World, rpc: str) -> None:
    """The ISO case of ``rpc`` (its docstring names the invariant)."""
    case = CASES.get(rpc)
    assert case is not None, f"{rpc} has no isolation case"
    case(world)


def test_iso1_holds_when_code_search_ranks_from_memory(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ISO-1 again with the code lane ranking from its copy of the store's full-text tables
    in memory (code.memory: one copy holds every workspace of the store, and each search
    keeps its caller's): nothing of B in any mode, lane or filter, and the copy answered.
    The answer cache is off meanwhile: the Search case asked the same questions before."""
    monkeypatch.setattr(world.coordinator, "cache_size", 0)
    conn = apsw.Connection(str(world.data_dir / "code.sqlite"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert memory.warm(conn, wait=True) is not None
    finally:
        conn.close()
    with copy_answers() as used:
        _search(world)
    assert any(used), "no code search was answered from the copy: the case cannot fail"


# -- known holes, each on its own server --------------------------------------------------------


def _two_tenants(tmp_path: Path) -> tuple[Path, Path, TokenStore]:
    a, b = tmp_path / "x" / "ws-a", tmp_path / "x" / "ws-a-other"
    for ws, canary, session in ((a, CANARY_A, "sess-a"), (b, CANARY_B, "sess-b")):
        ws.mkdir(parents=True)
        (ws / "logs").mkdir()
        write_session_log(ws / "logs" / "s.jsonl", session, ws, f"deploy the service {canary}")
    return a, b, TokenStore(tmp_path / "data" / "tokens.json")


async def _drain(stream: Any) -> Any:
    summary = None
    async for ev in stream:
        if ev.summary is not None:
            summary = ev.summary
    return summary


async def _uncached_server(
    tmp_path: Path, tokens: TokenStore, a: Path, b: Path
) -> tuple[Any, str, str, str]:
    """A server whose answers are not cached (each question is ranked again), and the
    tokens of A's operator, B's operator and A's agent."""
    ops_a = tokens.create("ops-a", "org", [str(a)], "operator")[1]
    ops_b = tokens.create("ops-b", "org", [str(b)], "operator")[1]
    agent_a = tokens.create("agent-a", "org", [str(a)], "agent")[1]
    rs = await start_server(tmp_path, authenticate=tokens.authenticate, auth="on")
    rs.app.coordinator.cache_size = 0
    return rs, ops_a, ops_b, agent_a


async def test_a_logs_cwd_cannot_place_evidence_in_another_workspace(tmp_path: Path) -> None:
    """ISO-9: a log under A's workspace whose ``cwd`` names B's root (or a path in it), or
    whose session id is one B already holds, adds nothing B's principals see; a session
    id of B's claimed by A first never shows A B's events either."""
    a, b, tokens = _two_tenants(tmp_path)
    write_session_log(a / "logs" / "poison.jsonl", "sess-poison", b, f"run {POISON} now")
    write_session_log(
        a / "logs" / "deep.jsonl", "sess-deep", b / "src" / "..", f"also {POISON} here"
    )
    # A claims B's session id, with A's cwd, before B ingests it.
    write_session_log(a / "logs" / "claim.jsonl", "sess-b", a, f"claimed {POISON}")
    ops_a = tokens.create("ops-a", "org", [str(a)], "operator")[1]
    ops_b = tokens.create("ops-b", "org", [str(b)], "operator")[1]
    agent_a = tokens.create("agent-a", "org", [str(a)], "agent")[1]
    agent_b = tokens.create("agent-b", "org", [str(b)], "agent")[1]
    rs = await start_server(tmp_path, authenticate=tokens.authenticate, auth="on")
    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            summary = await _drain(kc.ingest_sessions([str(a / "logs")]))
            assert summary.counters["sessions_out_of_scope"] == 2, dict(summary.counters)
            assert summary.counters["sessions"] == 2  # sess-a and A's own "sess-b"
        async with AsyncKnowledgeClient(rs.address, token=ops_b) as kc:
            summary = await _drain(kc.ingest_sessions([str(b / "logs")]))
            # B's sess-b is A's already: it is not merged into A's session.
            assert summary.counters["sessions_out_of_scope"] == 1, dict(summary.counters)
        async with AsyncKnowledgeClient(rs.address, token=agent_b) as kc:
            resp = await kc.search(POISON, include=["episodes"], limit=50)
            assert not resp.lanes.episodes.items, resp.lanes.episodes.items
            st = await kc.get_status()
            assert _counts(st)["episodes"]["sessions"] == 0
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            resp = await kc.search(f"{CANARY_B} deploy service", include=["episodes"], limit=50)
            assert CANARY_B not in str(resp).replace(CANARY_B + " deploy service", "")
    finally:
        await rs.server.stop(0)


async def test_no_paths_means_the_configured_folders_in_the_operators_scope(
    tmp_path: Path,
) -> None:
    """ISO-10: IngestSessions with no paths from a scoped operator reads only the server's
    configured log folders that lie in its workspaces (by real path), and with none there
    answers INVALID_ARGUMENT; it never ingests the folders outside its scope."""
    a, b, tokens = _two_tenants(tmp_path)
    owner = tmp_path / "owner-logs"
    owner.mkdir()
    write_session_log(owner / "o.jsonl", "sess-owner-a", a, f"the owner's {POISON}")
    (a / "linked-logs").symlink_to(b / "logs", target_is_directory=True)
    ops_a = tokens.create("ops-a", "org", [str(a)], "operator")[1]
    admin = tokens.create("admin", "org", None, "operator")[1]
    configured = [str(owner), str(b / "logs"), str(a / "linked-logs")]
    rs = await start_server(
        tmp_path, authenticate=tokens.authenticate, auth="on", session_paths=configured
    )
    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            with pytest.raises(InvalidRequest) as info:
                await _drain(kc.ingest_sessions([]))
            assert info.value.metadata.get("field") == "paths"
            assert str(owner) not in info.value.message and str(b) not in info.value.message
        async with AsyncKnowledgeClient(rs.address, token=admin) as kc:
            st = await kc.get_status()
            assert _counts(st)["episodes"]["sessions"] == 0  # nothing was ingested
        await rs.server.stop(0)
        rs = await start_server(
            tmp_path,
            authenticate=tokens.authenticate,
            auth="on",
            session_paths=[*configured, str(a / "logs")],
        )
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            summary = await _drain(kc.ingest_sessions([]))
            assert summary.counters["files_seen"] == 1 and summary.counters["sessions"] == 1
        async with AsyncKnowledgeClient(rs.address, token=admin) as kc:
            st = await kc.get_status()
            assert _counts(st)["episodes"]["sessions"] == 1
    finally:
        await rs.server.stop(0)


async def test_iso1_another_tenants_code_moves_no_answer(tmp_path: Path) -> None:
    """ISO-1, statistics: tenant A's code search answers the same over gRPC (the code lane's
    items with their places, scores and explanations, its capability and empty reason) before and
    after tenant B indexes a workspace full of the words A asks about, a made-up one
    among them. Ranked with the store-wide statistics (a word's idf, the row-length
    average, the vectors' baseline), whether A got any item for the made-up word told A
    whether B's code holds it."""
    a, b, tokens = _two_tenants(tmp_path)
    (a / "src").mkdir()
    own = {
        "config.py": "def load_config(path):\n    return read_settings(path)\n",
        "parcel.py": "def ship_parcel(parcel):\n    return retry(parcel)\n",
        "handler.py": "def handler(request):\n    return respond(request)\n",
        "both.py": "def config_for(parcel):\n    return parcel.config\n",
    }
    for name, text in own.items():
        (a / "src" / name).write_text(text)
    for i in range(30):
        (b / "pkg").mkdir(exist_ok=True)
        (b / "pkg" / f"zentrik_{i}.py").write_text(
            f"ZENTRIK = {i}\n\ndef zentrik_config(parcel):\n    return zentrik(parcel, {i})\n"
        )
    rs, ops_a, ops_b, agent_a = await _uncached_server(tmp_path, tokens, a, b)
    questions = ["zentrik", "zentrik parcel", "load the config", "config parcel handler"]

    async def asked() -> list[Any]:
        out = []
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            for q in questions:
                for mode in ("find_code", "auto"):
                    resp = await kc.search(q, mode=mode, include=["code"], limit=10)
                    lane = resp.lanes.code
                    items = [
                        (i.path, i.start_line, i.end_line, i.score, tuple(i.why))
                        for i in lane.items
                    ]
                    out.append((q, mode, items, lane.capability, lane.empty_reason))
        return out

    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            await _drain(kc.index_workspace(str(a)))
        before = await asked()
        assert any(x[2] for x in before), "A found nothing of its own: the case cannot fail"
        async with AsyncKnowledgeClient(rs.address, token=ops_b) as kc:
            summary = await _drain(kc.index_workspace(str(b)))
            assert summary.counters["chunks"] >= 30, dict(summary.counters)
        assert await asked() == before
    finally:
        await rs.server.stop(0)


async def test_iso1_another_tenants_sessions_move_no_episode(tmp_path: Path) -> None:
    """ISO-1, statistics: tenant A's episodes search answers the same over gRPC (the lane's
    events with their scores and explanations, its counts and empty reason) before and
    after tenant B ingests many sessions full of the words A asks about. Ranked with the
    store-wide statistics, an event's score told A how many of B's events hold a word."""
    a, b, tokens = _two_tenants(tmp_path)
    lines = [
        {
            "session_id": f"own-{i % 3}",
            "seq": i,
            "time": f"2026-10-21T09:{i:02d}:00Z",
            "cwd": str(a),
            "harness": "generic",
            "role": "user" if i % 2 else "assistant",
            "text": ["deploy the parcel service", "rotate the zentrik key", "parcel retry"][i % 3]
            + " now" * (i % 4),
        }
        for i in range(24)
    ]
    (a / "logs" / "own.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for i in range(40):
        write_session_log(
            b / "logs" / f"b{i}.jsonl", f"b-{i}", b, f"zentrik parcel deploy {'zentrik ' * (i % 3)}"
        )
    rs, ops_a, ops_b, agent_a = await _uncached_server(tmp_path, tokens, a, b)
    questions = ["zentrik", "zentrik parcel", "deploy the parcel", "retry now"]

    async def asked() -> list[Any]:
        out = []
        async with AsyncKnowledgeClient(rs.address, token=agent_a) as kc:
            for q in questions:
                resp = await kc.search(q, include=["episodes"], limit=10)
                lane = resp.lanes.episodes
                items = [(i.session_id, i.seq, i.score, tuple(i.why)) for i in lane.items]
                out.append((q, items, lane.counts.indexed_docs, lane.empty_reason))
        return out

    try:
        async with AsyncKnowledgeClient(rs.address, token=ops_a) as kc:
            await _drain(kc.ingest_sessions([str(a / "logs")]))
        before = await asked()
        assert all(x[1] for x in before), "A found nothing of its own: the case cannot fail"
        async with AsyncKnowledgeClient(rs.address, token=ops_b) as kc:
            summary = await _drain(kc.ingest_sessions([str(b / "logs")]))
            assert summary.counters["sessions"] >= 40, dict(summary.counters)
        assert await asked() == before
    finally:
        await rs.server.stop(0)
