"""What the redaction rules catch, and the ordinary text they must leave alone."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from knowledge_server.code import _redact_gate as gate
from knowledge_server.code.chunking import chunk_file
from knowledge_server.code.model import IndexOptions
from knowledge_server.episodes.importers import generic
from knowledge_server.redact import redact

# (text, secret value, ordinary text around it that must stay). Values are made up.
GAPS = {
    # Code-shaped values are not secrets only when unquoted (redact._CODE_VALUE).
    "quoted-call-shape": (
        'api_token = "Zq9vLm(X2pR7tK4wB"  # ci',
        "Zq9vLm(X2pR7tK4wB",
        "# ci",
    ),
    "dotted-password": (
        "PASSWORD=correct.horse.battery\nHOST=db",
        "correct.horse.battery",
        "HOST=db",
    ),
    "db-pass": ("export DB_PASS=Zq9vLmX2pR7tK4wB # shop db", "Zq9vLmX2pR7tK4wB", "# shop db"),
    "pass": ("PASS=Zq9vLmX2pR7tK4wB\nHOST=db.local", "Zq9vLmX2pR7tK4wB", "HOST=db.local"),
    "passphrase": (
        "gpg:\n  passphrase: 'Zq9vLmX2pR7tK4wB'\n  key: main",
        "Zq9vLmX2pR7tK4wB",
        "key: main",
    ),
    "azure-account-key": (
        "DefaultEndpointsProtocol=https;AccountName=shop;"
        "AccountKey=Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wB+/q9vLmX2pR==;EndpointSuffix=core.windows.net",
        "Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wB+/q9vLmX2pR==",
        "AccountName=shop;",
    ),
    "npm-token": (
        "//registry/:_authToken npm_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcd for ci",
        "npm_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcd",
        "for ci",
    ),
    "huggingface-token": (
        "login with hf_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBab then pull",
        "hf_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBab",
        "then pull",
    ),
    "slack-webhook": (
        "post to https://hooks.slack.com/services/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 on failure",
        "Zq9vLmX2pR7tK4wBZq9vLmX2",
        "on failure",
    ),
    "curl-user": (
        "curl -sS -u deploy:Zq9vLmX2pR https://ci.local/api",
        "Zq9vLmX2pR",
        "https://ci.local/api",
    ),
    "mysql-p": (
        "mysql -h db -P 3306 -uroot -pZq9vLmX2pR shop < dump.sql",
        "Zq9vLmX2pR",
        "shop < dump.sql",
    ),
    "docker-login-p": (
        "docker login -u ci -p Zq9vLmX2pR registry.local",
        "Zq9vLmX2pR",
        "registry.local",
    ),
    "url-password-with-at": (
        "DATABASE_URL is postgres://u:p@ssZq9vLmX2pR@db.local:5432/shop",
        "ssZq9vLmX2pR",
        "@db.local:5432/shop",
    ),
    "url-password-without-user": (
        "redis://:Zq9vLmX2pR@cache:6379/0",
        "Zq9vLmX2pR",
        "@cache:6379/0",
    ),
}


@pytest.mark.parametrize(("text", "value", "kept"), GAPS.values(), ids=list(GAPS))
def test_secret_is_redacted_and_its_surroundings_stay(text: str, value: str, kept: str) -> None:
    red = redact(text)
    assert value not in red and "[REDACTED:" in red
    assert kept in red
    # The code lane's pre-checked paths give the same text.
    assert gate.redact_text(text) == red
    assert gate.redact_lines(text.split("\n")) == red.split("\n")


@pytest.mark.parametrize(("text", "value", "kept"), GAPS.values(), ids=list(GAPS))
def test_secret_never_reaches_a_code_chunk(text: str, value: str, kept: str) -> None:
    chunks, _, _ = chunk_file("/ws", "deploy.sh", f"set -e\n{text}\necho done\n")
    joined = "\n".join(c.text for c in chunks)
    assert value not in joined and kept in joined and "echo done" in joined


@pytest.mark.parametrize(
    "text",
    [
        "the password reset flow sends a mail",
        "pass the test before merging",
        "password: see the vault",
        "bypass=enabled_now",
        "compass: northward",
        "pass_rate=0.9512",
        "if ok:\n    pass\nelse:\n    retry = 3",
        "passes: 123456",
        "passphrase: ${GPG_PASSPHRASE}",
        "curl -sS https://ci.local/api -o out.json",
        'curl -u "$CI_USER:$CI_PASSWORD" https://ci.local',
        "mysql -u root -p shop",
        "mysql -h db -P 3306 shop",
        "docker login --password-stdin registry.local",
        "docker run -u 1000:1000 img",
        "hf_hub_download(repo_id, filename)",
        "npm_config_cache=/tmp/npm",
        "git+ssh://git@github.com:org/repo.git",
        "https://hooks.slack.com/ is the host",
        "AccountKey=<your key>",
    ],
)
def test_ordinary_text_stays(text: str) -> None:
    assert redact(text) == text
    assert gate.redact_lines(text.split("\n")) == text.split("\n")


@pytest.mark.parametrize(
    ("path", "text"),
    [
        # Code, not secrets, in a programming language's source: calls, indexing and paths
        # assigned to names with "token", "secret" or "auth" in them (fd, click, starlette),
        # and a statement on the line after a name and ":".
        ("src/fmt/mod.rs", "let mut tokens = Vec::new();"),
        ("src/fmt/mod.rs", "tokens.push(Token::Text(std::mem::take(&mut buf)));"),
        ("src/exec/mod.rs", "let arg = FormatTemplate::Tokens(vec![Token::Placeholder]);"),
        ("click/_termui_impl.py", "env_tokens = shlex.split(less_env)"),
        ("app/settings.py", "SECRET_KEY = config('SECRET_KEY', cast=Secret)"),
        ("app/auth.py", 'auth = request.headers["Authorization"]'),
        ("app/ids.py", "token = next(counter)"),
        ("app/ws.py", 'if subprotocols[1] != "token":\n        return False'),
    ],
)
def test_code_in_source_is_not_a_secret(path: str, text: str) -> None:
    """In a grammar language's source (``redact(text, code=True)``, as the chunker calls it)
    an unquoted call, index or path is code; the same text elsewhere is judged as before."""
    assert redact(text, code=True) == text
    (chunk,) = chunk_file("/ws", path, text, IndexOptions())[0]
    assert chunk.text == text


@pytest.mark.parametrize(
    "text",
    [
        # Generated passwords with the characters of code, in configuration and in source.
        "db.password=Summer(2023)!",
        "POSTGRES_PASSWORD: a8Fj2(kLq9#x",
        "  - DB_PASSWORD=p4ss[word]99",
        "API_KEY=abc123[xyz]789",
        "secret_key = kT9x[mQ2!pLz",
        "client_secret: Zx81.k(2mv",
        "password=Pa55::w0rdXYZ",
        "AUTH_TOKEN=abc::def123456",
        "token: ::8fA9zQ1xB",
        "password:\n  s3cr3tHunter2",
        "PASSWORD=correct.horse.battery",
    ],
)
def test_a_password_that_looks_like_code_is_still_redacted(text: str) -> None:
    for code in (False, True):
        assert "[REDACTED:" in redact(text, code=code), (text, code)


def test_episode_text_is_redacted_with_the_same_rules(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl"
    rows = [
        {"session_id": "g1", "role": "user", "text": text, "meta": {"cmd": text}}
        for text, _, _ in GAPS.values()
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    res = generic.import_file(str(p))
    assert len(res.events) == len(GAPS)
    for event, (_, value, kept) in zip(res.events, GAPS.values(), strict=True):
        assert value not in event.text and kept in event.text
        assert value not in json.dumps(event.meta)


@pytest.mark.parametrize("kind", ["", "RSA ", "EC ", "DSA ", "OPENSSH ", "ENCRYPTED ", "PGP "])
def test_a_base64_written_private_key_is_redacted(kind: str) -> None:
    """Keys are never indexed: a PEM private key written in base64 as a whole (a Kubernetes
    Secret's ``tls.key``, a kubeconfig's ``client-key-data``) has no ``BEGIN`` line to match,
    and its field names name no secret; it was stored as written. A certificate (public)
    written the same way is kept."""
    block = "PGP PRIVATE KEY BLOCK" if kind == "PGP " else f"{kind}PRIVATE KEY"
    pem = f"-----BEGIN {block}-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END {block}-----\n"
    encoded = base64.b64encode(pem.encode()).decode()
    cert = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n").decode()
    manifest = (
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\ndata:\n"
        f"  tls.crt: {cert}\n  tls.key: {encoded}\n"
    )
    kubeconfig = f"users:\n- name: admin\n  user:\n    client-key-data: {encoded}\n"
    for text in (manifest, kubeconfig):
        red = redact(text)
        assert encoded not in red and encoded[30:60] not in red
        assert "[REDACTED:private-key-base64]" in red
        chunks, _, _ = chunk_file("/ws", "deploy/ingress-tls.yaml", text)
        assert not any(encoded[30:60] in c.text for c in chunks)
    assert cert in redact(manifest)


def test_code_after_a_lone_key_header_is_kept() -> None:
    """Redaction never blanks ordinary code: a key header without a key (a parser's
    ``startswith``, BEGIN and END constants far apart) ran the key rule to the END line or
    the end of the file, and the file is redacted whole, so every later function of the
    module was stored as empty lines."""
    handlers = "".join(
        f"def handler_{i}(request):\n    value = request.get('k{i}')\n    return value\n\n"
        for i in range(30)
    )
    lone = f'def is_pem(text):\n    return text.startswith("-----BEGIN RSA PRIVATE KEY-----")\n\n{handlers}'
    apart = (
        'BEGIN = "-----BEGIN PRIVATE KEY-----"\n\n'
        + handlers
        + 'END = "-----END PRIVATE KEY-----"\n'
    )
    for src in (lone, apart):
        chunks, _, _ = chunk_file("/ws", "pem.py", src)
        kept = {c.symbol for c in chunks if "return value" in c.text}
        assert kept >= {f"handler_{i}" for i in range(30)}, sorted(kept)[:5]
    # A real block, in code or escaped in JSON, is still redacted whole, and so is a
    # truncated one (no END line): its body lines.
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nYWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4"
    for text in (
        f'KEY = """-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"""\n',
        json.dumps({"key": f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"}),
        f"notes\n-----BEGIN RSA PRIVATE KEY-----\n{body}\n(truncated)\n",
    ):
        red = redact(text)
        assert "MIIEvQ" not in red and "YWJjZGVm" not in red and "[REDACTED:private-key]" in red


def test_a_base64_key_wrapped_or_bundled_is_redacted_whole() -> None:
    """``base64 tls.key`` wraps at 76 columns (a YAML ``|`` block holds it so), and a
    certificate-and-key bundle puts the key's header mid-way: the rule took the first line
    of the one and missed the other."""
    pem = (
        "-----BEGIN PRIVATE KEY-----\n"
        + "\n".join(
            f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{i:04d}abcdefghijklmnopqrstuv" for i in range(20)
        )
        + "\n-----END PRIVATE KEY-----\n"
    )
    one = base64.b64encode(pem.encode()).decode()
    wrapped = [one[i : i + 76] for i in range(0, len(one), 76)]
    yaml = "data:\n  tls.key: |\n" + "".join(f"    {line}\n" for line in wrapped) + "type: tls\n"
    red = redact(yaml)
    assert not any(line in red for line in wrapped) and red.endswith("type: tls\n")
    cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCARygAwIBAgIUZm9v\n-----END CERTIFICATE-----\n"
    bundle = base64.b64encode((cert + pem).encode()).decode()
    assert bundle not in redact(f"  tls.pem: {bundle}\n")
