"""Authentication over a real server: bearer tokens, roles, TLS and mutual TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from knowledge_sdk import (
    AsyncKnowledgeClient,
    ConnectionSettings,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from knowledge_server.auth import TokenStore
from knowledge_server.config import ConfigError, load_config
from knowledge_server.server import create_server

from tests.conftest import start_server


def _store(tmp_path: Path) -> tuple[TokenStore, str, str]:
    store = TokenStore(tmp_path / "data" / "tokens.json")
    _, agent = store.create("agent-1", "org-a", [str(tmp_path)], "agent")
    _, operator = store.create("ops-1", "org-a", None, "operator")
    return store, agent, operator


async def test_tokens_and_roles(tmp_path: Path) -> None:
    store, agent, operator = _store(tmp_path)
    rs = await start_server(tmp_path, authenticate=store.authenticate, auth="on")
    try:
        async with AsyncKnowledgeClient(rs.address) as anonymous:
            with pytest.raises(Unauthenticated) as info:
                await anonymous.get_status()
            assert info.value.reason == "KNOWLEDGE_UNAUTHENTICATED"
        async with AsyncKnowledgeClient(rs.address, token="kn_" + "x" * 43) as wrong:
            with pytest.raises(Unauthenticated) as wrong_info:
                await wrong.search("anything")
            # No hint whether a token exists: the same message as a missing one.
            assert wrong_info.value.message == info.value.message
        async with AsyncKnowledgeClient(rs.address, token=agent) as kc:
            st = await kc.get_status()
            assert st.principal.id == "agent-1" and st.principal.role == "agent"
            await kc.search("where is the config")
            with pytest.raises(PermissionDenied) as denied:
                async for _ in kc.ingest_sessions([]):
                    pass
            assert denied.value.reason == "KNOWLEDGE_PERMISSION_DENIED"
        async with AsyncKnowledgeClient(rs.address, token=operator) as kc:
            assert (await kc.get_status()).principal.role == "operator"
    finally:
        await rs.server.stop(0)


async def test_two_authorization_headers_are_refused(tmp_path: Path) -> None:
    """One call with two authorization headers is UNAUTHENTICATED, whichever order the
    tokens come in and even when both are valid: neither the first nor the last is used."""
    import grpc
    from knowledge_server._gen.knowledge.v1 import index_service_pb2, index_service_pb2_grpc

    store, agent, operator = _store(tmp_path)
    rs = await start_server(tmp_path, authenticate=store.authenticate, auth="on")
    try:
        async with grpc.aio.insecure_channel(rs.address) as channel:
            stub = index_service_pb2_grpc.IndexServiceStub(channel)
            request = index_service_pb2.GetStatusRequest()
            one = await stub.GetStatus(request, metadata=(("authorization", f"Bearer {agent}"),))
            assert one.principal.id == "agent-1"
            for first, second in ((agent, operator), (operator, agent), (agent, agent)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetStatus(
                        request,
                        metadata=(
                            ("authorization", f"Bearer {first}"),
                            ("authorization", f"Bearer {second}"),
                        ),
                    )
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await rs.server.stop(0)


def test_non_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    import asyncio

    from knowledge_server.runtime import build_authenticator

    cfg = load_config(env={}, overrides={"listen": "0.0.0.0:0", "data_dir": str(tmp_path / "d")})
    with pytest.raises(ConfigError, match="token"):
        build_authenticator(cfg)
    with pytest.raises(ConfigError, match="authentication"):
        asyncio.run(create_server(cfg))


def _cert(
    subject: str,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    issuer: x509.Name | None = None,
    ca: bool = False,
    san: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return key, cert


def _write(
    path: Path, key: ec.EllipticCurvePrivateKey | None, cert: x509.Certificate
) -> tuple[Path, Path | None]:
    cert_path = path.with_suffix(".pem")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = None
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca_key, ca = _cert("test-ca", ca=True)
    srv_key, srv = _cert("localhost", ca_key, ca.subject, san=True)
    cli_key, cli = _cert("client-1", ca_key, ca.subject)
    out: dict[str, Path] = {}
    out["ca"], _ = _write(tmp_path / "ca", None, ca)
    out["srv_cert"], out["srv_key"] = _write(tmp_path / "server", srv_key, srv)  # type: ignore[assignment]
    out["cli_cert"], out["cli_key"] = _write(tmp_path / "client", cli_key, cli)  # type: ignore[assignment]
    return out


async def test_tls(tmp_path: Path, pki: dict[str, Path]) -> None:
    rs = await start_server(tmp_path, tls_cert=str(pki["srv_cert"]), tls_key=str(pki["srv_key"]))
    try:
        settings = ConnectionSettings(address=rs.address, tls_ca=pki["ca"], timeout=5)
        async with AsyncKnowledgeClient(settings=settings) as kc:
            assert (await kc.get_status()).version
        async with AsyncKnowledgeClient(rs.address, timeout=1) as plain:
            with pytest.raises(Unavailable):
                await plain.get_status()
    finally:
        await rs.server.stop(0)


async def test_mutual_tls_requires_a_client_certificate(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    rs = await start_server(
        tmp_path,
        tls_cert=str(pki["srv_cert"]),
        tls_key=str(pki["srv_key"]),
        tls_client_ca=str(pki["ca"]),
    )
    try:
        with_cert = ConnectionSettings(
            address=rs.address,
            tls_ca=pki["ca"],
            tls_cert=pki["cli_cert"],
            tls_key=pki["cli_key"],
            timeout=5,
        )
        async with AsyncKnowledgeClient(settings=with_cert) as kc:
            assert (await kc.get_status()).version
        without = ConnectionSettings(address=rs.address, tls_ca=pki["ca"], timeout=1)
        async with AsyncKnowledgeClient(settings=without) as kc:
            with pytest.raises(Unavailable):
                await kc.get_status()
    finally:
        await rs.server.stop(0)
