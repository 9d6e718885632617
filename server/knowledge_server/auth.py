"""Bearer tokens and the principals they stand for.

Callers send ``authorization: Bearer kn_...`` in the call metadata. The token
store keeps only the SHA-256 of each token (tokens are 256-bit random values, so
a fast hash is enough: there is nothing to brute-force) together with the
principal it maps to. See docs/auth.md.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from knowledge_server.audit import CliRecorder, cli_recorder
from knowledge_server.auth_model import CAPABILITIES, ROLE_RIGHTS, Principal
from knowledge_server.logs import get_logger
from knowledge_server.workspaces import normalise_workspace as _normalise

__all__ = [
    "MANAGE",
    "READ",
    "ROLES",
    "ROLE_AGENT",
    "ROLE_OPERATOR",
    "TOKEN_FILE_NAME",
    "TOKEN_PREFIX",
    "Principal",
    "TokenInfo",
    "TokenStore",
    "TokenStoreError",
    "hash_token",
    "make_principal",
    "normalise_workspace",
    "parse_authorization",
    "principal_from_dict",
    "principal_to_dict",
    "role_allows",
    "token_from_metadata",
    "tokens_group",
]

log = get_logger("knowledge.auth")

#: Right to call the read paths: search, dispatch, get_episode, get_chunk, doc-graph reads.
READ = "read"
#: Right to index / ingest / rebuild and to see detailed status.
MANAGE = "manage"

ROLE_AGENT = "agent"
ROLE_OPERATOR = "operator"
ROLES: tuple[str, ...] = (ROLE_AGENT, ROLE_OPERATOR)
# The rights table itself is in auth_model (ROLE_RIGHTS), next to Principal.

TOKEN_FILE_NAME = "tokens.json"  # noqa: S105 - a file name, not a secret
TOKEN_PREFIX = "kn_"  # noqa: S105 - the public prefix every token shows
_TOKEN_ID_PREFIX = "tok_"  # noqa: S105 - prefix of the public token id
_FILE_VERSION = 1
# A real token is 46 characters; anything far longer is not worth hashing.
_MAX_TOKEN_CHARS = 512
_TOKEN_ID_RE = re.compile(r"tok_[0-9a-f]{12}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def role_allows(role: str, right: str) -> bool:
    """Whether ``role`` carries ``right`` (READ or MANAGE). Unknown values: False."""
    return right in ROLE_RIGHTS.get(role, frozenset())


def normalise_workspace(path: str | os.PathLike[str]) -> str:
    """An absolute, normalised workspace root (``~`` expanded, symlinks left alone)."""
    text = os.fspath(path)
    if not text or "\x00" in text:
        raise ValueError("workspace path must be a non-empty path")
    return _normalise(text)


def make_principal(
    id: object,
    organisation: object,
    workspaces: tuple[str, ...] | None,
    role: object,
    capabilities: Iterable[str] | None = None,
) -> Principal:
    """A validated :class:`Principal`.

    The class itself lives in ``knowledge_server.auth_model`` (shared with the
    transport layer); every principal built from the token file goes through here.
    Raises ValueError for an empty id or organisation, an unknown role, a
    workspace that is not an absolute, normalised path, or a capability the role cannot
    hold (``capabilities`` None: all of the role's).
    """
    if not isinstance(id, str) or not id.strip():
        raise ValueError("principal id must be a non-empty string")
    if not isinstance(organisation, str) or not organisation.strip():
        raise ValueError("organisation must be a non-empty string")
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if workspaces is not None:
        if not isinstance(workspaces, tuple):
            raise ValueError("workspaces must be a tuple or None")
        for root in workspaces:
            if not isinstance(root, str) or not os.path.isabs(root):
                raise ValueError(f"workspace {root!r} is not an absolute path")
            if os.path.normpath(root) != root:
                raise ValueError(f"workspace {root!r} is not normalised")
    caps: frozenset[str] | None = None
    if capabilities is not None:
        if isinstance(capabilities, str):
            raise ValueError("capabilities must be a list of names")
        caps = frozenset(capabilities)
        outside = sorted(c for c in caps if c not in ROLE_RIGHTS[role])
        if outside:
            raise ValueError(
                f"role {role!r} cannot hold {', '.join(map(repr, outside))}"
                f" (it can hold: {', '.join(c for c in CAPABILITIES if c in ROLE_RIGHTS[role])})"
            )
    return Principal(
        id=id, organisation=organisation, workspaces=workspaces, role=role, capabilities=caps
    )


def principal_to_dict(principal: Principal) -> dict[str, Any]:
    """JSON-ready form used in tokens.json and ``token ... --json``."""
    return {
        "id": principal.id,
        "organisation": principal.organisation,
        "workspaces": None if principal.workspaces is None else list(principal.workspaces),
        "role": principal.role,
        **(
            {}
            if principal.capabilities is None
            else {"capabilities": [c for c in CAPABILITIES if c in principal.capabilities]}
        ),
    }


def principal_from_dict(data: Any) -> Principal:
    """Inverse of :func:`principal_to_dict`, validated."""
    if not isinstance(data, dict):
        raise TypeError("principal must be an object")
    workspaces = data.get("workspaces")
    if workspaces is not None:
        if not isinstance(workspaces, list):
            raise ValueError("workspaces must be a list or null")
        workspaces = tuple(workspaces)
    capabilities = data.get("capabilities")
    if capabilities is not None and not isinstance(capabilities, list):
        raise ValueError("capabilities must be a list or absent")
    return make_principal(
        data.get("id"), data.get("organisation"), workspaces, data.get("role"), capabilities
    )


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """Public description of a token: no secret, no hash."""

    token_id: str
    principal: Principal
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "created_at": self.created_at,
            **principal_to_dict(self.principal),
        }


@dataclass(frozen=True, slots=True)
class _Entry:
    token_id: str
    digest: bytes
    principal: Principal
    created_at: str


class TokenStoreError(Exception):
    """The token file cannot be read or written."""


def hash_token(plain_token: str) -> bytes:
    """SHA-256 of the token's UTF-8 bytes."""
    return hashlib.sha256(plain_token.encode("utf-8")).digest()


def _new_token() -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def parse_authorization(metadata_value: str | bytes | None) -> str | None:
    """The token from an ``authorization`` value ``Bearer <token>``; None otherwise.

    The scheme is case-insensitive; the token must be a single word.
    """
    if metadata_value is None:
        return None
    if isinstance(metadata_value, bytes):
        try:
            metadata_value = metadata_value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(metadata_value, str):
        return None
    parts = metadata_value.strip().split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    token = parts[1]
    if len(token) > _MAX_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        return None
    return token


def token_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token from gRPC invocation metadata: its one ``authorization`` entry;
    ``None`` when there is none or more than one (as the server refuses such a call)."""
    values = [value for key, value in metadata or () if key.lower() == "authorization"]
    return parse_authorization(values[0]) if len(values) == 1 else None


def _stat_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _parse_file(raw: bytes) -> list[_Entry]:
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TokenStoreError("token file is not valid JSON") from exc
    if not isinstance(document, dict) or document.get("version") != _FILE_VERSION:
        raise TokenStoreError("token file has an unsupported layout")
    tokens = document.get("tokens")
    if not isinstance(tokens, list):
        raise TokenStoreError("token file has no token list")
    entries: list[_Entry] = []
    for item in tokens:
        try:
            if not isinstance(item, dict):
                raise TypeError("entry is not an object")
            token_id = item["token_id"]
            digest_hex = item["sha256"]
            if not isinstance(token_id, str) or _TOKEN_ID_RE.fullmatch(token_id) is None:
                raise ValueError("bad token id")
            if not isinstance(digest_hex, str) or _SHA256_RE.fullmatch(digest_hex) is None:
                raise ValueError("bad sha256")
            created_at = item.get("created_at", "")
            entries.append(
                _Entry(
                    token_id=token_id,
                    digest=bytes.fromhex(digest_hex),
                    principal=principal_from_dict(item.get("principal")),
                    created_at=created_at if isinstance(created_at, str) else "",
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenStoreError(f"token file has an invalid entry ({exc})") from None
    return entries


def _serialise(entries: Sequence[_Entry]) -> bytes:
    document = {
        "version": _FILE_VERSION,
        "tokens": [
            {
                "token_id": e.token_id,
                "sha256": e.digest.hex(),
                "principal": principal_to_dict(e.principal),
                "created_at": e.created_at,
            }
            for e in entries
        ],
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


class TokenStore:
    """Hashed bearer tokens in ``<data_dir>/tokens.json`` (mode 0600).

    Writers (the CLI) lock a sibling ``.lock`` file for the read-modify-write and
    replace the file atomically; the server only reads and reloads whenever the
    file's (mtime_ns, size, inode) changes, so revocations apply without restart.
    A file that cannot be parsed authenticates nobody (fail closed).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._signature: tuple[int, int, int] | str | None = "unloaded"
        self._broken = False

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str]) -> TokenStore:
        return cls(Path(data_dir) / TOKEN_FILE_NAME)

    @property
    def path(self) -> Path:
        return self._path

    # -- reading -----------------------------------------------------------------

    def _read_entries(self) -> list[_Entry]:
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise TokenStoreError(f"cannot read {self._path}: {exc.strerror or exc}") from None
        return _parse_file(raw)

    def _refresh_locked(self) -> None:
        signature = _stat_signature(self._path)
        if signature == self._signature:
            return
        try:
            self._entries = self._read_entries()
            self._broken = False
        except TokenStoreError as exc:
            self._entries = []
            self._broken = True
            # The reason names the problem (not valid JSON, a bad entry, an OS error), never
            # a stored hash.
            log.error(
                "auth.token_file_unreadable",
                path=str(self._path),
                reason=str(exc),
                consequence="refusing all tokens",
            )
        self._signature = signature

    def reload(self) -> None:
        """Force a re-read on the next access."""
        with self._lock:
            self._signature = "unloaded"
            self._refresh_locked()

    def authenticate(self, plain_token: str | None) -> Principal | None:
        """The principal for ``plain_token``, or None.

        Compares the digest with every entry using ``hmac.compare_digest`` and no
        early exit, so timing does not reveal which entry (if any) matched.
        """
        if not isinstance(plain_token, str) or not plain_token:
            return None
        if len(plain_token) > _MAX_TOKEN_CHARS:
            return None
        digest = hash_token(plain_token)
        with self._lock:
            self._refresh_locked()
            entries = self._entries
        found: Principal | None = None
        for entry in entries:
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found

    def list(self) -> list[TokenInfo]:
        """All tokens, oldest first, without hashes. Raises TokenStoreError if unreadable."""
        with self._lock:
            entries = self._read_entries()
        return [TokenInfo(e.token_id, e.principal, e.created_at) for e in entries]

    # -- writing -----------------------------------------------------------------

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self._path.with_name(self._path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write_entries(self, entries: Sequence[_Entry]) -> None:
        data = _serialise(entries)
        # mkstemp creates the file 0600, so it is never readable by others.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{self._path.name}.", dir=self._path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp_name, 0o600)
            os.replace(tmp_name, self._path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    def create(
        self,
        principal_id: str,
        organisation: str,
        workspaces: Sequence[str | os.PathLike[str]] | None,
        role: str,
        capabilities: Iterable[str] | None = None,
    ) -> tuple[str, str]:
        """Add a token; returns (token_id, plain_token). The plain token is not stored.
        ``capabilities``: a subset of the role's (None: all of them)."""
        roots = (
            None
            if workspaces is None
            else tuple(dict.fromkeys(normalise_workspace(p) for p in workspaces))
        )
        principal = make_principal(principal_id, organisation, roots, role, capabilities)
        plain = _new_token()
        with self._lock, self._write_lock():
            entries = self._read_entries()
            known = {e.token_id for e in entries}
            token_id = f"{_TOKEN_ID_PREFIX}{secrets.token_hex(6)}"
            while token_id in known:
                token_id = f"{_TOKEN_ID_PREFIX}{secrets.token_hex(6)}"
            created = datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
            entries.append(_Entry(token_id, hash_token(plain), principal, created))
            self._write_entries(entries)
            self._signature = "unloaded"
        return token_id, plain

    def revoke(self, token_id: str) -> bool:
        """Remove a token; True when it existed."""
        with self._lock, self._write_lock():
            entries = self._read_entries()
            kept = [e for e in entries if e.token_id != token_id]
            if len(kept) == len(entries):
                return False
            self._write_entries(kept)
            self._signature = "unloaded"
        return True


# -- CLI -------------------------------------------------------------------------


def _store_from(ctx: click.Context, data_dir: Path | None) -> TokenStore:
    if data_dir is None:
        obj = ctx.find_object(dict)
        if obj and obj.get("data_dir"):
            data_dir = Path(obj["data_dir"])
    if data_dir is None:
        raise click.UsageError("no data directory: pass --data-dir")
    return TokenStore.in_data_dir(data_dir)


def _data_dir_option(func: Any) -> Any:
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Data directory holding tokens.json (default: the service's data directory).",
    )(func)


@click.group(name="token")
def tokens_group() -> None:
    """Create, list and revoke bearer tokens for callers.

    Tokens are stored as SHA-256 hashes in <data dir>/tokens.json; the plain token
    is shown once, at creation.
    """


@tokens_group.command("create")
@click.option("--id", "principal_id", required=True, help="Principal id (who the token is for).")
@click.option("--org", "organisation", required=True, help="Organisation of the principal.")
@click.option(
    "--workspace",
    "workspaces",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Workspace root the token may see (repeatable; made absolute).",
)
@click.option(
    "--all-workspaces",
    is_flag=True,
    help="Allow every configured workspace instead of listing them.",
)
@click.option(
    "--role",
    type=click.Choice(ROLES),
    required=True,
    help="agent: search and read. operator: also index, ingest, rebuild, detailed status.",
)
@click.option(
    "--capability",
    "capabilities",
    multiple=True,
    type=click.Choice(CAPABILITIES),
    help="Give the token only these capabilities (repeatable; each must be one the role"
    " can hold). Default: all of the role's. agent: read, kb.read, memory.read,"
    " memory.write; operator: all.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@_data_dir_option
@click.pass_context
def create_command(
    ctx: click.Context,
    principal_id: str,
    organisation: str,
    workspaces: tuple[Path, ...],
    all_workspaces: bool,
    role: str,
    capabilities: tuple[str, ...],
    as_json: bool,
    data_dir: Path | None,
) -> None:
    """Create a token and print it once; it cannot be shown again.

    Give either one or more --workspace paths or --all-workspaces.
    """
    if bool(workspaces) == all_workspaces:
        raise click.UsageError("give --workspace PATH (repeatable) or --all-workspaces")
    store = _store_from(ctx, data_dir)
    with _audited(store) as record:
        try:
            token_id, plain = store.create(
                principal_id,
                organisation,
                None if all_workspaces else list(workspaces),
                role,
                capabilities or None,
            )
        except (ValueError, TokenStoreError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        info = next(t for t in store.list() if t.token_id == token_id)
        try:
            # The token itself is never part of the event: the input hashed is the principal.
            record(
                "token.create",
                org=organisation,
                targets=[token_id],
                input=principal_to_dict(info.principal),
            )
        except Exception:
            store.revoke(token_id)  # an unrecorded token is not left working
            raise
    if as_json:
        click.echo(json.dumps({**info.to_dict(), "token": plain}, sort_keys=True))
        return
    click.echo(f"token id: {token_id}")
    click.echo(f"token:    {plain}")
    click.echo("Store the token now: only its hash is kept and it cannot be shown again.")


@contextlib.contextmanager
def _audited(store: TokenStore) -> Iterator[CliRecorder]:
    """The audit log for a token write, opened before the token file changes: a log that
    cannot be written stops the write (a one-line error, nothing changed)."""
    try:
        with cli_recorder(store.path.parent) as record:
            yield record
    except click.ClickException:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the log is told the same way
        raise click.ClickException(
            f"the audit log cannot be written ({type(exc).__name__}): nothing was changed"
        ) from None


@tokens_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@_data_dir_option
@click.pass_context
def list_command(ctx: click.Context, as_json: bool, data_dir: Path | None) -> None:
    """List tokens (ids and principals; never the tokens or their hashes)."""
    store = _store_from(ctx, data_dir)
    try:
        tokens = store.list()
    except TokenStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"tokens": [t.to_dict() for t in tokens]}, sort_keys=True))
        return
    if not tokens:
        click.echo("no tokens")
        return
    for t in tokens:
        p = t.principal
        roots = "all workspaces" if p.workspaces is None else ", ".join(p.workspaces)
        caps = "" if p.capabilities is None else f"  [{', '.join(p.held())}]"
        click.echo(
            f"{t.token_id}  {p.role:<8}  {p.id} ({p.organisation})  {roots}  {t.created_at}{caps}"
        )


@tokens_group.command("revoke")
@click.argument("token_id")
@_data_dir_option
@click.pass_context
def revoke_command(ctx: click.Context, token_id: str, data_dir: Path | None) -> None:
    """Revoke a token by id; running servers stop accepting it on their next call."""
    store = _store_from(ctx, data_dir)
    with _audited(store) as record:
        try:
            holder = next((t.principal for t in store.list() if t.token_id == token_id), None)
            removed = store.revoke(token_id)
        except TokenStoreError as exc:
            raise click.ClickException(str(exc)) from None
        if not removed or holder is None:
            raise click.ClickException(f"no token with id {token_id}")
        try:
            record(
                "token.revoke",
                org=holder.organisation,
                targets=[token_id],
                input={"token_id": token_id},
            )
        except Exception as exc:  # noqa: BLE001 - the revocation stands; say it was not recorded
            raise click.ClickException(
                f"revoked {token_id}, but its audit event could not be written "
                f"({type(exc).__name__})"
            ) from None
    click.echo(f"revoked {token_id}")
