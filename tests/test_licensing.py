"""Licence keys, issuing, verification, the watcher and the `license` CLI."""

from __future__ import annotations

import base64
import json
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from knowledge_licensing import (
    FEATURE_DOC_GRAPH,
    KeyRing,
    KeyRingError,
    LicenceState,
    LicenceStatus,
    LicenceWatcher,
    canonical_payload,
    edition_has_feature,
    feature_refusal,
    generate_keypair,
    load_licence_file,
    required_edition_for,
    verify_licence,
)
from knowledge_licensing.cli import license_group

from tests.conftest import LicenceVendor, make_vendor

NOW = datetime(2027, 3, 1, 12, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Vendors:
    """Two vendor keys, both trusted by the key-ring directory ``ring``."""

    a: LicenceVendor
    b: LicenceVendor
    ring: Path


@pytest.fixture()
def vendor(tmp_path: Path) -> Vendors:
    a = make_vendor(tmp_path / "vendor", "vendor-a")
    b = make_vendor(tmp_path / "vendor", "vendor-b")
    ring = tmp_path / "ring"
    a.trust(ring)
    b.trust(ring)
    return Vendors(a, b, ring)


def _issue(
    vendor: LicenceVendor,
    *,
    edition: str = "enterprise",
    features: tuple[str, ...] = (FEATURE_DOC_GRAPH,),
    not_before: datetime = NOW - timedelta(days=1),
    expires_at: datetime = NOW + timedelta(days=30),
    licence_id: str = "lic_test",
) -> bytes:
    """A licence issued at a fixed time, checked against the fixed ``NOW``."""
    return vendor.issue(
        licence_id=licence_id,
        licensee="Example Org",
        edition=edition,
        features=features,
        not_before=not_before,
        expires_at=expires_at,
        issued_at=NOW - timedelta(days=1),
    )


def _envelope(data: bytes) -> dict[str, str]:
    return json.loads(data)


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# -- keys ----------------------------------------------------------------------


def test_private_key_is_0600_and_public_key_loads(vendor: Vendors) -> None:
    mode = stat.S_IMODE(os.stat(vendor.a.private).st_mode)
    assert mode == 0o600
    assert b"PRIVATE KEY" in vendor.a.private.read_bytes()
    ring = KeyRing.from_directory(vendor.ring)
    assert sorted(ring) == ["vendor-a", "vendor-b"]


def test_keygen_refuses_overwrite_and_bad_ids(tmp_path: Path) -> None:
    generate_keypair("k1", tmp_path)
    with pytest.raises(FileExistsError):
        generate_keypair("k1", tmp_path)
    with pytest.raises(ValueError):
        generate_keypair("../escape", tmp_path)


def test_broken_public_key_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.pub").write_text("not a key")
    with pytest.raises(KeyRingError):
        KeyRing.from_directory(tmp_path)


# -- states ----------------------------------------------------------------------


def test_valid_licence(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    status = verify_licence(_issue(vendor.a), ring, NOW)
    assert status.state is LicenceState.VALID
    assert status.licence is not None and status.licence.licensee == "Example Org"
    assert status.licence.key_id == "vendor-a"
    assert status.effective_edition == "enterprise"
    assert status.effective_features == frozenset({FEATURE_DOC_GRAPH})


def test_missing(tmp_path: Path) -> None:
    assert verify_licence(None, KeyRing(), NOW).state is LicenceState.MISSING
    status = load_licence_file(tmp_path / "absent.json", KeyRing(), NOW)
    assert status.state is LicenceState.MISSING
    assert status.effective_edition == "community" and not status.effective_features


def test_unreadable_file_is_malformed(tmp_path: Path) -> None:
    status = load_licence_file(tmp_path, KeyRing(), NOW)  # a directory
    assert status.state is LicenceState.MALFORMED
    assert "could not be read" in status.reason


def test_expired_one_second_ago(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    data = _issue(vendor.a, expires_at=NOW - timedelta(seconds=1))
    status = verify_licence(data, ring, NOW)
    assert status.state is LicenceState.EXPIRED
    assert status.licence is not None
    assert status.effective_edition == "community" and not status.effective_features
    # the boundary itself is already expired
    exact = verify_licence(_issue(vendor.a, expires_at=NOW), ring, NOW)
    assert exact.state is LicenceState.EXPIRED


def test_not_yet_valid_one_minute_ahead(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    data = _issue(vendor.a, not_before=NOW + timedelta(minutes=1))
    status = verify_licence(data, ring, NOW)
    assert status.state is LicenceState.NOT_YET_VALID
    assert not status.effective_features


def test_flipped_payload_byte_is_bad_signature(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    doc = _envelope(_issue(vendor.a))
    payload = bytearray(_b64d(doc["payload"]))
    index = payload.index(b"enterprise")
    payload[index] ^= 0x01
    doc["payload"] = _b64e(bytes(payload))
    status = verify_licence(json.dumps(doc).encode(), ring, NOW)
    assert status.state is LicenceState.BAD_SIGNATURE
    assert status.licence is None and not status.effective_features


def test_flipped_signature_byte_is_bad_signature(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    doc = _envelope(_issue(vendor.a))
    signature = bytearray(_b64d(doc["signature"]))
    signature[10] ^= 0x80
    doc["signature"] = _b64e(bytes(signature))
    status = verify_licence(json.dumps(doc).encode(), ring, NOW)
    assert status.state is LicenceState.BAD_SIGNATURE


def test_swapped_key_id(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    doc = _envelope(_issue(vendor.a))
    doc["key_id"] = "vendor-b"  # a trusted key, but not the signer
    assert verify_licence(json.dumps(doc).encode(), ring, NOW).state is LicenceState.BAD_SIGNATURE
    doc["key_id"] = "vendor-z"
    status = verify_licence(json.dumps(doc).encode(), ring, NOW)
    assert status.state is LicenceState.UNKNOWN_KEY
    assert "vendor-z" in status.reason


def test_malformed_inputs(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    good = _envelope(_issue(vendor.a))
    cases: list[bytes] = [
        b"",
        b"not json",
        b"[1, 2]",
        json.dumps({**good, "payload": "***"}).encode(),
        json.dumps({**good, "format": "other/v9"}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "signature"}).encode(),
        b"\xff\xfe" + b"x" * 10,
        b" " * 70_000,
    ]
    for data in cases:
        status = verify_licence(data, ring, NOW)
        assert status.state is LicenceState.MALFORMED, data[:40]
        assert status.effective_edition == "community"


def test_signed_but_invalid_payload_is_malformed(vendor: Vendors) -> None:
    from knowledge_licensing.keys import load_private_key

    ring = KeyRing.from_directory(vendor.ring)
    key = load_private_key(vendor.a.private)
    payload = canonical_payload({"licence_id": "x", "key_id": "vendor-a"})
    doc = {"key_id": "vendor-a", "payload": _b64e(payload), "signature": _b64e(key.sign(payload))}
    status = verify_licence(json.dumps(doc).encode(), ring, NOW)
    assert status.state is LicenceState.MALFORMED
    # correctly signed but not canonical (extra whitespace)
    body = json.loads(_b64d(_envelope(_issue(vendor.a))["payload"]))
    loose = json.dumps(body, indent=1).encode()
    doc = {"key_id": "vendor-a", "payload": _b64e(loose), "signature": _b64e(key.sign(loose))}
    assert verify_licence(json.dumps(doc).encode(), ring, NOW).state is LicenceState.MALFORMED


def test_reason_never_contains_the_blob(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    data = _issue(vendor.a)
    doc = _envelope(data)
    for status in (
        verify_licence(data, ring, NOW),
        verify_licence(data, KeyRing(), NOW),
        verify_licence(data, ring, NOW + timedelta(days=400)),
    ):
        assert doc["payload"][:24] not in status.reason
        assert doc["signature"][:24] not in status.reason
        assert len(status.reason) < 200


def test_status_is_frozen(vendor: Vendors) -> None:
    status = verify_licence(_issue(vendor.a), KeyRing(), NOW)
    with pytest.raises(AttributeError):
        status.state = LicenceState.VALID  # type: ignore[misc]


# -- rotation ----------------------------------------------------------------------


def test_rotation_two_keys_then_removal(vendor: Vendors) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    old = _issue(vendor.a, licence_id="lic_old")
    new = _issue(vendor.b, licence_id="lic_new")
    assert verify_licence(old, ring, NOW).state is LicenceState.VALID
    assert verify_licence(new, ring, NOW).state is LicenceState.VALID
    (vendor.ring / "vendor-a.pub").unlink()
    rotated = KeyRing.from_directory(vendor.ring)
    assert verify_licence(old, rotated, NOW).state is LicenceState.UNKNOWN_KEY
    assert verify_licence(new, rotated, NOW).state is LicenceState.VALID


# -- editions ----------------------------------------------------------------------


def test_edition_rules(vendor: Vendors) -> None:
    assert required_edition_for(FEATURE_DOC_GRAPH) == "enterprise"
    assert "enterprise" in feature_refusal(FEATURE_DOC_GRAPH)
    assert edition_has_feature("enterprise", (), FEATURE_DOC_GRAPH)
    assert edition_has_feature("pro", ("doc-graph",), FEATURE_DOC_GRAPH)
    assert not edition_has_feature("pro", (), FEATURE_DOC_GRAPH)
    assert not edition_has_feature("community", ("doc-graph",), FEATURE_DOC_GRAPH)
    assert not edition_has_feature("enterprise", (), "no-such-feature")
    with pytest.raises(ValueError):
        required_edition_for("no-such-feature")
    ring = KeyRing.from_directory(vendor.ring)
    pro_plain = verify_licence(_issue(vendor.a, edition="pro", features=()), ring, NOW)
    assert pro_plain.state is LicenceState.VALID and not pro_plain.has_feature(FEATURE_DOC_GRAPH)
    pro_graph = verify_licence(_issue(vendor.a, edition="pro"), ring, NOW)
    assert pro_graph.has_feature(FEATURE_DOC_GRAPH)


def test_issue_rejects_bad_arguments(vendor: Vendors) -> None:
    with pytest.raises(ValueError):
        _issue(vendor.a, edition="platinum")
    with pytest.raises(ValueError):
        _issue(vendor.a, features=("teleport",))
    with pytest.raises(ValueError):
        _issue(vendor.a, expires_at=NOW - timedelta(days=5))


# -- watcher ----------------------------------------------------------------------


class _Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_watcher_picks_up_replaced_file(vendor: Vendors, tmp_path: Path) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    path = tmp_path / "licence.json"
    clock = _Clock(NOW)
    watcher = LicenceWatcher(path, ring, clock=clock)
    assert watcher.status.state is LicenceState.MISSING
    assert not watcher.changed()
    assert watcher.check() is None

    tmp = tmp_path / "licence.tmp"
    tmp.write_bytes(_issue(vendor.a, edition="pro", licence_id="lic_one"))
    os.replace(tmp, path)
    assert watcher.changed()
    result = watcher.check()
    assert result is not None
    old, new = result
    assert old.state is LicenceState.MISSING and new.state is LicenceState.VALID
    assert not watcher.changed()

    tmp.write_bytes(_issue(vendor.b, edition="enterprise", licence_id="lic_two"))
    os.replace(tmp, path)
    assert watcher.changed()
    old, new = watcher.reload()
    assert old.licence is not None and old.licence.licence_id == "lic_one"
    assert new.licence is not None and new.licence.licence_id == "lic_two"

    path.write_bytes(b"garbage")
    result = watcher.check()
    assert result is not None and result[1].state is LicenceState.MALFORMED
    path.unlink()
    result = watcher.check()
    assert result is not None and result[1].state is LicenceState.MISSING


def test_watcher_time_based_expiry(vendor: Vendors, tmp_path: Path) -> None:
    ring = KeyRing.from_directory(vendor.ring)
    path = tmp_path / "licence.json"
    path.write_bytes(
        _issue(
            vendor.a, not_before=NOW + timedelta(seconds=10), expires_at=NOW + timedelta(hours=1)
        )
    )
    clock = _Clock(NOW)
    watcher = LicenceWatcher(path, ring, clock=clock)
    assert watcher.status.state is LicenceState.NOT_YET_VALID
    clock.now = NOW + timedelta(seconds=10)
    assert watcher.changed()
    result = watcher.check()
    assert result is not None and result[1].state is LicenceState.VALID
    clock.now = NOW + timedelta(minutes=59)
    assert not watcher.changed() and watcher.check() is None
    clock.now = NOW + timedelta(hours=1)
    assert watcher.changed()
    old, new = watcher.check() or (None, None)
    assert old is not None and old.state is LicenceState.VALID
    assert isinstance(new, LicenceStatus) and new.state is LicenceState.EXPIRED
    assert watcher.status.effective_edition == "community"


def test_watcher_is_thread_safe(vendor: Vendors, tmp_path: Path) -> None:
    import threading

    ring = KeyRing.from_directory(vendor.ring)
    path = tmp_path / "licence.json"
    good = _issue(vendor.a)
    path.write_bytes(good)
    watcher = LicenceWatcher(path, ring, clock=_Clock(NOW))
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            for _ in range(200):
                watcher.check()
                assert watcher.status.state in (LicenceState.VALID, LicenceState.MALFORMED)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        tmp = tmp_path / "swap.tmp"
        tmp.write_bytes(good)
        os.replace(tmp, path)
    for t in threads:
        t.join()
    assert not errors
    watcher.check()
    assert watcher.status.state is LicenceState.VALID


# -- CLI ----------------------------------------------------------------------


def test_cli_round_trip(tmp_path: Path) -> None:
    runner = CliRunner()
    keys = tmp_path / "keys"
    result = runner.invoke(license_group, ["keygen", "--key-id", "v1", "--out", str(keys)])
    assert result.exit_code == 0, result.output
    private = keys / "v1.key"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert "PRIVATE KEY" not in result.output

    ring = tmp_path / "ring"
    ring.mkdir()
    (ring / "v1.pub").write_bytes((keys / "v1.pub").read_bytes())
    licence = tmp_path / "licence.json"
    result = runner.invoke(
        license_group,
        [
            "issue",
            "--key",
            str(private),
            "--licensee",
            "ACME",
            "--edition",
            "pro",
            "--days",
            "30",
            "--id",
            "lic_cli",
            "--out",
            str(licence),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "lic_cli" in result.output

    result = runner.invoke(license_group, ["verify", str(licence), "--keys", str(ring)])
    assert result.exit_code == 0 and "VALID" in result.output

    result = runner.invoke(license_group, ["verify", str(licence), "--keys", str(ring), "--json"])
    doc = json.loads(result.output)
    assert result.exit_code == 0
    assert doc["state"] == "valid" and doc["effective_features"] == ["doc-graph"]
    assert doc["licence"]["licence_id"] == "lic_cli"

    result = runner.invoke(license_group, ["inspect", str(licence), "--json"])
    doc = json.loads(result.output)
    assert result.exit_code == 0
    assert doc["state"] == "unknown_key" and doc["unverified_payload"]["licensee"] == "ACME"

    result = runner.invoke(license_group, ["inspect", str(licence), "--keys", str(ring)])
    assert result.exit_code == 0 and "VALID" in result.output and "ACME" in result.output

    # refuse to overwrite without --force
    result = runner.invoke(
        license_group,
        [
            "issue",
            "--key",
            str(private),
            "--licensee",
            "ACME",
            "--edition",
            "pro",
            "--out",
            str(licence),
        ],
    )
    assert result.exit_code == 2


def test_cli_verify_failures(vendor: Vendors, tmp_path: Path) -> None:
    runner = CliRunner()
    expired = tmp_path / "expired.json"
    real_now = datetime.now(UTC)
    expired.write_bytes(
        _issue(
            vendor.a,
            not_before=real_now - timedelta(days=2),
            expires_at=real_now - timedelta(seconds=1),
        )
    )
    result = runner.invoke(license_group, ["verify", str(expired), "--keys", str(vendor.ring)])
    assert result.exit_code == 1 and "EXPIRED" in result.output

    result = runner.invoke(
        license_group,
        ["verify", str(tmp_path / "none.json"), "--keys", str(vendor.ring), "--json"],
    )
    assert result.exit_code == 1 and json.loads(result.output)["state"] == "missing"

    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\x01\x02")
    result = runner.invoke(
        license_group, ["verify", str(garbage), "--keys", str(vendor.ring), "--json"]
    )
    assert result.exit_code == 1 and json.loads(result.output)["state"] == "malformed"

    result = runner.invoke(
        license_group, ["verify", str(expired), "--keys", str(tmp_path / "nope"), "--json"]
    )
    assert result.exit_code == 2 and "error" in json.loads(result.output)


def test_cli_issue_option_errors(vendor: Vendors, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "l.json"
    base = ["issue", "--key", str(vendor.a.private), "--licensee", "X", "--out", str(out)]
    result = runner.invoke(
        license_group,
        [*base, "--edition", "pro", "--days", "3", "--expires", "2030-01-01T00:00:00Z"],
    )
    assert result.exit_code == 2
    result = runner.invoke(license_group, [*base, "--edition", "gold"])
    assert result.exit_code == 2
    result = runner.invoke(license_group, [*base, "--edition", "pro", "--expires", "tomorrow"])
    assert result.exit_code == 2
    result = runner.invoke(
        license_group,
        [
            *base,
            "--edition",
            "enterprise",
            "--not-before",
            "2030-01-01T00:00:00+02:00",
            "--expires",
            "2031-01-01T00:00:00Z",
        ],
    )
    assert result.exit_code == 0, result.output
    status = load_licence_file(
        out, KeyRing.from_directory(vendor.ring), datetime(2030, 6, 1, tzinfo=UTC)
    )
    assert status.state is LicenceState.VALID
    assert status.licence is not None
    assert status.licence.not_before == datetime(2029, 12, 31, 22, 0, tzinfo=UTC)


def test_cli_help_texts() -> None:
    runner = CliRunner()
    for args in (
        ["--help"],
        ["keygen", "--help"],
        ["issue", "--help"],
        ["inspect", "--help"],
        ["verify", "--help"],
    ):
        result = runner.invoke(license_group, args)
        assert result.exit_code == 0 and "Usage" in result.output


def test_load_keyring_combines_default_and_directory(vendor: Vendors, tmp_path: Path) -> None:
    from knowledge_licensing import DEFAULT_KEYRING, load_keyring

    assert sorted(load_keyring(tmp_path / "absent")) == sorted(DEFAULT_KEYRING)
    assert sorted(load_keyring(vendor.ring, include_default=False)) == ["vendor-a", "vendor-b"]
    assert set(load_keyring(vendor.ring)) == {"vendor-a", "vendor-b", *DEFAULT_KEYRING}


def test_shipped_keyring_is_the_packaged_vendor_keys() -> None:
    """The production trust anchors ship inside the package; no private key does."""
    import knowledge_licensing.vendor_keys as shipped
    from knowledge_licensing import DEFAULT_KEYRING, load_shipped_keyring

    ring = load_shipped_keyring()
    assert len(ring) >= 1 and sorted(ring) == sorted(DEFAULT_KEYRING)
    package_dir = Path(shipped.__file__).parent
    assert sorted(p.stem for p in package_dir.glob("*.pub")) == sorted(ring)
    assert not list(package_dir.glob("*.key"))


def test_trusted_keys_mark_development_keys(vendor: Vendors, tmp_path: Path) -> None:
    """Without a development directory only the shipped keys are trusted, and a licence
    from another key says so; with one its keys verify and are named development keys."""
    from knowledge_licensing import DEFAULT_KEYRING, load_trusted_keys

    shipped_only = load_trusted_keys(None)
    assert sorted(shipped_only.ring) == sorted(DEFAULT_KEYRING) and not shipped_only.dev_key_ids
    blob = _issue(vendor.a, not_before=NOW - timedelta(days=1))
    refused = verify_licence(blob, shipped_only.ring, NOW)
    assert refused.state is LicenceState.UNKNOWN_KEY
    assert "development keys are off" in shipped_only.describe(refused)

    dev = load_trusted_keys(vendor.ring)
    assert dev.dev_key_ids == {"vendor-a", "vendor-b"}
    status = verify_licence(blob, dev.ring, NOW)
    assert status.state is LicenceState.VALID and dev.dev_key_of(status) == "vendor-a"
    assert "development key vendor-a" in dev.describe(status)
    with pytest.raises(KeyRingError):
        load_trusted_keys(tmp_path / "absent")  # an enabled but missing directory is an error


def test_a_development_key_never_replaces_a_shipped_key(tmp_path: Path) -> None:
    from knowledge_licensing import DEFAULT_KEYRING, load_trusted_keys

    shipped_id = sorted(DEFAULT_KEYRING)[0]
    impostor = make_vendor(tmp_path / "vendor", shipped_id)
    keys = load_trusted_keys(impostor.trust(tmp_path / "dev"))
    assert shipped_id not in keys.dev_key_ids
    blob = _issue(impostor, not_before=NOW - timedelta(days=1))
    assert verify_licence(blob, keys.ring, NOW).state is LicenceState.BAD_SIGNATURE


def test_install_licence_writes_only_a_valid_licence(vendor: Vendors, tmp_path: Path) -> None:
    from knowledge_licensing import install_licence

    ring = KeyRing.from_directory(vendor.ring)
    dest = tmp_path / "data" / "licence.json"
    expired = _issue(vendor.a, not_before=NOW - timedelta(days=9), expires_at=NOW)
    assert install_licence(expired, dest, ring, NOW).state is LicenceState.EXPIRED
    assert install_licence(b"junk", dest, ring, NOW).state is LicenceState.MALFORMED
    assert not dest.exists()
    good = _issue(vendor.a, not_before=NOW - timedelta(days=1))
    assert install_licence(good, dest, ring, NOW).state is LicenceState.VALID
    assert dest.read_bytes() == good and list(dest.parent.iterdir()) == [dest]


def test_cli_unreadable_licence_is_malformed(vendor: Vendors, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        license_group, ["verify", str(tmp_path), "--keys", str(vendor.ring), "--json"]
    )
    assert result.exit_code == 1 and json.loads(result.output)["state"] == "malformed"
    result = runner.invoke(license_group, ["inspect", str(tmp_path / "absent.json")])
    assert result.exit_code == 0 and "MISSING" in result.output


def test_issue_rejects_features_as_a_single_string(vendor: Vendors) -> None:
    with pytest.raises(TypeError):
        _issue(vendor.a, features="doc-graph")  # type: ignore[arg-type]
