"""Vendor signing keys: generation, loading, and the verifier's key ring.

Files (PEM, so they can be inspected with ``openssl pkey``):

* ``<key_id>.key`` - Ed25519 private key, PKCS#8, unencrypted, mode 0600;
* ``<key_id>.pub`` - Ed25519 public key, SubjectPublicKeyInfo.

A key ring directory holds only ``.pub`` files; the key id is the file stem.

The only production trust anchors are the vendor public keys shipped inside this
package (``vendor_keys/*.pub``, package data). A directory of further ``.pub`` files
is trusted only when an operator enables development keys explicitly (the server's
``licence_dev_keys_dir``); licences verified with such a key are reported as such.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .model import LicenceState, LicenceStatus, valid_key_id

__all__ = [
    "DEFAULT_KEYRING",
    "KeyRing",
    "KeyRingError",
    "TrustedKeys",
    "generate_keypair",
    "load_keyring",
    "load_private_key",
    "load_public_key",
    "load_shipped_keyring",
    "load_trusted_keys",
]

PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"
# A PEM Ed25519 key is ~120 bytes; anything much larger is not a key file.
_MAX_KEY_FILE = 16 * 1024


class KeyRingError(Exception):
    """A key file or key ring directory could not be used."""


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: never overwrite an existing key; the mode is applied at creation so
    # the file is never readable by others, not even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def generate_keypair(key_id: str, out_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Create ``<key_id>.key`` (0600) and ``<key_id>.pub`` in ``out_dir``.

    Refuses to overwrite existing files (FileExistsError). The private key is only
    ever written to its file, never returned or printed.
    """
    if not valid_key_id(key_id):
        raise ValueError(
            "key id must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    directory = Path(out_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path = directory / f"{key_id}{PRIVATE_SUFFIX}"
    public_path = directory / f"{key_id}{PUBLIC_SUFFIX}"
    for existing in (private_path, public_path):
        if existing.exists():
            raise FileExistsError(f"{existing} already exists")

    private_key = Ed25519PrivateKey.generate()
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_new_file(private_path, private_pem, 0o600)
    try:
        _write_new_file(public_path, public_pem, 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)
        raise
    return private_path, public_path


def _read_key_file(path: Path) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        raise KeyRingError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE:
        raise KeyRingError(f"{path} is too large to be a key file")
    return data


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an unencrypted PEM (PKCS#8) Ed25519 private key."""
    key_path = Path(path)
    data = _read_key_file(key_path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyRingError(f"{key_path} is not an unencrypted PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyRingError(f"{key_path} is not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load a PEM (SubjectPublicKeyInfo) Ed25519 public key."""
    key_path = Path(path)
    data = _read_key_file(key_path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyRingError(f"{key_path} is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyRingError(f"{key_path} is not an Ed25519 public key")
    return key


class KeyRing(Mapping[str, Ed25519PublicKey]):
    """Immutable mapping ``key_id -> public key`` of the vendor keys a verifier trusts.

    Rotation works by shipping the new ``.pub`` next to the old one: both verify
    until the old file is removed, after which its licences report UNKNOWN_KEY.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        items = dict(keys or {})
        for key_id, key in items.items():
            if not valid_key_id(key_id):
                raise KeyRingError(f"invalid key id {key_id!r}")
            if not isinstance(key, Ed25519PublicKey):
                raise KeyRingError(f"key {key_id!r} is not an Ed25519 public key")
        self._keys: dict[str, Ed25519PublicKey] = items

    def __getitem__(self, key_id: str) -> Ed25519PublicKey:
        return self._keys[key_id]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing({sorted(self._keys)!r})"

    def merged(self, other: Mapping[str, Ed25519PublicKey]) -> KeyRing:
        """A ring holding both rings' keys; ``other`` wins on a shared key id."""
        combined = dict(self._keys)
        combined.update(other)
        return KeyRing(combined)

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]]) -> KeyRing:
        """Load ``<key_id>.pub`` files; the key id is the file stem."""
        keys: dict[str, Ed25519PublicKey] = {}
        for raw in paths:
            path = Path(raw)
            key_id = path.name.removesuffix(PUBLIC_SUFFIX)
            if not path.name.endswith(PUBLIC_SUFFIX) or not valid_key_id(key_id):
                raise KeyRingError(f"{path.name} is not named <key_id>{PUBLIC_SUFFIX}")
            keys[key_id] = load_public_key(path)
        return cls(keys)

    @classmethod
    def from_directory(cls, directory: str | os.PathLike[str]) -> KeyRing:
        """Load every ``*.pub`` file in ``directory`` (other files are ignored).

        A broken ``.pub`` file raises KeyRingError rather than being skipped: a
        silently shrunken ring would turn valid licences into UNKNOWN_KEY.
        """
        path = Path(directory)
        if not path.is_dir():
            raise KeyRingError(f"key directory {path} does not exist")
        return cls.from_files(sorted(path.glob(f"*{PUBLIC_SUFFIX}")))


_SHIPPED_KEYS_PACKAGE = "knowledge_licensing.vendor_keys"


def load_shipped_keyring() -> KeyRing:
    """The vendor public keys shipped inside this package (``vendor_keys/*.pub``).

    A broken shipped key raises KeyRingError: the package itself is damaged.
    """
    keys: dict[str, Ed25519PublicKey] = {}
    for entry in resources.files(_SHIPPED_KEYS_PACKAGE).iterdir():
        name = entry.name
        if not name.endswith(PUBLIC_SUFFIX):
            continue
        key_id = name.removesuffix(PUBLIC_SUFFIX)
        if not valid_key_id(key_id):
            raise KeyRingError(f"shipped key file {name} is not named <key_id>{PUBLIC_SUFFIX}")
        data = entry.read_bytes()
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise KeyRingError(f"shipped key file {name} is not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise KeyRingError(f"shipped key file {name} is not an Ed25519 public key")
        keys[key_id] = key
    return KeyRing(keys)


#: The vendor keys shipped with this build: the production trust anchors.
DEFAULT_KEYRING = load_shipped_keyring()


@dataclass(frozen=True)
class TrustedKeys:
    """The ring a server verifies with, and which of its key ids are development keys.

    A development key never replaces a shipped key of the same id: the shipped key wins.
    """

    ring: KeyRing
    dev_key_ids: frozenset[str] = frozenset()
    dev_dir: Path | None = None

    def is_dev_key(self, key_id: str) -> bool:
        return key_id in self.dev_key_ids

    def dev_key_of(self, status: LicenceStatus) -> str | None:
        """The development key ``status``'s licence verified with, if it did."""
        lic = status.licence
        if lic is not None and self.is_dev_key(lic.key_id):
            return lic.key_id
        return None

    def describe(self, status: LicenceStatus) -> str:
        """``status.reason``, saying when a development key verified the licence and, with
        development keys off, that only the shipped vendor keys are trusted."""
        dev_key = self.dev_key_of(status)
        if dev_key is not None:
            return (
                f"{status.reason}; verified with development key {dev_key} "
                "from licence_dev_keys_dir, not with a vendor key"
            )
        if status.state is LicenceState.UNKNOWN_KEY and self.dev_dir is None:
            return (
                f"{status.reason}; only the vendor keys shipped with the service are trusted "
                "(development keys are off)"
            )
        return status.reason


def load_trusted_keys(dev_dir: str | os.PathLike[str] | None = None) -> TrustedKeys:
    """The shipped vendor keys, plus the ``.pub`` files of ``dev_dir`` when one is given.

    ``dev_dir`` is the operator's explicit development-keys setting; ``None`` (the
    default) trusts the shipped keys alone. A given directory must exist, and a broken
    key file inside it raises KeyRingError rather than being skipped.
    """
    shipped = DEFAULT_KEYRING
    if dev_dir is None:
        return TrustedKeys(shipped)
    dev = KeyRing.from_directory(dev_dir)
    dev_ids = frozenset(k for k in dev if k not in shipped)
    return TrustedKeys(dev.merged(shipped), dev_ids, Path(dev_dir))


def load_keyring(
    directory: str | os.PathLike[str] | None = None, *, include_default: bool = True
) -> KeyRing:
    """The shipped keys (unless ``include_default`` is False) plus the ``.pub`` files in
    ``directory``. Tools only: a server uses :func:`load_trusted_keys`, which marks the
    directory's keys as development keys.

    A missing directory contributes no keys (licences then report UNKNOWN_KEY);
    a broken key file inside it raises KeyRingError.
    """
    ring = DEFAULT_KEYRING if include_default else KeyRing()
    if directory is None or not Path(directory).is_dir():
        return ring
    return ring.merged(KeyRing.from_directory(directory))
