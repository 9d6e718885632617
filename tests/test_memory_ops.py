"""Memory operations (``memory/ops.py``): scope from the principal, request checks, the
path boundary on input and output, redaction on output."""

from __future__ import annotations

from pathlib import Path

import pytest
from knowledge_server._gen.knowledge.v1 import memory_pb2
from knowledge_server.auth_model import Principal
from knowledge_server.errors import (
    InvalidRequest,
    PathOutsideScope,
    PermissionDenied,
    SecretRefused,
)
from knowledge_server.memory import ops as memory_ops
from knowledge_server.memory.ops import OUTSIDE, MemoryOps, memory_scope
from knowledge_server.memory.policy import MemoryPolicy
from knowledge_server.memory.store import MemoryStore, Scope


def _agent(*roots: Path, org: str = "org") -> Principal:
    return Principal("agent", org, tuple(str(r) for r in roots), "agent")


def _ops(tmp_path: Path) -> MemoryOps:
    return MemoryOps(MemoryStore(tmp_path / "memory.sqlite", MemoryPolicy()))


def test_scope_comes_from_the_principal(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "sub").mkdir(parents=True)
    b.mkdir()
    (a / "link-to-b").symlink_to(b)
    assert memory_scope(_agent(a), "") == Scope("org", str(a))
    assert memory_scope(_agent(a), str(a / "sub")) == Scope("org", str(a / "sub"))
    unrestricted = Principal("local", "org", None, "operator")
    assert memory_scope(unrestricted, "") == Scope("org", "")
    with pytest.raises(InvalidRequest):
        memory_scope(_agent(a, b), "")
    for outside in (str(b), str(a / "link-to-b"), f"{a}/../b", f"{a}-other"):
        with pytest.raises(PermissionDenied):
            memory_scope(_agent(a), outside)
    with pytest.raises(InvalidRequest):
        memory_scope(_agent(a), "a\x00b")


def test_a_sub_workspace_is_an_existing_folder_named_by_where_it_really_is(
    tmp_path: Path,
) -> None:
    """MEM-10: a request's workspace inside the principal's is a memory of its own only as
    an existing folder, judged by its real path; a path that names no folder (made up, a
    file) is refused naming the field, so no name makes a fresh store with its own
    capacity; a link to a folder of the workspace names that folder's memory."""
    a = tmp_path / "a"
    (a / "team" / "api").mkdir(parents=True)
    (a / "notes.txt").write_text("a file\n")
    (a / "alias").symlink_to(a / "team")
    (a / "dangling").symlink_to(a / "gone")
    who = _agent(a)
    assert memory_scope(who, str(a)) == Scope("org", str(a))
    assert memory_scope(who, f"{a}/team/") == Scope("org", str(a / "team"))
    assert memory_scope(who, str(a / "alias")) == Scope("org", str(a / "team"))
    assert memory_scope(who, str(a / "alias" / "api")) == Scope("org", str(a / "team" / "api"))
    assert memory_scope(who, f"{a}/team/../alias/.") == Scope("org", str(a / "team"))
    for made_up in (a / "made-up", a / "team" / "made-up", a / "notes.txt", a / "dangling"):
        with pytest.raises(InvalidRequest) as info:
            memory_scope(who, str(made_up))
        assert info.value.metadata == {"field": "workspace"}
        assert "existing directory" in info.value.message


def test_request_checks(tmp_path: Path) -> None:
    ops, who = _ops(tmp_path), _agent(tmp_path)
    bad = [
        memory_pb2.RememberRequest(category="c", value="v"),  # key needed outside history
        memory_pb2.RememberRequest(category="c", key="k", value="v", confidence=1.5),
        memory_pb2.RememberRequest(store="relations", category="k", key="a -> b", value="c"),
        memory_pb2.RememberRequest(category=" ", key="k", value="v"),
        memory_pb2.RememberRequest(store="secrets", category="c", key="k", value="v"),
    ]
    for req in bad:
        with pytest.raises(InvalidRequest):
            ops.run("remember", req, who)
    for op, req in (
        ("recall", memory_pb2.RecallRequest(limit=-1)),
        ("recall", memory_pb2.RecallRequest(store="nope")),
        ("timeline", memory_pb2.TimelineRequest(category="c", key="k", limit=501)),
        ("restore", memory_pb2.RestoreRequest(limit=-5)),
        ("policy", memory_pb2.PolicyRequest(value="edit")),
    ):
        with pytest.raises(InvalidRequest):
            ops.run(op, req, who)
    history, _ = ops.run(
        "remember", memory_pb2.RememberRequest(store="history", category="deploys", value="v1"), who
    )
    assert isinstance(history, memory_pb2.RememberResponse)
    assert history.entry.key.startswith("h-") and history.entry.store == "history"


def test_required_fields_are_refused_empty_and_names_are_trimmed_alike(tmp_path: Path) -> None:
    """MEM-1 / MEM-7: a field the request declares required (Timeline's category and key,
    Remember's category and value) is refused empty or blank, naming the field; and every
    operation trims a category and a key as Remember stores them, so the spelling a
    write used finds its entry in Timeline and Recall."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    for category, key, missing in (
        ("", "", "category"),
        ("db", " ", "key"),
        (" ", "k", "category"),
    ):
        with pytest.raises(InvalidRequest) as info:
            ops.run("timeline", memory_pb2.TimelineRequest(category=category, key=key), who)
        assert info.value.metadata == {"field": missing} and missing in str(info.value)
    with pytest.raises(InvalidRequest) as info:
        ops.run("remember", memory_pb2.RememberRequest(category="db", key="k", value=" "), who)
    assert info.value.metadata == {"field": "value"}
    ops.run(
        "remember", memory_pb2.RememberRequest(category=" db ", key=" port ", value="5433"), who
    )
    tl, _ = ops.run("timeline", memory_pb2.TimelineRequest(category=" db ", key=" port "), who)
    assert isinstance(tl, memory_pb2.TimelineResponse)
    assert [(v.category, v.key, v.value) for v in tl.versions] == [("db", "port", "5433")]
    found, _ = ops.run("recall", memory_pb2.RecallRequest(category=" db "), who)
    assert isinstance(found, memory_pb2.RecallResponse)
    assert [e.value for e in found.entries] == ["5433"]


def test_output_masks_paths_outside_the_callers_workspace_and_redacts(tmp_path: Path) -> None:
    """A value written by an unrestricted principal into the organisation's memory of a
    workspace, read by a scoped one: paths elsewhere are masked, secrets redacted."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ops = _ops(tmp_path)
    admin = Principal("admin", "org", None, "operator")
    scope = Scope("org", str(ws))
    ops.store.remember(scope, "facts", "c", "k", f"see /etc/hosts and {ws}/app.py", 0.7)
    ops.store.remember(scope, "facts", "c", "s", "key AKIAIOSFODNN7EXAMPLE", 0.7)
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(query=""), _agent(ws))
    assert isinstance(resp, memory_pb2.RecallResponse)
    values = sorted(e.value for e in resp.entries)
    assert values[1] == f"see {OUTSIDE} and {ws}/app.py"
    assert "AKIA" not in values[0] and "[REDACTED:" in values[0]
    everything, _ = ops.run("recall", memory_pb2.RecallRequest(workspace=str(ws)), admin)
    assert isinstance(everything, memory_pb2.RecallResponse)
    assert any("/etc/hosts" in e.value for e in everything.entries)


def test_rooms_left_out_by_the_limit_pass_the_output_boundary(tmp_path: Path) -> None:
    """The rooms a limit cuts are named in ``truncation.omitted_ids`` by their categories:
    masked and redacted as the rooms returned are."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ops = _ops(tmp_path)
    scope = Scope("org", str(ws))
    for key in ("k1", "k2", "k3"):
        ops.store.remember(scope, "facts", "build", key, "make all", 0.7)
    ops.store.remember(scope, "facts", "/srv/ws-b/prod-deploy-keys", "where", "vault", 0.7)
    ops.store.remember(
        scope, "facts", "token ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "t", "x", 0.7
    )
    whole, _ = ops.run("rooms", memory_pb2.RoomsRequest(), _agent(ws))
    cut, _ = ops.run("rooms", memory_pb2.RoomsRequest(limit=1), _agent(ws))
    assert isinstance(whole, memory_pb2.RoomsResponse) and isinstance(cut, memory_pb2.RoomsResponse)
    assert [r.category for r in cut.rooms] == ["build"]
    left_out = list(cut.truncation.omitted_ids)
    assert sorted(left_out) == sorted(r.category for r in whole.rooms[1:])
    assert OUTSIDE in left_out
    assert not any("/srv/ws-b" in c or "ghp_" in c for c in left_out), left_out
    assert any("[REDACTED:" in c for c in left_out), left_out


def test_a_write_and_a_restore_name_the_entries_they_archived_for_the_audit(
    tmp_path: Path,
) -> None:
    """The ids an operation returns for its audit event include what the capacity manager
    archived to make room (docs/memory.md, Audit)."""
    ops = MemoryOps(
        MemoryStore(tmp_path / "memory.sqlite", MemoryPolicy(max_facts=4, reclaim_headroom_pct=0.5))
    )
    who = _agent(tmp_path)
    first = []
    for i in range(4):
        resp, _ = ops.run(
            "remember", memory_pb2.RememberRequest(category="c", key=f"k{i}", value=f"v {i}"), who
        )
        assert isinstance(resp, memory_pb2.RememberResponse)
        first.append(resp.entry.id)
    resp, targets = ops.run(
        "remember", memory_pb2.RememberRequest(category="c", key="k4", value="v 4"), who
    )
    assert isinstance(resp, memory_pb2.RememberResponse) and resp.reclaimed == 2
    assert targets[0] == resp.entry.id and sorted(targets[1:]) == sorted(first[:2])
    scope = memory_scope(who, "")
    live = {f"mem:{e.id}" for e in ops.store.live(scope, "facts")}
    restored, targets = ops.run("restore", memory_pb2.RestoreRequest(limit=2), who)
    assert isinstance(restored, memory_pb2.RestoreResponse)
    evicted = live - {f"mem:{e.id}" for e in ops.store.live(scope, "facts")}
    assert len(restored.restored) == 2 and restored.reclaimed == len(evicted) == 1
    assert sorted(targets) == sorted([e.id for e in restored.restored] + list(evicted))


def test_a_secret_split_over_key_and_value_is_refused_and_never_shown(tmp_path: Path) -> None:
    """Seed 004 "Keine Secrets in Knowledge": an entry is a name and a value, so key
    "password" with value "Tr0ub4dor&3xyz" is a secret though neither half is one alone.
    Refused on write (field ``value``); an entry already stored that way is shown redacted."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    for key, value in (("password", "Tr0ub4dor&3xyz"), ("DB_PASSWORD", "hunter2hunter2")):
        with pytest.raises(SecretRefused) as refused:
            ops.run(
                "remember", memory_pb2.RememberRequest(category="db", key=key, value=value), who
            )
        assert refused.value.metadata == {"field": "value"}
    # Describing where a secret is kept is fine.
    kept, _ = ops.run(
        "remember",
        memory_pb2.RememberRequest(category="db", key="password", value="kept in the vault"),
        who,
    )
    assert isinstance(kept, memory_pb2.RememberResponse) and kept.outcome == "created"
    ops.store.remember(memory_scope(who, ""), "facts", "old", "password", "Tr0ub4dor&3xyz", 0.7)
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(category="old"), who)
    assert isinstance(resp, memory_pb2.RecallResponse)
    [entry] = resp.entries
    assert "Tr0ub4dor" not in entry.value and entry.value.startswith("[REDACTED")


def test_control_characters_are_refused_where_they_would_forge_or_hide_text(
    tmp_path: Path,
) -> None:
    """A category or key is one line of printable text; a value may hold line breaks and
    tabs (a procedure's steps) but no other control character (an escape sequence hides or
    rewrites what a terminal shows). Refused as INVALID_ARGUMENT naming the field."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    bad = (
        ("category", {"category": "ops]\nmem:1 [policy", "key": "k", "value": "v"}),
        ("key", {"category": "c", "key": "k\x1b[2K", "value": "v"}),
        ("key", {"category": "c", "key": "a\u2028b", "value": "v"}),
        ("value", {"category": "c", "key": "k", "value": "ok\x1b[8mhidden"}),
        ("value", {"category": "c", "key": "k", "value": "bell\x07"}),
    )
    for field, fields in bad:
        with pytest.raises(InvalidRequest) as refused:
            ops.run("remember", memory_pb2.RememberRequest(**fields), who)
        assert refused.value.metadata == {"field": field}
    steps, _ = ops.run(
        "remember",
        memory_pb2.RememberRequest(category="c", key="deploy", value="1. build\n\t2. ship"),
        who,
    )
    assert isinstance(steps, memory_pb2.RememberResponse)
    assert steps.entry.value == "1. build\n\t2. ship"


def test_a_path_from_another_users_home_is_held_to_the_workspace(tmp_path: Path) -> None:
    """The path boundary knows ``~user/`` as well as ``~/`` and ``/``: refused on write for a
    principal held to a workspace, masked on output."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ops, who = _ops(tmp_path), _agent(ws)
    for text in ("key file is ~root/.ssh/id_rsa", "see ~/.bashrc", "and /etc/passwd"):
        with pytest.raises(PathOutsideScope):
            ops.run("remember", memory_pb2.RememberRequest(category="c", key="k", value=text), who)
    ops.store.remember(Scope("org", str(ws)), "facts", "c", "k", "in ~root/.ssh/config", 0.7)
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(), who)
    assert isinstance(resp, memory_pb2.RecallResponse)
    assert [e.value for e in resp.entries] == [f"in {OUTSIDE}"]


def test_a_secret_named_by_the_category_or_a_relation_is_refused_and_never_shown(
    tmp_path: Path,
) -> None:
    """The category names the value too (a history entry has no key of its own; a relation's
    kind is its category): "password" / "prod-db" = "Tr0ub4dor&3" is refused. A relation
    stored that way before is shown with its target hidden, in Recall and in Relations. A
    name that only mentions a credential, or a value that says where one is kept, is fine."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    refused = (
        {"category": "password", "key": "prod-db", "value": "Tr0ub4dor&3"},
        {"store": "history", "category": "db password", "value": "Tr0ub4dor&3"},
        {"store": "relations", "category": "password", "key": "prod-db", "value": "Tr0ub4dor&3"},
        {"store": "relations", "category": "uses", "key": "api token", "value": "x9Fq2LmZ7a"},
    )
    for fields in refused:
        with pytest.raises(SecretRefused):
            ops.run("remember", memory_pb2.RememberRequest(**fields), who)  # type: ignore[arg-type]
    fine = (
        ("auth", "handled by the gateway (OIDC)"),
        ("secret_store", "HashiCorp Vault"),
        ("api_key_location", "AWS_Secrets_Manager entry prod/api"),
        ("token_refresh", "automatic every hour"),
        ("password_policy", "minimum twelve characters"),
        ("password", "stored in the team vault"),
        ("password", "vault"),
    )
    for key, value in fine:
        resp, _ = ops.run(
            "remember", memory_pb2.RememberRequest(category="c", key=key, value=value), who
        )
        assert isinstance(resp, memory_pb2.RememberResponse) and resp.entry.value == value
    scope = memory_scope(who, "")
    ops.store.remember(scope, "relations", "uses", "password -> Tr0ub4dor&3", "Tr0ub4dor&3", 0.7)
    recalled, _ = ops.run("recall", memory_pb2.RecallRequest(store="relations"), who)
    assert isinstance(recalled, memory_pb2.RecallResponse)
    shown = [(e.key, e.value) for e in recalled.entries]
    assert shown == [("password -> [REDACTED:credential]", "[REDACTED:credential]")]
    edges, _ = ops.run("relations", memory_pb2.RelationsRequest(), who)
    assert isinstance(edges, memory_pb2.RelationsResponse)
    assert [(e.source, e.target) for e in edges.edges] == [("password", "[REDACTED:credential]")]


def test_invisible_characters_and_a_relation_target_over_lines_are_refused(
    tmp_path: Path,
) -> None:
    """Format characters that hide or reverse text (zero-width space, bidi overrides) are
    refused in every field; a relation's target is one line (it becomes part of the edge's
    key); an emoji sequence's zero-width joiner in a value is fine."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    bad = (
        ("category", {"category": "c\u202e", "key": "k", "value": "v"}),
        ("key", {"category": "c", "key": "k\u2066", "value": "v"}),
        ("value", {"category": "c", "key": "k", "value": "zero\u200bwidth"}),
        (
            "value",
            {"store": "relations", "category": "uses", "key": "api", "value": "db\n\tIGNORE"},
        ),
    )
    for field, fields in bad:
        with pytest.raises(InvalidRequest) as refused:
            ops.run("remember", memory_pb2.RememberRequest(**fields), who)  # type: ignore[arg-type]
        assert refused.value.metadata == {"field": field}
    family = "team \U0001f468\u200d\U0001f469\u200d\U0001f467"
    ok, _ = ops.run(
        "remember", memory_pb2.RememberRequest(category="c", key="emoji", value=family), who
    )
    assert isinstance(ok, memory_pb2.RememberResponse) and ok.entry.value == family


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SECRET_KEY", "Tr0ub4dor&3"),
        ("dbPassword", "Tr0ub4dor&3"),
        ("DBPassword", "Tr0ub4dor&3"),
        ("HTTPPassword", "Tr0ub4dor&3"),
        ("githubToken", "Tr0ub4dor&3"),
        ("passwords", "Tr0ub4dor&3"),
        ("password:", "Tr0ub4dor&3"),
        ("GITHUB_PAT", "Tr0ub4dor&3"),
        ("PIN", "482913"),
        # Shaped like a reference, but more than one: still a password.
        ("DB_PASSWORD", ".hunter2!x"),
        ("DB_PASSWORD", "$ecretP4ss"),
        ("DB_PASSWORD", "Vault2024!"),
        ("api key", "op:Xk9#mQ2pZ"),
        ("password", "4.2Tr0ub4dor"),
        ("password", "~Tr0ub4dor&3"),
        ("password", "12345678"),
    ],
)
def test_credential_names_in_any_spelling_are_caught(tmp_path: Path, key: str, value: str) -> None:
    """A credential's name as code writes it (a setting, camelCase, a plural, with a colon)
    names the value as one: refused on write, hidden on output if stored before. A value
    counts as a reference (a path, a variable, a secret manager's) only when all of it is
    one."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    with pytest.raises(SecretRefused):
        ops.run("remember", memory_pb2.RememberRequest(category="c", key=key, value=value), who)
    ops.store.remember(memory_scope(who, ""), "facts", "c", key, value, 0.7)
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(), who)
    assert isinstance(resp, memory_pb2.RecallResponse)
    assert [e.value for e in resp.entries] == ["[REDACTED:credential]"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ssh private key", "./keys/deploy_ed25519"),
        ("DB_PASSWORD", "aws-secrets-manager"),
        ("DB_PASSWORD", "vault:kv/prod/db"),
        ("DB_PASSWORD", "$DB_PASSWORD"),
        ("numpy pin", "==1.26.4"),
        ("python version pin", "3.11.7"),
        ("gpio pin", "GPIO17"),
        ("auth", "oauth2"),
        ("tokenizer", "unicode61"),
        ("max_tokens", "128000"),
        ("maxTokens", "200000"),
        ("context tokens", "1000000"),
        ("Pat", "pat.smith@corp.com"),
        ("reviewer pat", "@patsmith"),
        ("api key", "op://Private/github/token"),
    ],
)
def test_where_a_credential_is_kept_and_ordinary_facts_are_stored(
    tmp_path: Path, key: str, value: str
) -> None:
    """A path, a variable, a secret manager's name or a version is where a credential is,
    or no credential at all: stored and shown as written."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    resp, _ = ops.run(
        "remember", memory_pb2.RememberRequest(category="c", key=key, value=value), who
    )
    assert isinstance(resp, memory_pb2.RememberResponse) and resp.entry.value == value


def test_joiners_are_kept_only_where_text_needs_them_and_never_hide_a_secret(
    tmp_path: Path,
) -> None:
    """The zero-width joiner is a value's only between two emoji, the non-joiner only
    between letters; a token with a joiner inside is refused like the token itself."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    for key, text in (
        ("fa", "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"),  # Persian, ZWNJ
        ("si", "\u0dc1\u0dca\u200d\u0dbb\u0dd3 Lanka"),  # Sinhala conjunct, ZWJ
        ("bird", "black bird \U0001f426\u200d\u2b1b"),
        ("nod", "head shaking \U0001f642\u200d\u2194\ufe0f"),
    ):
        ok, _ = ops.run(
            "remember", memory_pb2.RememberRequest(category="c", key=key, value=text), who
        )
        assert isinstance(ok, memory_pb2.RememberResponse) and ok.entry.value == text
    hidden = "use ghp_\u200dA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    with pytest.raises(InvalidRequest):
        ops.run("remember", memory_pb2.RememberRequest(category="c", key="k", value=hidden), who)
    with pytest.raises(SecretRefused):
        ops.run(
            "remember",
            memory_pb2.RememberRequest(
                category="c",
                key="k",
                value="\U0001f600\u200d\U0001f600 ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
            ),
            who,
        )
    ops.store.remember(memory_scope(who, ""), "facts", "c", "old", hidden, 0.7)
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(category="c"), who)
    assert isinstance(resp, memory_pb2.RecallResponse)
    assert not any("A1b2C3" in e.value for e in resp.entries)


def test_a_long_value_shaped_like_a_version_is_still_a_credential(tmp_path: Path) -> None:
    """A one-word value of 20,000 characters that starts like a version ("1.111...!") under
    a credential's name is refused: it is no reference (the reference patterns match whole
    values without nested repetition; bench/RESULTS.md has their cost on long values)."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    value = "1." + "1" * 20_000 + "!"
    assert memory_ops._names_a_secret(("password",), value)
    with pytest.raises(SecretRefused):
        ops.run(
            "remember", memory_pb2.RememberRequest(category="c", key="password", value=value), who
        )


def test_a_url_is_no_local_path_but_a_file_url_is(tmp_path: Path) -> None:
    """The path boundary holds local paths to the workspace; ``https://host/...`` names no
    file here and is stored as written, ``file:///etc/passwd`` names one outside."""
    ws = tmp_path / "ws"
    ws.mkdir()
    ops, who = _ops(tmp_path), _agent(ws)
    url = "the guide is at https://example.com/docs/deploy and op://Private/github/token"
    ok, _ = ops.run("remember", memory_pb2.RememberRequest(category="c", key="k", value=url), who)
    assert isinstance(ok, memory_pb2.RememberResponse) and ok.entry.value == url
    with pytest.raises(PathOutsideScope):
        ops.run(
            "remember",
            memory_pb2.RememberRequest(category="c", key="f", value="see file:///etc/passwd"),
            who,
        )


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("db-login", "admin password is Tr0ub4dor&3x", "value"),
        ("db-access", "user admin, password Tr0ub4dor", "value"),
        ("openai", "the api key is 9f8e7d6c5b4a3928171615141312", "value"),
        ("zugang", "Das Passwort lautet Geheim-1234", "value"),
        ("pw", "Tr0ub4dor&3x", "value"),
        ("root_pass", "Tr0ub4dor&3x", "value"),
        ("db_passwort", "Tr0ub4dor&3x", "value"),
        ("password is hunter2x", "kept here", "key"),
        ("prod", "the admin password for prod is Tr0ub4dor&3x", "value"),
        ("prod", "the admin password is: Tr0ub4dor&3x", "value"),
        ("prod", "the admin password was set to Tr0ub4dor&3x", "value"),
        ("prod", "admin password -> Tr0ub4dor&3x", "value"),
    ],
)
def test_a_secret_written_as_a_sentence_or_under_a_short_name_is_refused(
    tmp_path: Path, key: str, value: str, field: str
) -> None:
    """Seed 004 "Keine Secrets in Knowledge": a credential written out after its name in
    a sentence ("admin password is ..."), or under a short or German name ("pw",
    "root_pass", "db_passwort"), is refused like "password" = "...". Before, each was
    stored and came back from Recall as written."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    with pytest.raises(SecretRefused) as refused:
        ops.run("remember", memory_pb2.RememberRequest(category="db", key=key, value=value), who)
    assert refused.value.metadata == {"field": field}


@pytest.mark.parametrize(
    "value",
    [
        "the password is stored in the team vault",
        "token is refreshed every 3600s",
        "the password policy requires 12+ characters",
        "the API key expires in March",
        "password reset links are valid for 24h",
        "max_tokens: 2048",
        "password policy: minimum 12 characters",
        "token budget: 4096 per request",
        "API key rotation: every 90 days",
        "secret manager: aws-secretsmanager in eu-west-1",
        "the token endpoint is https://auth.example.com/oauth2/token",
        "password reset-links expire after 24h",
    ],
)
def test_a_fact_about_a_credential_is_not_taken_for_one(tmp_path: Path, value: str) -> None:
    """The sentence rule reads the one word after a credential's name as a named value is
    read: where a secret is kept, or how it is handled, is a fact memory keeps."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    kept, _ = ops.run(
        "remember", memory_pb2.RememberRequest(category="db", key="note", value=value), who
    )
    assert isinstance(kept, memory_pb2.RememberResponse) and kept.outcome == "created"


def test_a_secret_told_in_a_sentence_stored_before_is_shown_hidden(tmp_path: Path) -> None:
    """An entry stored before sentences were read for credentials ("admin password is
    ...") is shown with the credential as [REDACTED:credential], the rest of the fact
    kept; before, Recall returned it as written."""
    ops, who = _ops(tmp_path), _agent(tmp_path)
    ops.store.remember(
        memory_scope(who, ""), "facts", "db", "login", "admin password is Tr0ub4dor&3x.", 0.7
    )
    resp, _ = ops.run("recall", memory_pb2.RecallRequest(category="db"), who)
    assert isinstance(resp, memory_pb2.RecallResponse)
    [entry] = resp.entries
    assert entry.value == "admin password is [REDACTED:credential]."
