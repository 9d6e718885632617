"""The edition gate over a real server: licence state x gated/ungated x unary/streaming x SDK/raw grpc,
and licence changes taking effect without a restart."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from google.rpc import error_details_pb2, status_pb2
from knowledge_sdk import AsyncKnowledgeClient, EditionRefused, RPCError
from knowledge_server._gen.knowledge.v1 import docgraph_pb2, errors_pb2, index_service_pb2
from knowledge_server.audit import AuditLog
from knowledge_server.cli import main as cli_main

from tests.conftest import (
    REPO_ROOT,
    LicenceVendor,
    dev_keys,
    make_vendor,
    serve_process,
    start_server,
)


def _tamper_payload(blob: bytes) -> bytes:
    doc = json.loads(blob)
    raw = bytearray(base64.urlsafe_b64decode(doc["payload"] + "=" * (-len(doc["payload"]) % 4)))
    raw[len(raw) // 2] ^= 0x01
    doc["payload"] = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    return json.dumps(doc).encode()


def _states(vendor: LicenceVendor, other: LicenceVendor) -> dict[str, bytes | None]:
    return {
        "missing": None,
        "valid": vendor.issue(),
        "expired": vendor.issue(expires_at=timedelta(seconds=-1)),
        "not_yet_valid": vendor.issue(not_before=timedelta(minutes=1)),
        "bad_signature": _tamper_payload(vendor.issue()),
        "unknown_key": other.issue(),
        "malformed": b"\x00not a licence{",
        "valid_community": vendor.issue(edition="community"),
    }


GATED_UNARY = "/knowledge.v1.DocGraphService/Themes"
GATED_STREAM = "/knowledge.v1.IndexService/BuildDocGraph"
UNGATED_UNARY = "/knowledge.v1.IndexService/GetStatus"
UNGATED_STREAM = "/knowledge.v1.IndexService/IngestSessions"


async def _raw_call(address: str, method: str) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as ch:
        if method == GATED_UNARY:
            call = ch.unary_unary(
                method,
                request_serializer=docgraph_pb2.ThemesRequest.SerializeToString,
                response_deserializer=docgraph_pb2.ThemesResponse.FromString,
            )
            req = docgraph_pb2.ThemesRequest()
        elif method == UNGATED_UNARY:
            call = ch.unary_unary(
                method,
                request_serializer=index_service_pb2.GetStatusRequest.SerializeToString,
                response_deserializer=index_service_pb2.GetStatusResponse.FromString,
            )
            req = index_service_pb2.GetStatusRequest()
        else:
            req_cls = (
                index_service_pb2.BuildDocGraphRequest
                if method == GATED_STREAM
                else index_service_pb2.IngestSessionsRequest
            )
            resp_cls = (
                index_service_pb2.BuildDocGraphResponse
                if method == GATED_STREAM
                else index_service_pb2.IngestSessionsResponse
            )
            stream = ch.unary_stream(
                method,
                request_serializer=req_cls.SerializeToString,
                response_deserializer=resp_cls.FromString,
            )
            try:
                async for _ in stream(
                    req_cls(paths=[str(REPO_ROOT / "tests" / "fixtures" / "seed")])
                    if method == UNGATED_STREAM
                    else req_cls(estimate=True)
                ):
                    pass
                return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    _check_refusal_detail(exc)
                return exc.code()
        try:
            await call(req)
            return grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                _check_refusal_detail(exc)
            return exc.code()


def _check_refusal_detail(exc: grpc.aio.AioRpcError) -> None:
    raw = dict(exc.trailing_metadata() or ()).get("grpc-status-details-bin")
    st = status_pb2.Status.FromString(raw)
    info, refusal = error_details_pb2.ErrorInfo(), errors_pb2.EditionRefusal()
    assert (
        st.details[0].Unpack(info)
        and info.reason == "KNOWLEDGE_EDITION_REQUIRED"
        and info.domain == "knowledge.v1"
    )
    assert (
        st.details[1].Unpack(refusal)
        and refusal.feature == "doc-graph"
        and refusal.required_edition == "enterprise"
    )
    # The refusal says how to get the missing licence.
    assert "knowledge license install FILE" in refusal.message, refusal.message


async def _sdk_call(address: str, method: str) -> str:
    async with AsyncKnowledgeClient(address) as kc:
        try:
            if method == GATED_UNARY:
                await kc.themes()
            elif method == UNGATED_UNARY:
                await kc.get_status()
            elif method == GATED_STREAM:
                async for _ in kc.build_doc_graph():
                    pass
            else:
                async for _ in kc.ingest_sessions([str(REPO_ROOT / "tests" / "fixtures" / "seed")]):
                    pass
        except EditionRefused as exc:
            assert exc.required_edition == "enterprise" and exc.feature == "doc-graph"
            return f"refused:{exc.licence_state}"
        except RPCError as exc:
            return exc.code.name
    return "OK"


async def test_gate_matrix(tmp_path: Path, licence_vendor: LicenceVendor) -> None:
    """Every licence state x gated/ungated x unary/streaming x SDK/raw: only a valid
    enterprise licence opens doc-graph; ungated RPCs are never refused by the gate."""
    licence_vendor.trust(tmp_path / "data" / "licence-keys")
    other = make_vendor(tmp_path / "other", "stranger")
    licence_file = tmp_path / "data" / "licence.json"
    rs = await start_server(tmp_path, **dev_keys(tmp_path / "data"))
    try:
        for state, blob in _states(licence_vendor, other).items():
            if blob is None:
                licence_file.unlink(missing_ok=True)
            else:
                licence_file.write_bytes(blob)
            rs.app.licence.reload()
            expected_state = "valid" if state == "valid_community" else state
            st = rs.app.licence.status()
            assert st.licence_state == expected_state, state
            opened = state == "valid"
            for method in (GATED_UNARY, GATED_STREAM, UNGATED_UNARY, UNGATED_STREAM):
                gated = method in (GATED_UNARY, GATED_STREAM)
                raw = await _raw_call(rs.address, method)
                via_sdk = await _sdk_call(rs.address, method)
                if gated and not opened:
                    assert raw == grpc.StatusCode.PERMISSION_DENIED, (state, method)
                    assert via_sdk == f"refused:{expected_state}", (state, method)
                else:
                    assert raw != grpc.StatusCode.PERMISSION_DENIED, (state, method)
                    assert not via_sdk.startswith("refused"), (state, method)
    finally:
        await rs.server.stop(0)


async def test_licence_file_change_upgrades_and_expiry_downgrades_without_restart(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    """A running server goes Community -> Enterprise when the file appears (noticed by the
    watcher's poll), and back to Community when the licence expires (licence time is moved
    forward, no file change, no restart)."""
    from knowledge_server.runtime import build_app, start_background

    licence_vendor.trust(tmp_path / "data" / "licence-keys")
    now = [datetime.now(UTC)]
    rs = await start_server(
        tmp_path,
        app_factory=lambda cfg: build_app(cfg, clock=lambda: now[0]),
        **dev_keys(tmp_path / "data"),
    )
    watcher = asyncio.create_task(start_background(rs.app))
    try:
        assert await _sdk_call(rs.address, GATED_UNARY) == "refused:missing"
        licence = licence_vendor.issue(expires_at=timedelta(hours=1))
        (tmp_path / "data" / "licence.json").write_bytes(licence)
        result = ""
        for _ in range(100):
            await asyncio.sleep(0.1)
            result = await _sdk_call(rs.address, GATED_UNARY)
            if not result.startswith("refused"):
                break
        assert not result.startswith("refused"), result
        now[0] += timedelta(hours=2)
        for _ in range(100):
            await asyncio.sleep(0.1)
            result = await _sdk_call(rs.address, GATED_UNARY)
            if result.startswith("refused"):
                break
        assert result == "refused:expired"
        # Both changes the server noticed are in the audit log, with the licence's id.
        changes = [e for e in rs.app.audit.events() if e.operation == "licence.change"]
        assert [e.outcome for e in changes] == ["valid", "expired"]
        assert all(e.principal == "server" and e.targets for e in changes)
        assert rs.app.audit.verify().ok
    finally:
        watcher.cancel()
        await rs.server.stop(0)


def test_sighup_reloads_the_licence_of_a_serving_process(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    licence_vendor.trust(tmp_path / "data" / "licence-keys")
    licence = licence_vendor.issue()
    dev_dir = dev_keys(tmp_path / "data")["licence_dev_keys_dir"]
    proc = serve_process(tmp_path / "data", env_extra={"KNOWLEDGE_LICENCE_DEV_KEYS_DIR": dev_dir})
    env = dict(os.environ, KNOWLEDGE_DATA_DIR=str(tmp_path / "data"))
    env.pop("KNOWLEDGE_ADDRESS", None)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])

        def status() -> dict:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "knowledge_server.cli",
                    "--address",
                    f"127.0.0.1:{port}",
                    "status",
                    "--json",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            return json.loads(out.stdout)["edition"]

        assert status()["edition"] == "community"
        (tmp_path / "data" / "licence.json").write_bytes(licence)
        proc.send_signal(signal.SIGHUP)
        edition = {}
        for _ in range(30):
            edition = status()
            if edition["edition"] == "enterprise":
                break
        assert edition["edition"] == "enterprise" and edition["licence_state"] == "valid"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    log = proc.stderr.read() if proc.stderr else ""
    assert "licence.changed" in log or "licence.reloaded" in log
    # The licence the server loaded never appears in the logs.
    assert json.loads(licence)["signature"] not in log


def test_startup_log_names_the_licence_state(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "licence.json").write_bytes(b"garbage")
    proc = serve_process(tmp_path / "data")
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("listening on")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    lines = [
        json.loads(ln)
        for ln in (proc.stderr.read() if proc.stderr else "").splitlines()
        if ln.startswith("{")
    ]
    loaded = [ln for ln in lines if ln.get("event") == "licence.loaded"]
    assert (
        len(loaded) == 1
        and loaded[0]["licence_state"] == "malformed"
        and loaded[0]["edition"] == "community"
    )


async def test_a_key_dropped_into_the_data_dir_is_not_trusted_without_the_dev_setting(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    """A self-issued licence plus its .pub in the data dir stays Community (with the
    reason) unless the operator names the directory as development keys; with the
    setting it is valid and GetStatus says a development key verified it."""
    data = tmp_path / "data"
    licence_vendor.install(data)
    rs = await start_server(tmp_path)
    try:
        st = rs.app.licence.status()
        assert st.edition == "community" and st.licence_state == "unknown_key"
        assert "only the vendor keys shipped with the service are trusted" in st.reason
        assert await _sdk_call(rs.address, GATED_UNARY) == "refused:unknown_key"
    finally:
        await rs.server.stop(0)
    rs = await start_server(tmp_path, **dev_keys(data))
    try:
        async with AsyncKnowledgeClient(rs.address) as kc:
            edition = (await kc.get_status()).edition
        assert edition.edition == "enterprise" and edition.licence_state == "valid"
        assert "verified with development key vendor-1" in edition.reason
    finally:
        await rs.server.stop(0)


def test_sighup_rereads_the_development_key_ring(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    """A key added to the development directory takes effect on SIGHUP; the start log
    says development keys are on and the change log names the development key."""
    data = tmp_path / "data"
    dev_dir = data / "dev-keys"
    dev_dir.mkdir(parents=True)
    (data / "licence.json").write_bytes(licence_vendor.issue())
    proc = serve_process(data, env_extra={"KNOWLEDGE_LICENCE_DEV_KEYS_DIR": str(dev_dir)})
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])

        async def edition() -> Any:
            async with AsyncKnowledgeClient(f"127.0.0.1:{port}") as kc:
                return (await kc.get_status()).edition

        assert asyncio.run(edition()).licence_state == "unknown_key"
        licence_vendor.trust(dev_dir)
        proc.send_signal(signal.SIGHUP)
        st = None
        for _ in range(50):
            st = asyncio.run(edition())
            if st.licence_state == "valid":
                break
            time.sleep(0.1)
        assert st is not None and st.edition == "enterprise" and st.licence_state == "valid"
        assert "development key vendor-1" in st.reason
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    lines = [
        json.loads(ln)
        for ln in (proc.stderr.read() if proc.stderr else "").splitlines()
        if ln.startswith("{")
    ]
    assert any(ln.get("event") == "licence.dev_keys_enabled" for ln in lines)
    changed = [ln for ln in lines if ln.get("event") == "licence.changed"]
    assert changed and changed[-1]["development_key"] is True
    assert "development key vendor-1" in changed[-1]["reason"]


def _cli(tmp_path: Path, *args: str, dev_dir: Path | None = None) -> Any:
    from click.testing import CliRunner
    from knowledge_server.cli import main

    env = {"KNOWLEDGE_DATA_DIR": str(tmp_path / "data"), "KNOWLEDGE_CONFIG": ""}
    env["KNOWLEDGE_LICENCE_DEV_KEYS_DIR"] = str(dev_dir) if dev_dir else ""
    return CliRunner().invoke(main, list(args), env=env)


def test_license_install_refuses_invalid_files_and_installs_a_valid_one(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    dest = tmp_path / "data" / "licence.json"
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"not a licence")
    out = _cli(tmp_path, "license", "install", str(junk))
    assert out.exit_code == 1 and "refused" in out.stderr and "MALFORMED" in out.stderr
    assert "nothing was installed" in out.stderr and not dest.exists()

    good = tmp_path / "good.json"
    good.write_bytes(licence_vendor.issue())
    # A self-issued licence is refused: its key is not a vendor key.
    out = _cli(tmp_path, "license", "install", str(good))
    assert out.exit_code == 1 and "UNKNOWN_KEY" in out.stderr
    assert "development keys are off" in out.stderr and not dest.exists()

    dev_dir = licence_vendor.trust(tmp_path / "dev-keys")
    expired = tmp_path / "expired.json"
    expired.write_bytes(licence_vendor.issue(expires_at=timedelta(seconds=-1)))
    out = _cli(tmp_path, "license", "install", str(expired), dev_dir=dev_dir)
    assert out.exit_code == 1 and "EXPIRED" in out.stderr and not dest.exists()

    out = _cli(tmp_path, "license", "install", str(good), dev_dir=dev_dir)
    assert out.exit_code == 0, out.stderr
    assert "installed lic-1" in out.stdout and "development key vendor-1" in out.stdout
    assert dest.read_bytes() == good.read_bytes()
    # no temporary left; the audit log holds the refused installs and this one
    assert sorted(p.name for p in dest.parent.iterdir()) == [
        "audit.key",
        "audit.sqlite",
        "licence.json",
    ]
    log = AuditLog(dest.parent / "audit.sqlite")
    try:
        installs = [e for e in log.events() if e.operation == "licence.install"]
        assert [e.outcome for e in installs][-1] == "ok" and installs[-1].targets == ("lic-1",)
        assert all(e.outcome.startswith("refused:") for e in installs[:-1]) and installs[:-1]
        assert log.verify().ok
    finally:
        log.close()

    out = _cli(tmp_path, "license", "install", str(tmp_path / "absent.json"))
    assert out.exit_code == 2 and "cannot read" in out.stderr


def test_the_removed_keys_dir_setting_is_refused(tmp_path: Path) -> None:
    from knowledge_server.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="licence_dev_keys_dir"):
        load_config(env={"KNOWLEDGE_LICENCE_KEYS_DIR": str(tmp_path)})
    cfg_file = tmp_path / "k.toml"
    cfg_file.write_text(f'licence_keys_dir = "{tmp_path}"\n')
    with pytest.raises(ConfigError, match="no longer supported"):
        load_config(cfg_file, env={})


def test_docgraph_build_root_is_the_callers_folder(
    tmp_path: Path, licence_vendor: LicenceVendor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``knowledge docgraph build --root .`` builds the folder the command runs in, as
    ``knowledge index .`` indexes it: the path went to the server unresolved, which read
    "." as its own working directory (an unindexed one, or the wrong workspace)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "guide.md").write_text("# Guide\n\nUse `alpha_param` with `beta_param`.\n")
    licence_vendor.install(tmp_path / "data")
    dev_dir = dev_keys(tmp_path / "data")["licence_dev_keys_dir"]
    proc = serve_process(tmp_path / "data", env_extra={"KNOWLEDGE_LICENCE_DEV_KEYS_DIR": dev_dir})
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        monkeypatch.chdir(ws)
        runner = CliRunner()
        env = {"KNOWLEDGE_ADDRESS": address, "KNOWLEDGE_DATA_DIR": str(tmp_path / "data")}
        indexed = runner.invoke(cli_main, ["index", ".", "--json"], env=env)
        assert indexed.exit_code == 0, indexed.output
        built = runner.invoke(
            cli_main, ["docgraph", "build", "--root", ".", "--structural-only", "--json"], env=env
        )
        assert built.exit_code == 0, built.output
        assert "has not been indexed" not in built.output
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_licence_install_the_audit_log_cannot_record_installs_nothing(
    tmp_path: Path, licence_vendor: LicenceVendor
) -> None:
    """Every write audited: the licence file was replaced before its event was appended, so
    an audit log that cannot be written left an installed licence no event records."""
    dev_dir = licence_vendor.trust(tmp_path / "dev-keys")
    good = tmp_path / "good.json"
    good.write_bytes(licence_vendor.issue())
    (tmp_path / "data" / "audit.sqlite").mkdir(parents=True)  # cannot be opened as a database
    out = _cli(tmp_path, "license", "install", str(good), dev_dir=dev_dir)
    assert out.exit_code == 2 and "audit log cannot be written" in out.stderr, out.stderr
    assert not (tmp_path / "data" / "licence.json").exists()
