"""Bearer tokens, principals, role rights and the `token` CLI."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from knowledge_server.auth import (
    MANAGE,
    READ,
    Principal,
    TokenStore,
    TokenStoreError,
    make_principal,
    parse_authorization,
    role_allows,
    token_from_metadata,
    tokens_group,
)


@pytest.fixture()
def store(tmp_path: Path) -> TokenStore:
    return TokenStore.in_data_dir(tmp_path / "data")


def test_create_stores_only_the_hash(store: TokenStore, tmp_path: Path) -> None:
    token_id, plain = store.create("agent-1", "acme", [str(tmp_path / "ws")], "agent")
    assert plain.startswith("kn_") and len(plain) == 46
    assert token_id.startswith("tok_")
    text = store.path.read_text()
    assert plain not in text
    assert plain[3:] not in text
    assert token_id in text
    doc = json.loads(text)
    assert set(doc["tokens"][0]) == {"token_id", "sha256", "principal", "created_at"}


def test_file_permissions(store: TokenStore) -> None:
    store.create("a", "acme", None, "operator")
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    store.create("b", "acme", None, "agent")  # rewritten file keeps the mode
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    leftovers = [p.name for p in store.path.parent.iterdir() if p.name.startswith(".tokens")]
    assert leftovers == []


def test_authenticate_good_bad_revoked(store: TokenStore, tmp_path: Path) -> None:
    ws = tmp_path / "ws" / "sub" / ".."
    id_a, token_a = store.create("agent-1", "acme", [str(ws)], "agent")
    _, token_b = store.create("ops", "acme", None, "operator")
    principal = store.authenticate(token_a)
    assert principal == Principal(
        id="agent-1", organisation="acme", workspaces=(str(tmp_path / "ws"),), role="agent"
    )
    operator = store.authenticate(token_b)
    assert operator is not None and operator.workspaces is None and operator.role == "operator"
    assert store.authenticate(token_a + "x") is None
    assert store.authenticate("kn_" + "A" * 43) is None
    assert store.authenticate("") is None
    assert store.authenticate(None) is None
    assert store.authenticate("x" * 10_000) is None

    assert store.revoke(id_a)
    assert not store.revoke(id_a)
    assert store.authenticate(token_a) is None
    assert store.authenticate(token_b) is not None


def test_revocation_by_another_process_is_seen(store: TokenStore) -> None:
    token_id, plain = store.create("agent-1", "acme", None, "agent")
    server_view = TokenStore(store.path)
    assert server_view.authenticate(plain) is not None
    TokenStore(store.path).revoke(token_id)  # e.g. the CLI
    assert server_view.authenticate(plain) is None


def test_corrupt_file_fails_closed(store: TokenStore) -> None:
    _, plain = store.create("agent-1", "acme", None, "agent")
    server_view = TokenStore(store.path)
    assert server_view.authenticate(plain) is not None
    store.path.write_text("{not json")
    assert server_view.authenticate(plain) is None
    with pytest.raises(TokenStoreError):
        store.list()


def test_unreadable_token_file_is_one_structured_event_with_its_path(store: TokenStore) -> None:
    from structlog.testing import capture_logs

    _, plain = store.create("agent-1", "acme", None, "agent")
    server_view = TokenStore(store.path)
    assert server_view.authenticate(plain) is not None
    store.path.write_text("{not json")
    with capture_logs() as logs:
        assert server_view.authenticate(plain) is None
        assert server_view.authenticate(plain) is None  # the same file: reported once
    assert logs == [
        {
            "event": "auth.token_file_unreadable",
            "log_level": "error",
            "path": str(store.path),
            "reason": "token file is not valid JSON",
            "consequence": "refusing all tokens",
        }
    ]


def test_list_has_no_hashes(store: TokenStore) -> None:
    store.create("agent-1", "acme", None, "agent")
    infos = store.list()
    assert len(infos) == 1
    assert "sha256" not in infos[0].to_dict()
    assert infos[0].principal.id == "agent-1"


def test_principal_validation() -> None:
    with pytest.raises(ValueError):
        make_principal("a", "o", None, "root")
    with pytest.raises(ValueError):
        make_principal("a", "o", ("relative/path",), "agent")
    with pytest.raises(ValueError):
        make_principal("a", "o", ("/a/../b",), "agent")
    with pytest.raises(ValueError):
        make_principal("", "o", None, "agent")
    ok = make_principal("a", "o", ("/srv/repo",), "agent")
    assert isinstance(ok, Principal) and ok.allows(READ) and not ok.allows(MANAGE)
    # one Principal class is shared with the transport layer
    from knowledge_server.auth_model import Principal as SharedPrincipal

    assert Principal is SharedPrincipal


def test_role_rights() -> None:
    assert role_allows("agent", READ)
    assert not role_allows("agent", MANAGE)
    assert role_allows("operator", READ)
    assert role_allows("operator", MANAGE)
    assert not role_allows("guest", READ)
    assert not role_allows("operator", "delete-everything")


def test_parse_authorization() -> None:
    assert parse_authorization("Bearer kn_abc") == "kn_abc"
    assert parse_authorization("bearer   kn_abc  ") == "kn_abc"
    assert parse_authorization(b"Bearer kn_abc") == "kn_abc"
    assert parse_authorization("Basic dXNlcjpwYXNz") is None
    assert parse_authorization("Bearer") is None
    assert parse_authorization("Bearer a b") is None
    assert parse_authorization("") is None
    assert parse_authorization(None) is None
    assert parse_authorization(b"Bearer \xff") is None
    metadata = [("x-other", "1"), ("Authorization", "Bearer kn_xyz")]
    assert token_from_metadata(metadata) == "kn_xyz"
    assert token_from_metadata([]) is None
    twice = [("authorization", "Bearer kn_xyz"), ("Authorization", "Bearer kn_abc")]
    assert token_from_metadata(twice) is None


def test_cli_create_list_revoke(tmp_path: Path) -> None:
    runner = CliRunner()
    data = tmp_path / "data"
    ws = tmp_path / "ws"
    result = runner.invoke(
        tokens_group,
        [
            "create",
            "--id",
            "agent-1",
            "--org",
            "acme",
            "--workspace",
            str(ws),
            "--role",
            "agent",
            "--json",
        ],
        obj={"data_dir": str(data)},
    )
    assert result.exit_code == 0, result.output
    created = json.loads(result.output)
    assert created["token"].startswith("kn_") and created["workspaces"] == [str(ws)]
    assert created["token"] not in (data / "tokens.json").read_text()

    result = runner.invoke(tokens_group, ["list", "--json", "--data-dir", str(data)])
    assert result.exit_code == 0
    listed = json.loads(result.output)["tokens"]
    assert [t["token_id"] for t in listed] == [created["token_id"]]
    assert "sha256" not in result.output and created["token"] not in result.output

    result = runner.invoke(tokens_group, ["list"], obj={"data_dir": str(data)})
    assert result.exit_code == 0 and created["token_id"] in result.output

    store = TokenStore.in_data_dir(data)
    assert store.authenticate(created["token"]) is not None
    result = runner.invoke(
        tokens_group, ["revoke", created["token_id"]], obj={"data_dir": str(data)}
    )
    assert result.exit_code == 0
    assert store.authenticate(created["token"]) is None
    result = runner.invoke(
        tokens_group, ["revoke", created["token_id"]], obj={"data_dir": str(data)}
    )
    assert result.exit_code == 1


def test_cli_create_human_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    data = tmp_path / "data"
    result = runner.invoke(
        tokens_group,
        [
            "create",
            "--id",
            "ops",
            "--org",
            "acme",
            "--all-workspaces",
            "--role",
            "operator",
            "--data-dir",
            str(data),
        ],
    )
    assert result.exit_code == 0 and "kn_" in result.output
    # neither --workspace nor --all-workspaces
    result = runner.invoke(
        tokens_group,
        ["create", "--id", "x", "--org", "o", "--role", "agent", "--data-dir", str(data)],
    )
    assert result.exit_code == 2
    result = runner.invoke(
        tokens_group,
        [
            "create",
            "--id",
            "x",
            "--org",
            "o",
            "--all-workspaces",
            "--role",
            "root",
            "--data-dir",
            str(data),
        ],
    )
    assert result.exit_code == 2
    result = runner.invoke(tokens_group, ["list"])  # no data dir anywhere
    assert result.exit_code == 2
    result = runner.invoke(tokens_group, ["--help"])
    assert result.exit_code == 0 and "revoke" in result.output


# -- capabilities ---------------------------------------------------------------------


def test_a_token_holds_its_roles_capabilities_or_the_subset_it_was_given(tmp_path: Path) -> None:
    """An operator token limited to kb.edit cannot review or publish; an agent token holds
    kb.read and memory but never a management capability."""
    store = TokenStore.in_data_dir(tmp_path)
    _, editor = store.create("ed", "acme", None, "operator", ["kb.read", "kb.edit"])
    _, agent = store.create("ag", "acme", None, "agent")
    _, quiet = store.create("q", "acme", None, "agent", ["read", "kb.read", "memory.read"])
    ed, ag, q = (store.authenticate(t) for t in (editor, agent, quiet))
    assert ed is not None and ag is not None and q is not None
    assert ed.held() == ("kb.read", "kb.edit")
    assert not ed.allows("kb.publish") and not ed.allows("manage") and not ed.allows("read")
    assert ag.held() == ("read", "kb.read", "memory.read", "memory.write")
    assert not q.allows("memory.write") and q.allows("memory.read")
    with pytest.raises(ValueError, match=r"cannot hold 'kb\.publish'"):
        store.create("x", "acme", None, "agent", ["kb.publish"])
    # Stored and read back the same way: a token created without a list has all of the role's.
    listed = {t.principal.id: t.to_dict() for t in store.list()}
    assert "capabilities" not in listed["ag"] and listed["ed"]["capabilities"] == [
        "kb.read",
        "kb.edit",
    ]


def test_token_create_cli_takes_capabilities(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["token", "create", "--id", "ed", "--org", "acme", "--all-workspaces"]
    ok = runner.invoke(
        tokens_group,
        [
            *base[1:],
            "--role",
            "operator",
            "--capability",
            "kb.edit",
            "--json",
            "--data-dir",
            str(tmp_path),
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["capabilities"] == ["kb.edit"]
    bad = runner.invoke(
        tokens_group,
        [*base[1:], "--role", "agent", "--capability", "kb.admin", "--data-dir", str(tmp_path)],
    )
    assert bad.exit_code != 0 and "cannot hold 'kb.admin'" in bad.output


def test_a_token_write_the_audit_log_cannot_record_changes_nothing(tmp_path: Path) -> None:
    """Every write audited: ``token create`` wrote the token file first and the event
    after, so with an audit log that cannot be written it left a working operator token
    no event records (its value never printed), and ``revoke`` an unrecorded revocation.
    The log is opened first: a one-line error, and the token file as it was."""
    runner = CliRunner()
    create = ["create", "--id", "a", "--org", "o", "--role", "agent", "--all-workspaces"]
    made = runner.invoke(tokens_group, [*create, "--json", "--data-dir", str(tmp_path)])
    assert made.exit_code == 0, made.output
    token_id = json.loads(made.output)["token_id"]
    tokens = tmp_path / "tokens.json"
    before = tokens.read_bytes()
    (tmp_path / "audit.sqlite").rename(tmp_path / "audit.moved")
    (tmp_path / "audit.sqlite").mkdir()  # cannot be opened as a database
    for args in (create, ["revoke", token_id]):
        out = runner.invoke(tokens_group, [*args, "--data-dir", str(tmp_path)])
        assert out.exit_code == 1 and "audit log cannot be written" in out.output, out.output
        assert "Traceback" not in out.output
        assert tokens.read_bytes() == before
