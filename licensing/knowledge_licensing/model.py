"""Licence data model: editions, features, states and the parsed payload.

Nothing in this module touches keys or files; it only describes what a licence
says and what the server is allowed to do because of it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeGuard

__all__ = [
    "EDITIONS",
    "FEATURES",
    "FEATURE_DOC_GRAPH",
    "ISSUE_DEFAULT_FEATURES",
    "KEY_ID_PATTERN",
    "LICENCE_FORMAT",
    "Licence",
    "LicenceState",
    "LicenceStatus",
    "edition_has_feature",
    "effective_features",
    "feature_refusal",
    "format_time",
    "parse_time",
    "required_edition_for",
    "valid_key_id",
]

#: Value of the ``format`` field of every payload this package issues and accepts.
LICENCE_FORMAT = "knowledge.licence/v1"

EDITION_COMMUNITY = "community"
EDITION_PRO = "pro"
EDITION_ENTERPRISE = "enterprise"
#: Editions from lowest to highest.
EDITIONS: tuple[str, ...] = (EDITION_COMMUNITY, EDITION_PRO, EDITION_ENTERPRISE)

FEATURE_DOC_GRAPH = "doc-graph"
#: Every feature a licence can unlock. Unknown names inside a signed licence are
#: kept in :attr:`Licence.features` (a newer issuer may know more) but never become
#: effective.
FEATURES: frozenset[str] = frozenset({FEATURE_DOC_GRAPH})

#: Features written into a licence when the issuer does not list any explicitly.
ISSUE_DEFAULT_FEATURES: dict[str, frozenset[str]] = {
    EDITION_COMMUNITY: frozenset(),
    EDITION_PRO: frozenset({FEATURE_DOC_GRAPH}),
    EDITION_ENTERPRISE: frozenset({FEATURE_DOC_GRAPH}),
}

# Features an edition carries whether or not the licence lists them. Enterprise is
# the full product; pro gets a feature only as a listed add-on; community nothing.
_IMPLIED_FEATURES: dict[str, frozenset[str]] = {
    EDITION_COMMUNITY: frozenset(),
    EDITION_PRO: frozenset(),
    EDITION_ENTERPRISE: FEATURES,
}
# Editions on which a listed feature is honoured.
_LISTABLE_ON: dict[str, frozenset[str]] = {
    EDITION_COMMUNITY: frozenset(),
    EDITION_PRO: FEATURES,
    EDITION_ENTERPRISE: FEATURES,
}
# The edition that includes a feature with no add-on; named in refusals.
_REQUIRED_EDITION: dict[str, str] = {FEATURE_DOC_GRAPH: EDITION_ENTERPRISE}

#: Key ids become file names (``<key_id>.pub``), so they are kept to a safe alphabet.
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_key_id(key_id: object) -> TypeGuard[str]:
    """True when ``key_id`` is a string usable as a key id (and as a file stem)."""
    return isinstance(key_id, str) and KEY_ID_PATTERN.fullmatch(key_id) is not None


def edition_has_feature(edition: str, features: object, feature: str) -> bool:
    """Whether a licence of ``edition`` that lists ``features`` grants ``feature``.

    * enterprise grants every known feature, listed or not;
    * pro grants a known feature only when the licence lists it;
    * community (and any unknown edition) grants nothing.
    """
    if feature not in FEATURES:
        return False
    if feature in _IMPLIED_FEATURES.get(edition, frozenset()):
        return True
    if feature not in _LISTABLE_ON.get(edition, frozenset()):
        return False
    try:
        return feature in features  # type: ignore[operator]
    except TypeError:
        return False


def effective_features(edition: str, features: object) -> frozenset[str]:
    """All known features granted by ``edition`` plus the listed ``features``."""
    return frozenset(f for f in FEATURES if edition_has_feature(edition, features, f))


def required_edition_for(feature: str) -> str:
    """The edition that includes ``feature`` without an add-on (``enterprise`` for doc-graph).

    A pro licence that lists the feature also grants it; see :func:`feature_refusal`
    for the sentence shown to a caller who lacks it.
    """
    try:
        return _REQUIRED_EDITION[feature]
    except KeyError:
        raise ValueError(f"unknown feature {feature!r}") from None


def feature_refusal(feature: str) -> str:
    """A short sentence naming the edition a refused call needs."""
    edition = required_edition_for(feature)
    if feature in _LISTABLE_ON[EDITION_PRO] and edition != EDITION_PRO:
        return (
            f"the {feature} feature requires a valid {edition} licence "
            f"(or a pro licence that lists {feature})"
        )
    return f"the {feature} feature requires a valid {edition} licence"


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with second precision, e.g. ``2027-01-31T12:00:00Z``."""
    if value.tzinfo is None:
        raise ValueError("datetime must be timezone-aware")
    return value.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp with an explicit offset; returns an aware UTC datetime.

    Raises ValueError for naive or unparseable text.
    """
    if not isinstance(text, str) or not 0 < len(text) <= 64:
        raise ValueError("timestamp must be a non-empty string")
    # RFC 3339 allows a lower-case 't'/'z'; fromisoformat wants upper case.
    value = datetime.fromisoformat(text.strip().upper())
    if value.tzinfo is None:
        raise ValueError("timestamp must carry a UTC offset (e.g. 'Z')")
    return value.astimezone(UTC)


class LicenceState(enum.Enum):
    """Outcome of verifying a licence; only ``VALID`` unlocks anything."""

    MISSING = "missing"
    VALID = "valid"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_KEY = "unknown_key"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Licence:
    """The signed payload, parsed. Times are aware UTC datetimes."""

    licence_id: str
    licensee: str
    edition: str
    features: tuple[str, ...]
    not_before: datetime
    expires_at: datetime
    issued_at: datetime
    key_id: str
    format: str = LICENCE_FORMAT

    def to_payload(self) -> dict[str, Any]:
        """The payload as a JSON-ready dict (the fields that get signed)."""
        return {
            "licence_id": self.licence_id,
            "licensee": self.licensee,
            "edition": self.edition,
            "features": list(self.features),
            "not_before": format_time(self.not_before),
            "expires_at": format_time(self.expires_at),
            "issued_at": format_time(self.issued_at),
            "key_id": self.key_id,
            "format": self.format,
        }


@dataclass(frozen=True, slots=True)
class LicenceStatus:
    """What the server currently may do.

    ``licence`` is set whenever the signature verified (also for EXPIRED and
    NOT_YET_VALID) so an operator can see which licence is at fault. ``reason`` is
    a short sentence for humans and never echoes the licence file.
    """

    state: LicenceState
    licence: Licence | None = None
    reason: str = ""
    effective_edition: str = EDITION_COMMUNITY
    effective_features: frozenset[str] = field(default_factory=frozenset)

    @property
    def valid(self) -> bool:
        return self.state is LicenceState.VALID

    def has_feature(self, feature: str) -> bool:
        return feature in self.effective_features

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (used by ``knowledge license ... --json`` and status RPCs)."""
        return {
            "state": self.state.value,
            "reason": self.reason,
            "effective_edition": self.effective_edition,
            "effective_features": sorted(self.effective_features),
            "licence": None if self.licence is None else self.licence.to_payload(),
        }
