"""Signed licences for the Knowledge Service.

A licence is an Ed25519 signature over a canonical JSON payload. The server
verifies it against a ring of trusted vendor public keys and derives the edition
and features it may offer. See docs/licensing.md for the file formats.
"""

from __future__ import annotations

from .keys import (
    DEFAULT_KEYRING,
    KeyRing,
    KeyRingError,
    TrustedKeys,
    generate_keypair,
    load_keyring,
    load_private_key,
    load_public_key,
    load_shipped_keyring,
    load_trusted_keys,
)
from .model import (
    EDITIONS,
    FEATURE_DOC_GRAPH,
    FEATURES,
    ISSUE_DEFAULT_FEATURES,
    LICENCE_FORMAT,
    Licence,
    LicenceState,
    LicenceStatus,
    edition_has_feature,
    effective_features,
    feature_refusal,
    format_time,
    parse_time,
    required_edition_for,
)
from .verify import (
    MAX_LICENCE_BYTES,
    LicenceWatcher,
    canonical_payload,
    decode_unverified,
    install_licence,
    issue_licence,
    load_licence_file,
    status_at,
    verify_licence,
)

__all__ = [
    "DEFAULT_KEYRING",
    "EDITIONS",
    "FEATURES",
    "FEATURE_DOC_GRAPH",
    "ISSUE_DEFAULT_FEATURES",
    "LICENCE_FORMAT",
    "MAX_LICENCE_BYTES",
    "KeyRing",
    "KeyRingError",
    "Licence",
    "LicenceState",
    "LicenceStatus",
    "LicenceWatcher",
    "TrustedKeys",
    "canonical_payload",
    "decode_unverified",
    "edition_has_feature",
    "effective_features",
    "feature_refusal",
    "format_time",
    "generate_keypair",
    "install_licence",
    "issue_licence",
    "load_keyring",
    "load_licence_file",
    "load_private_key",
    "load_public_key",
    "load_shipped_keyring",
    "load_trusted_keys",
    "parse_time",
    "required_edition_for",
    "status_at",
    "verify_licence",
]
