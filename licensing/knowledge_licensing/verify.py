"""Issuing and verifying licence files.

A licence file is one JSON object::

    {"format": "knowledge.licence/v1", "key_id": "...",
     "payload": "<base64url of the canonical payload bytes>",
     "signature": "<base64url of the Ed25519 signature over those bytes>"}

The signature covers the exact payload bytes; they are parsed only after it
verifies. Verification never raises for any input: every failure is a
:class:`LicenceStatus` with a non-VALID state.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .keys import PRIVATE_SUFFIX, load_private_key
from .model import (
    EDITIONS,
    FEATURES,
    LICENCE_FORMAT,
    Licence,
    LicenceState,
    LicenceStatus,
    effective_features,
    format_time,
    parse_time,
    valid_key_id,
)

__all__ = [
    "MAX_LICENCE_BYTES",
    "LicenceWatcher",
    "canonical_payload",
    "decode_unverified",
    "install_licence",
    "issue_licence",
    "load_licence_file",
    "status_at",
    "verify_licence",
]

#: Licence files above this size are rejected unread; a real one is under 1 KiB.
MAX_LICENCE_BYTES = 64 * 1024
_MAX_TEXT_FIELD = 512
_MAX_FEATURES = 64
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_PAYLOAD_FIELDS = (
    "licence_id",
    "licensee",
    "edition",
    "features",
    "not_before",
    "expires_at",
    "issued_at",
    "key_id",
    "format",
)


class _Reject(Exception):
    """Internal: verification stops with this state and reason."""

    def __init__(self, state: LicenceState, reason: str) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason


def canonical_payload(payload: Mapping[str, Any]) -> bytes:
    """JSON with sorted keys, no whitespace, UTF-8 (non-ASCII kept as-is)."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: object, what: str) -> bytes:
    # Strict: the alphabet is checked first because the stdlib decoder would
    # otherwise skip foreign characters silently.
    if not isinstance(text, str) or _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise _Reject(LicenceState.MALFORMED, f"the {what} is not valid base64url")
    try:
        decoded = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise _Reject(LicenceState.MALFORMED, f"the {what} is not valid base64url") from None
    # Unused low bits of the last character must be zero: one encoding per value,
    # so a licence file cannot be altered while still verifying.
    if _b64encode(decoded) != text:
        raise _Reject(LicenceState.MALFORMED, f"the {what} is not canonical base64url")
    return decoded


def _clean_features(features: Iterable[str]) -> list[str]:
    if isinstance(features, (str, bytes)):
        raise TypeError("features must be a collection of names, not a single string")
    cleaned = sorted(set(features))
    unknown = [f for f in cleaned if f not in FEATURES]
    if unknown:
        raise ValueError(f"unknown feature(s): {', '.join(unknown)}; known: {sorted(FEATURES)}")
    return cleaned


def _check_text(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT_FIELD:
        raise ValueError(f"{name} must be a non-empty string of at most {_MAX_TEXT_FIELD} chars")
    return value


def issue_licence(
    private_key_path: str | os.PathLike[str],
    *,
    licence_id: str,
    licensee: str,
    edition: str,
    features: Iterable[str],
    not_before: datetime,
    expires_at: datetime,
    issued_at: datetime | None = None,
    key_id: str | None = None,
) -> bytes:
    """Sign a licence and return the licence file content.

    ``key_id`` defaults to the private key's file stem (``vendor-2027.key`` ->
    ``vendor-2027``), matching the ``.pub`` file a verifier trusts. Datetimes must
    be timezone-aware; they are stored in UTC with second precision.
    """
    key_path = Path(private_key_path)
    if key_id is None:
        key_id = key_path.name.removesuffix(PRIVATE_SUFFIX)
    if not valid_key_id(key_id):
        raise ValueError(f"invalid key id {key_id!r}")
    if edition not in EDITIONS:
        raise ValueError(f"edition must be one of {', '.join(EDITIONS)}")
    issued = issued_at if issued_at is not None else datetime.now(UTC)
    licence = Licence(
        licence_id=_check_text(licence_id, "licence_id"),
        licensee=_check_text(licensee, "licensee"),
        edition=edition,
        features=tuple(_clean_features(features)),
        not_before=parse_time(format_time(not_before)),
        expires_at=parse_time(format_time(expires_at)),
        issued_at=parse_time(format_time(issued)),
        key_id=key_id,
    )
    if licence.expires_at <= licence.not_before:
        raise ValueError("expires_at must be after not_before")
    private_key = load_private_key(key_path)
    payload = canonical_payload(licence.to_payload())
    signature = private_key.sign(payload)
    document = {
        "format": LICENCE_FORMAT,
        "key_id": key_id,
        "payload": _b64encode(payload),
        "signature": _b64encode(signature),
    }
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("ascii")


def _load_json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _Reject(LicenceState.MALFORMED, f"the {what} is not valid UTF-8 JSON") from None


def _parse_envelope(data: bytes) -> tuple[str, bytes, bytes]:
    if len(data) > MAX_LICENCE_BYTES:
        raise _Reject(LicenceState.MALFORMED, "the licence file is too large")
    if not data.strip():
        raise _Reject(LicenceState.MALFORMED, "the licence file is empty")
    document = _load_json(data, "licence file")
    if not isinstance(document, dict):
        raise _Reject(LicenceState.MALFORMED, "the licence file is not a JSON object")
    declared = document.get("format", LICENCE_FORMAT)
    if declared != LICENCE_FORMAT:
        raise _Reject(LicenceState.MALFORMED, "the licence file format is not supported")
    key_id = document.get("key_id")
    if not valid_key_id(key_id):
        raise _Reject(LicenceState.MALFORMED, "the licence file has no valid key id")
    payload = _b64decode(document.get("payload"), "payload")
    signature = _b64decode(document.get("signature"), "signature")
    return key_id, payload, signature


def _parse_payload(payload: bytes, key_id: str) -> Licence:
    body = _load_json(payload, "payload")
    if not isinstance(body, dict):
        raise _Reject(LicenceState.MALFORMED, "the payload is not a JSON object")
    missing = [name for name in _PAYLOAD_FIELDS if name not in body]
    if missing:
        raise _Reject(LicenceState.MALFORMED, f"the payload lacks {', '.join(missing)}")
    try:
        canonical = canonical_payload(body)
    except (ValueError, TypeError, RecursionError):
        canonical = b""
    # Rejecting non-canonical bytes (duplicate keys, extra whitespace) keeps one
    # meaning per signed document.
    if canonical != payload:
        raise _Reject(LicenceState.MALFORMED, "the payload is not in canonical form")
    if body["format"] != LICENCE_FORMAT:
        raise _Reject(LicenceState.MALFORMED, "the payload format is not supported")
    if body["key_id"] != key_id:
        raise _Reject(LicenceState.MALFORMED, "the payload key id does not match the file")
    for name in ("licence_id", "licensee"):
        value = body[name]
        if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT_FIELD:
            raise _Reject(LicenceState.MALFORMED, f"the payload field {name} is invalid")
    edition = body["edition"]
    if edition not in EDITIONS:
        raise _Reject(LicenceState.MALFORMED, "the payload names an unknown edition")
    features = body["features"]
    if (
        not isinstance(features, list)
        or len(features) > _MAX_FEATURES
        or not all(isinstance(f, str) and 0 < len(f) <= 64 for f in features)
    ):
        raise _Reject(LicenceState.MALFORMED, "the payload feature list is invalid")
    times: dict[str, datetime] = {}
    for name in ("not_before", "expires_at", "issued_at"):
        try:
            times[name] = parse_time(body[name])
        except (ValueError, TypeError, OverflowError):
            raise _Reject(
                LicenceState.MALFORMED, f"the payload field {name} is not an RFC 3339 time"
            ) from None
    if times["expires_at"] <= times["not_before"]:
        raise _Reject(LicenceState.MALFORMED, "the licence expires before it starts")
    return Licence(
        licence_id=body["licence_id"],
        licensee=body["licensee"],
        edition=edition,
        features=tuple(features),
        not_before=times["not_before"],
        expires_at=times["expires_at"],
        issued_at=times["issued_at"],
        key_id=key_id,
        format=LICENCE_FORMAT,
    )


def _as_utc(now: datetime) -> datetime:
    # A naive "now" is taken as UTC rather than raising: callers pass clocks.
    if now.tzinfo is None:
        return now.replace(tzinfo=UTC)
    return now.astimezone(UTC)


def status_at(licence: Licence, now: datetime) -> LicenceStatus:
    """The status of a licence whose signature already verified, at time ``now``."""
    now = _as_utc(now)
    if now < licence.not_before:
        return LicenceStatus(
            LicenceState.NOT_YET_VALID,
            licence,
            f"licence {licence.licence_id} is not valid before {format_time(licence.not_before)}",
        )
    if now >= licence.expires_at:
        return LicenceStatus(
            LicenceState.EXPIRED,
            licence,
            f"licence {licence.licence_id} expired at {format_time(licence.expires_at)}",
        )
    return LicenceStatus(
        LicenceState.VALID,
        licence,
        f"{licence.edition} licence {licence.licence_id} valid until "
        f"{format_time(licence.expires_at)}",
        effective_edition=licence.edition,
        effective_features=effective_features(licence.edition, licence.features),
    )


def verify_licence(
    data: bytes | None, keyring: Mapping[str, Ed25519PublicKey], now: datetime
) -> LicenceStatus:
    """Verify licence file content against trusted keys at time ``now``.

    ``None`` means there is no licence (MISSING). Never raises for any ``data``.
    """
    if data is None:
        return LicenceStatus(LicenceState.MISSING, reason="no licence is installed")
    try:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise _Reject(LicenceState.MALFORMED, "the licence content is not bytes")
        key_id, payload, signature = _parse_envelope(bytes(data))
        public_key = keyring.get(key_id)
        if public_key is None:
            raise _Reject(
                LicenceState.UNKNOWN_KEY, f"the licence is signed with unknown key {key_id}"
            )
        try:
            public_key.verify(signature, payload)
        except InvalidSignature:
            raise _Reject(
                LicenceState.BAD_SIGNATURE, f"the signature does not verify with key {key_id}"
            ) from None
        licence = _parse_payload(payload, key_id)
        return status_at(licence, now)
    except _Reject as rejection:
        return LicenceStatus(rejection.state, reason=rejection.reason)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
        return LicenceStatus(
            LicenceState.MALFORMED, reason=f"the licence could not be read ({type(exc).__name__})"
        )


def decode_unverified(data: bytes) -> dict[str, Any] | None:
    """The payload fields WITHOUT checking the signature, for display only.

    Returns None when the file cannot be decoded. Never use this for decisions.
    """
    try:
        _, payload, _ = _parse_envelope(bytes(data))
        body = _load_json(payload, "payload")
    except _Reject:
        return None
    except Exception:  # noqa: BLE001 - display helper, best effort
        return None
    return body if isinstance(body, dict) else None


def _read_bounded(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(MAX_LICENCE_BYTES + 1)


def load_licence_file(
    path: str | os.PathLike[str], keyring: Mapping[str, Ed25519PublicKey], now: datetime
) -> LicenceStatus:
    """Read and verify a licence file. A missing file is MISSING; never raises."""
    try:
        data = _read_bounded(Path(path))
    except FileNotFoundError:
        return LicenceStatus(LicenceState.MISSING, reason="no licence file is installed")
    except OSError as exc:
        return LicenceStatus(
            LicenceState.MALFORMED,
            reason=f"the licence file could not be read ({exc.strerror or type(exc).__name__})",
        )
    except Exception as exc:  # noqa: BLE001 - e.g. a path with a NUL byte
        return LicenceStatus(
            LicenceState.MALFORMED,
            reason=f"the licence file could not be read ({type(exc).__name__})",
        )
    return verify_licence(data, keyring, now)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    # A temporary file in the same directory, then rename: a server polling the
    # licence never sees a half-written file.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def install_licence(
    data: bytes,
    dest: str | os.PathLike[str],
    keyring: Mapping[str, Ed25519PublicKey],
    now: datetime | None = None,
) -> LicenceStatus:
    """Verify ``data`` and, only when it is VALID, write it atomically to ``dest``.

    Returns the verification status; for any other state nothing is written. The
    destination directory is created when missing. Raises OSError when writing fails.
    """
    status = verify_licence(data, keyring, now or datetime.now(UTC))
    if status.state is not LicenceState.VALID:
        return status
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, 0o644)
    return status


_FileSignature = tuple[int, int, int] | tuple[str, str] | None


def _file_signature(path: Path) -> _FileSignature:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return ("error", type(exc).__name__)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class LicenceWatcher:
    """Holds the server's current licence status and notices when it changes.

    Poll :meth:`check` (or :meth:`changed` + :meth:`reload`) about once a second:
    ``changed`` costs one ``stat`` and compares (mtime_ns, size, inode); it also
    reports a change when the clock crossed the loaded licence's not_before or
    expires_at, so a licence expiring while loaded turns EXPIRED with no file
    change. All methods are thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        keyring: Mapping[str, Ed25519PublicKey],
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._path = Path(path)
        self._keyring = keyring
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        self._signature: _FileSignature = None
        self._status = LicenceStatus(LicenceState.MISSING, reason="no licence loaded yet")
        self._load_locked()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def status(self) -> LicenceStatus:
        """The status as of the last load or check (not re-evaluated here)."""
        with self._lock:
            return self._status

    def _load_locked(self) -> None:
        # stat before reading: if the file is swapped in between, the recorded
        # signature is the older one and the next poll reloads again.
        self._signature = _file_signature(self._path)
        self._status = load_licence_file(self._path, self._keyring, self._clock())

    def _time_changed_locked(self, now: datetime) -> bool:
        licence = self._status.licence
        if licence is None:
            return False
        return status_at(licence, now).state is not self._status.state

    def changed(self) -> bool:
        """Cheap: True when the file's identity changed or the time window was crossed."""
        signature = _file_signature(self._path)
        now = self._clock()
        with self._lock:
            return signature != self._signature or self._time_changed_locked(now)

    def reload(
        self, keyring: Mapping[str, Ed25519PublicKey] | None = None
    ) -> tuple[LicenceStatus, LicenceStatus]:
        """Re-read and re-verify the file unconditionally; returns (old, new).

        ``keyring``, when given, replaces the trusted keys before the file is verified.
        """
        with self._lock:
            if keyring is not None:
                self._keyring = keyring
            old = self._status
            self._load_locked()
            return old, self._status

    def check(self) -> tuple[LicenceStatus, LicenceStatus] | None:
        """Reload if the file changed, re-evaluate times otherwise.

        Returns (old, new) when the status changed state or licence, else None.
        """
        signature = _file_signature(self._path)
        now = self._clock()
        with self._lock:
            old = self._status
            if signature != self._signature:
                self._load_locked()
            elif old.licence is not None:
                self._status = status_at(old.licence, now)
            new = self._status
        if new.state is old.state and new.licence == old.licence:
            return None
        return old, new
