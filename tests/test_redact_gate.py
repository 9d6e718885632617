"""The redaction pre-check is built from the rules: every rule is covered, none can opt out."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from knowledge_server import redact as redact_mod
from knowledge_server.code import _redact_gate as gate
from knowledge_server.redact import RULES, Rule, redact, redact_counted

_AWS_SECRET = "Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcdEFGH"

# One text per rule kind holding a secret of that kind (values are made up).
EXAMPLES = {
    "private-key": "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\n",
    "private-key-base64": "  tls.key: LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUV2UUlCQURBTkJna3Fo\n",
    "aws-access-key": "id: AKIAZ3QX7LMN4PRS2TUV in the log",
    "aws-secret-key": "aws_secret_access_key = Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcdEFGH",
    "github-token": "push with ghp_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcd now",
    "gitlab-token": "glpat-Zq9vLmX2pR7tK4wBZq9v",
    "slack-token": "xoxb-1234567890-Zq9vLmX2pR",
    "openai-key": "key sk-proj-Zq9vLmX2pR7tK4wBZq9vLmX2 here",
    "google-api-key": "AIzaZq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabc",
    "stripe-key": "charge with rk_live_Zq9vLmX2pR7tK4wB",
    "jwt": "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4",
    "npm-token": "npm_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBabcd",
    "huggingface-token": "HF_TOKEN hf_Zq9vLmX2pR7tK4wBZq9vLmX2pR7tK4wBab",
    "slack-webhook": "https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/Zq9vLmX2pR7tK4wB",
    "azure-key": "AccountName=shop;AccountKey=Zq9vLmX2pR7tK4wBZq9vLmX2pR==;EndpointSuffix=x",
    "url-password": "postgres://app:Zq9vLmX2pR@db.local/shop",
    "curl-password": "curl -u deploy:Zq9vLmX2pR https://ci.local",
    "mysql-password": "mysqldump -uroot -pZq9vLmX2pR shop",
    "docker-password": "docker login -u ci --password Zq9vLmX2pR registry.local",
    "bearer-token": "Authorization: Bearer Zq9vLmX2pR7tK4wB",
    "assignment": 'client_secret: "Zq9vLmX2pR7tK4wB"',
    "pass-assignment": "DB_PASS=Zq9vLmX2pR7tK4wB",
}


def test_every_rule_has_an_example() -> None:
    assert set(EXAMPLES) == {rule.kind for rule in RULES}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.kind)
def test_every_rule_is_covered_by_the_gate(rule: Rule) -> None:
    text = EXAMPLES[rule.kind]
    assert f"[REDACTED:{rule.kind}]" in redact(text)
    # The rule's own declaration explains each of its matches ...
    matches = list(rule.pattern.finditer(text))
    assert matches
    assigned = gate._assigned_shape(rule.assigned) if rule.assigned else None
    for m in matches:
        found = m.group(0)
        assert any(lit in found.casefold() for lit in rule.literals) or (
            assigned is not None and assigned.search(found)
        )
    # ... and the gate sends the text on, whole or line by line.
    assert gate._may_hold_secret(text)
    assert gate.redact_text(text) == redact(text)
    lines = gate.redact_lines(text.split("\n"))
    assert lines == redact_counted(text, keep_lines=True)[0].split("\n")
    assert len(lines) == text.count("\n") + 1
    if not rule.multiline:
        assert lines == redact(text).split("\n")


def test_a_rule_without_a_trigger_is_refused() -> None:
    with pytest.raises(ValueError, match="declares no literals or assigned key words"):
        Rule("new-kind", re.compile(r"\bnk_[0-9a-f]{32}\b"))
    with pytest.raises(ValueError, match="case-folded"):
        Rule("new-kind", re.compile(r"\bNK_[0-9a-f]{32}\b"), literals=("NK_",))
    with pytest.raises(ValueError, match="multi-line"):
        Rule("new-kind", re.compile(r"nk=.*", re.DOTALL), assigned=("nk",), multiline=True)


@pytest.fixture
def one_more_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    rule = Rule("new-kind", re.compile(r"\bnk_[0-9a-f]{32}\b"), literals=("nk_",))
    monkeypatch.setattr(redact_mod, "RULES", (*RULES, rule))
    importlib.reload(gate)
    yield
    monkeypatch.undo()
    importlib.reload(gate)


def test_a_new_rule_is_covered_without_touching_the_gate(one_more_rule: None) -> None:
    text = "deploy nk_" + "0123456789abcdef" * 2 + " done"
    assert gate.redact_text(text) == "deploy [REDACTED:new-kind] done"
    assert gate.redact_lines(["a", text]) == ["a", "deploy [REDACTED:new-kind] done"]


_PIECES = st.sampled_from(
    [
        *EXAMPLES.values(),
        "key",
        "Token",
        "ſecret",
        "İ",
        "passwd",
        "auth",
        "author",
        "=",
        ": ",
        "\n",
        "\n\n",
        " ",
        '"',
        "'",
        "Zq9vLmX2pR7tK4wB",
        "AKIA",
        "xox",
        "://",
        "@",
        "for key in d:",
        "PASS",
        "bypass",
        "curl -u a:",
        "mysql -p",
        "docker login -p ",
        "p@ss",
        "aws_secret_access_key",
        _AWS_SECRET,
        "\n=\n",
        " :\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12))
def test_the_gate_never_changes_what_redact_returns(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert gate.redact_text(text) == redact(text)
    lines = gate.redact_lines(text.split("\n"))
    assert "\n".join(lines) == redact_counted(text, keep_lines=True)[0]
    assert len(lines) == text.count("\n") + 1


@pytest.mark.parametrize(
    "lines",
    [
        ["[default]", "aws_secret_access_key", "=", _AWS_SECRET, "region = eu-west-1"],
        ["aws_secret_access_key", "", "  =  ", "", f'"{_AWS_SECRET}"', "done"],
        ["aws_secret_access_key =", "", _AWS_SECRET],
    ],
)
def test_the_line_path_follows_an_assignment_across_lines(lines: list[str]) -> None:
    """Key, ``=`` and value on lines of their own: the full routine redacts the value, so the
    line-by-line path must hand it the lines up to the value, not only up to the ``=``."""
    out = gate.redact_lines(lines)
    assert out is not None and len(out) == len(lines)
    text = "\n".join(out)
    assert _AWS_SECRET not in text and "[REDACTED:aws-secret-key]" in text
    assert text == redact("\n".join(lines))
    assert [a for a, b in zip(out, lines, strict=True) if a != b] == [
        line.replace(_AWS_SECRET, "[REDACTED:aws-secret-key]")
        for line in lines
        if _AWS_SECRET in line
    ]
