"""``knowledge license ...``: key generation, issuing, inspecting and verifying licences.

The group is mounted by the main CLI; it also works on its own
(``python -m knowledge_licensing.cli``).
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import click

from .keys import DEFAULT_KEYRING, KeyRing, KeyRingError, generate_keypair
from .model import (
    EDITIONS,
    FEATURES,
    ISSUE_DEFAULT_FEATURES,
    LicenceState,
    LicenceStatus,
    format_time,
    parse_time,
)
from .verify import (
    MAX_LICENCE_BYTES,
    decode_unverified,
    issue_licence,
    verify_licence,
    write_atomic,
)

__all__ = ["license_group"]

# Exit codes: 0 success / VALID, 1 licence not valid, 2 usage or environment error.
EXIT_INVALID = 1
EXIT_ERROR = 2


class _Rfc3339(click.ParamType[datetime, Any]):
    name = "RFC3339"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(value)
        except (ValueError, TypeError):
            self.fail(f"{value!r} is not an RFC 3339 time with offset, e.g. 2027-01-31T00:00:00Z")


RFC3339 = _Rfc3339()


def _now() -> datetime:
    return datetime.now(UTC)


def _fail(message: str, as_json: bool = False) -> NoReturn:
    """Report an environment error (exit 2); in --json mode still one JSON document."""
    if as_json:
        click.echo(json.dumps({"error": message}, sort_keys=True))
    else:
        click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(EXIT_ERROR)


def _printable(value: object) -> str:
    # Unverified payload text is attacker-controlled; keep control characters
    # (terminal escapes) out of the operator's terminal.
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)[:200]


def _load_ring(keys_dir: Path | None, as_json: bool) -> KeyRing:
    if keys_dir is None:
        return DEFAULT_KEYRING
    try:
        return DEFAULT_KEYRING.merged(KeyRing.from_directory(keys_dir))
    except KeyRingError as exc:
        _fail(str(exc), as_json)


def _read_licence(path: Path) -> tuple[bytes | None, LicenceStatus | None]:
    """(content, None), or (None, status) when the file is absent or unreadable.

    Mirrors load_licence_file so the CLI and the server agree on the state.
    """
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_LICENCE_BYTES + 1), None
    except FileNotFoundError:
        return None, LicenceStatus(LicenceState.MISSING, reason="no licence file is installed")
    except OSError as exc:
        reason = f"the licence file could not be read ({exc.strerror or type(exc).__name__})"
        return None, LicenceStatus(LicenceState.MALFORMED, reason=reason)


def _examine(path: Path, ring: KeyRing) -> tuple[bytes | None, LicenceStatus]:
    data, failure = _read_licence(path)
    if failure is not None:
        return None, failure
    return data, verify_licence(data, ring, _now())


@click.group(name="license")
def license_group() -> None:
    """Create signing keys, issue licences, and check licence files.

    A licence is a JSON file holding a base64url payload and an Ed25519 signature.
    The server trusts the vendor public keys shipped with it; a directory of further
    <key_id>.pub files only as development keys (licence_dev_keys_dir).
    """


@license_group.command("keygen")
@click.option(
    "--key-id",
    required=True,
    help="Name of the key pair (letters, digits, '.', '_', '-'); becomes the file names.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for <key_id>.key (private, mode 0600) and <key_id>.pub.",
)
def keygen_command(key_id: str, out_dir: Path) -> None:
    """Generate a vendor signing key pair.

    The private key never leaves its file: keep it off servers and out of the
    repository. Only the .pub file is distributed: a vendor key ships inside the
    package (knowledge_licensing/vendor_keys), a development key goes to the
    licence_dev_keys_dir of the servers that should accept it.
    """
    try:
        private_path, public_path = generate_keypair(key_id, out_dir)
    except (ValueError, FileExistsError, OSError) as exc:
        _fail(str(exc))
    click.echo(f"private key: {private_path} (mode 0600; keep it secret)")
    click.echo(f"public key:  {public_path}")


@license_group.command("issue")
@click.option(
    "--key",
    "key_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Private key file (<key_id>.key) to sign with.",
)
@click.option("--key-id", default=None, help="Key id to record; defaults to the key file stem.")
@click.option("--licensee", required=True, help="Name of the licensed organisation.")
@click.option("--edition", required=True, type=click.Choice(EDITIONS), help="Licensed edition.")
@click.option(
    "--feature",
    "features",
    multiple=True,
    type=click.Choice(sorted(FEATURES)),
    help="Feature to list (repeatable). Default: the edition's standard features "
    "(doc-graph for pro and enterprise).",
)
@click.option(
    "--days", type=click.IntRange(min=1), default=None, help="Validity in days (default 365)."
)
@click.option("--expires", type=RFC3339, default=None, help="Expiry time (RFC 3339, UTC offset).")
@click.option(
    "--not-before", type=RFC3339, default=None, help="Start of validity (RFC 3339); default now."
)
@click.option("--id", "licence_id", default=None, help="Licence id; default a random lic_... id.")
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Licence file to write.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing licence file.")
def issue_command(
    key_path: Path,
    key_id: str | None,
    licensee: str,
    edition: str,
    features: tuple[str, ...],
    days: int | None,
    expires: datetime | None,
    not_before: datetime | None,
    licence_id: str | None,
    out_path: Path,
    force: bool,
) -> None:
    """Sign a licence with a vendor private key and write it to --out."""
    if days is not None and expires is not None:
        raise click.UsageError("use either --days or --expires, not both")
    start = not_before or _now()
    if expires is None:
        expires = start + timedelta(days=days if days is not None else 365)
    chosen = features if features else tuple(sorted(ISSUE_DEFAULT_FEATURES[edition]))
    if out_path.exists() and not force:
        _fail(f"{out_path} already exists (use --force to replace it)")
    try:
        content = issue_licence(
            key_path,
            licence_id=licence_id or f"lic_{secrets.token_hex(8)}",
            licensee=licensee,
            edition=edition,
            features=chosen,
            not_before=start,
            expires_at=expires,
            key_id=key_id,
        )
    except (ValueError, KeyRingError) as exc:
        _fail(str(exc))
    try:
        write_atomic(out_path, content, 0o644)
    except OSError as exc:
        _fail(f"cannot write {out_path}: {exc.strerror or exc}")
    payload = decode_unverified(content) or {}
    click.echo(
        f"issued {payload.get('licence_id')} to {_printable(licensee)}: {edition}, "
        f"features [{', '.join(payload.get('features', []))}], "
        f"{format_time(start)} .. {format_time(expires)} -> {out_path}"
    )


def _status_document(path: Path, status: LicenceStatus, data: bytes | None) -> dict[str, Any]:
    document = status.to_dict()
    document["file"] = str(path)
    if status.licence is None and data is not None:
        document["unverified_payload"] = decode_unverified(data)
    return document


def _echo_status(path: Path, status: LicenceStatus, data: bytes | None) -> None:
    click.echo(f"file:      {path}")
    click.echo(f"state:     {status.state.name}")
    click.echo(f"reason:    {_printable(status.reason)}")
    click.echo(
        f"effective: {status.effective_edition} [{', '.join(sorted(status.effective_features))}]"
    )
    fields: dict[str, Any] | None
    if status.licence is not None:
        fields = status.licence.to_payload()
        click.echo("payload (signature verified):")
    else:
        fields = decode_unverified(data) if data is not None else None
        if fields is not None:
            click.echo("payload (NOT verified, for information only):")
    for name, value in sorted((fields or {}).items()):
        shown = ", ".join(map(_printable, value)) if isinstance(value, list) else _printable(value)
        click.echo(f"  {_printable(name)}: {shown}")


@license_group.command("inspect")
@click.argument("licence_file", type=click.Path(path_type=Path))
@click.option(
    "--keys",
    "keys_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of further trusted <key_id>.pub files (default: shipped vendor keys only).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def inspect_command(licence_file: Path, keys_dir: Path | None, as_json: bool) -> None:
    """Show a licence's fields and its verification state.

    Exits 0 whenever the file could be examined, whatever its state; fields of a
    licence whose signature does not verify are shown marked as unverified.
    """
    ring = _load_ring(keys_dir, as_json)
    data, status = _examine(licence_file, ring)
    if as_json:
        click.echo(json.dumps(_status_document(licence_file, status, data), sort_keys=True))
    else:
        _echo_status(licence_file, status, data)


@license_group.command("verify")
@click.argument("licence_file", type=click.Path(path_type=Path))
@click.option(
    "--keys",
    "keys_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of trusted <key_id>.pub files (in addition to the shipped vendor keys).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def verify_command(licence_file: Path, keys_dir: Path, as_json: bool) -> None:
    """Verify a licence file now. Exit code 0 only when it is VALID, 1 otherwise."""
    ring = _load_ring(keys_dir, as_json)
    _, status = _examine(licence_file, ring)
    if as_json:
        document = status.to_dict()
        document["file"] = str(licence_file)
        click.echo(json.dumps(document, sort_keys=True))
    else:
        click.echo(f"{status.state.name}: {_printable(status.reason)}")
    if status.state is not LicenceState.VALID:
        raise click.exceptions.Exit(EXIT_INVALID)


if __name__ == "__main__":  # pragma: no cover
    license_group()
