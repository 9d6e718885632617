"""Property tests: licence verification never raises and never accepts junk."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knowledge_licensing import (
    KeyRing,
    LicenceState,
    canonical_payload,
    load_licence_file,
    load_private_key,
    verify_licence,
)

from tests.conftest import make_vendor

NOW = datetime(2027, 3, 1, 12, 0, 0, tzinfo=UTC)
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("props")
    vendor = make_vendor(base / "keys", "prop-key")
    ring = KeyRing.from_files([vendor.public])
    good = vendor.issue(
        licence_id="lic_prop",
        licensee="Prop Org",
        not_before=NOW - timedelta(days=1),
        expires_at=NOW + timedelta(days=1),
    )
    assert verify_licence(good, ring, NOW).state is LicenceState.VALID
    return {"ring": ring, "good": good, "key": load_private_key(vendor.private), "dir": base}


def _assert_rejected(data: bytes, ring: KeyRing) -> None:
    status = verify_licence(data, ring, NOW)
    assert status.state is not LicenceState.VALID
    assert status.state is not LicenceState.MISSING
    assert status.effective_edition == "community"
    assert status.effective_features == frozenset()
    assert isinstance(status.reason, str) and len(status.reason) < 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)

envelope_keys = st.sampled_from(["format", "key_id", "payload", "signature", "extra"])


@PROFILE
@given(data=st.binary(max_size=2048))
def test_random_bytes_never_raise(material: dict[str, Any], data: bytes) -> None:
    _assert_rejected(data, material["ring"])


@PROFILE
@given(value=json_values)
def test_random_json_never_raises(material: dict[str, Any], value: Any) -> None:
    _assert_rejected(json.dumps(value).encode(), material["ring"])


@PROFILE
@given(
    fields=st.dictionaries(
        envelope_keys,
        st.one_of(json_values, st.just("prop-key"), st.binary(max_size=80).map(_b64e)),
        max_size=5,
    )
)
def test_random_envelopes_never_valid(material: dict[str, Any], fields: dict[str, Any]) -> None:
    _assert_rejected(json.dumps(fields).encode(), material["ring"])


@PROFILE
@given(payload=json_values)
def test_signed_random_payloads_never_valid(material: dict[str, Any], payload: Any) -> None:
    # Correctly signed, so only payload validation stands between junk and VALID.
    try:
        body = canonical_payload(payload)
    except (ValueError, TypeError):
        body = json.dumps(payload).encode()
    doc = {
        "key_id": "prop-key",
        "payload": _b64e(body),
        "signature": _b64e(material["key"].sign(body)),
    }
    status = verify_licence(json.dumps(doc).encode(), material["ring"], NOW)
    assert status.state is LicenceState.MALFORMED


@PROFILE
@given(cut=st.integers(min_value=0))
def test_truncated_licence_never_valid(material: dict[str, Any], cut: int) -> None:
    good: bytes = material["good"]
    # Everything after the closing brace is whitespace; cut strictly inside the object.
    end = good.rindex(b"}")
    _assert_rejected(good[: cut % end], material["ring"])


@PROFILE
@given(
    field=st.sampled_from(["payload", "signature"]),
    pos=st.integers(min_value=0),
    bit=st.integers(0, 7),
)
def test_flipped_bits_in_blobs_never_valid(
    material: dict[str, Any], field: str, pos: int, bit: int
) -> None:
    doc = json.loads(material["good"])
    raw = bytearray(doc[field].encode("ascii"))
    raw[pos % len(raw)] ^= 1 << bit
    try:
        doc[field] = raw.decode("ascii")
    except UnicodeDecodeError:
        doc[field] = raw.decode("latin-1")
    _assert_rejected(json.dumps(doc).encode(), material["ring"])


@PROFILE
@given(data=st.binary(max_size=512))
def test_random_files_never_raise(material: dict[str, Any], data: bytes) -> None:
    path = Path(material["dir"]) / "licence.json"
    path.write_bytes(data)
    status = load_licence_file(path, material["ring"], NOW)
    assert status.state is not LicenceState.VALID
