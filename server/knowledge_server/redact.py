"""Secret redaction applied before any text reaches an index.

Every lane that stores text (episodes, code chunks, documents) passes it through
:func:`redact` at ingestion time, so a secret can never be searched for, returned
in a snippet, or copied into a derived layer. The replacement keeps the kind of
secret (``[REDACTED:aws-access-key]``) so a reader still sees that something was
there, without the value.

Patterns favour recall over precision: a false positive costs a few characters of
context, a false negative leaks a credential.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

__all__ = [
    "RULES",
    "SECRET_FILE_PATTERNS",
    "SOURCE_FILE_EXCEPTIONS",
    "Rule",
    "looks_like_secret",
    "redact",
    "redact_counted",
]


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of secret, and what text it can possibly match.

    Every match contains one of ``literals`` once case-folded, or one of the ``assigned`` key
    words continued by word characters and an assignment (``=`` or ``:``). The indexers'
    pre-check (:mod:`knowledge_server.code._redact_gate`) is built from these declarations and
    sends a text to :func:`redact` only when one of them occurs, so a rule must declare them:
    one without any is refused here instead of being skipped there.
    """

    kind: str
    pattern: re.Pattern[str]
    literals: tuple[str, ...] = ()
    assigned: tuple[str, ...] = ()
    # Which regex group holds the secret value; 0 = the whole match.
    group: int = 0
    # A match may span lines, so its replacement may change the line count.
    multiline: bool = False
    # The value is what a name is assigned: unquoted, it may be code (_is_code).
    assigns: bool = False

    def __post_init__(self) -> None:
        if not self.literals and not self.assigned:
            raise ValueError(
                f"redaction rule {self.kind!r} declares no literals or assigned key words: "
                "the redaction pre-check could never send it a text"
            )
        for trigger in self.literals + self.assigned:
            if not trigger or trigger != trigger.casefold():
                raise ValueError(
                    f"redaction rule {self.kind!r}: trigger {trigger!r} must be non-empty and "
                    "case-folded"
                )
        if self.multiline and not self.literals:
            raise ValueError(f"redaction rule {self.kind!r}: a multi-line rule needs literals")


# What a private key block's body holds between its BEGIN and END lines.
_PEM_BODY = r"[A-Za-z0-9+/=\s\"'`\\,;]|(?:Proc-Type|DEK-Info|Version|Comment|Hash):[^\n]*"
# Without an END line: the rest of the header's line that only closes a string, then each
# following line (a written or an escaped line break) that is a key's: a run of base64 or
# an armour header.
_PEM_LINES = (
    r"[\"'`\\,;]*(?:[ \t]*(?:\r?\n|\\r?\\n)[ \t\"'`+]*"
    r"(?:[A-Za-z0-9+/=]{16,}|(?:Proc-Type|DEK-Info|Version|Comment|Hash):[^\n]*)"
    r"[ \t\"'`\\,;+]*)*"
)
# A PEM private key written in base64 as a whole (a Kubernetes Secret's ``tls.key``, a
# kubeconfig's ``client-key-data``, a certificate-and-key bundle): "PRIVATE KEY" encoded
# at each of the three alignments a text can put it in, cut to whole groups of four.
_PRIVATE_KEY_BASE64 = tuple(
    base64.b64encode(part[: len(part) // 3 * 3]).decode("ascii")
    for part in (b"PRIVATE KEY"[j:] for j in range(3))
)

# Key words of the assignment-shaped rules: ``api_key = ...``, ``"password": ...``.
_ASSIGNED_WORDS = ("key", "secret", "passw", "pwd", "token", "auth")

RULES: tuple[Rule, ...] = (
    # A key block: the header, then what a key's body holds (base64, line breaks written
    # or escaped, quotes and "+" of a string split in code, armour headers) up to the END
    # line; without an END line within that, the body-like text after the header. Code or
    # prose after a lone header (a parser's `startswith("-----BEGIN ... KEY-----")`) is
    # not part of it: the whole file is redacted at once (``keep_lines``), so a rule
    # running to the end of the text would blank every line after such a header.
    Rule(
        "private-key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r"(?:(?:" + _PEM_BODY + r")*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r"|" + _PEM_LINES + r")"
        ),
        literals=("private key",),
        multiline=True,
    ),
    # The run of base64 that holds it, and the lines that continue it (wrapped at 64 or 76
    # columns, indented in a YAML block).
    Rule(
        "private-key-base64",
        re.compile(
            r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]*(?:"
            + "|".join(map(re.escape, _PRIVATE_KEY_BASE64))
            + r")[A-Za-z0-9+/]*={0,2}"
            r"(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/]+={0,2}(?=[ \t]*(?:\r?\n|\Z)))*"
        ),
        literals=tuple(p.casefold() for p in _PRIVATE_KEY_BASE64),
        multiline=True,
    ),
    Rule(
        "aws-access-key",
        re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),
        literals=("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"),
    ),
    Rule(
        "aws-secret-key",
        re.compile(
            r"(?i)(aws_?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?)([A-Za-z0-9/+=]{40})"
        ),
        assigned=("key",),
        group=2,
    ),
    Rule(
        "github-token",
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
        literals=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Rule("gitlab-token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"), literals=("glpat-",)),
    Rule("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), literals=("xox",)),
    Rule(
        "openai-key",
        re.compile(r"\bsk-(?:proj-|ant-(?:api\d\d-)?)?[A-Za-z0-9_\-]{20,}\b"),
        literals=("sk-",),
    ),
    Rule("google-api-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"), literals=("aiza",)),
    Rule(
        "stripe-key",
        re.compile(r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}\b"),
        literals=("_live_", "_test_"),
    ),
    Rule(
        "jwt",
        re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\b"),
        literals=("eyj",),
    ),
    Rule("npm-token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), literals=("npm_",)),
    Rule("huggingface-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), literals=("hf_",)),
    # https://hooks.slack.com/services/T.../B.../secret -> keep the host, drop the path.
    Rule(
        "slack-webhook",
        re.compile(r"(?i)(\bhooks\.slack\.com/(?:services|workflows|triggers)/)([A-Za-z0-9_/\-]+)"),
        literals=("hooks.slack.com/",),
        group=2,
    ),
    # Azure connection strings: ...;AccountKey=<base64>;... and SharedAccessKey=<base64>.
    Rule(
        "azure-key",
        re.compile(r"(?i)(\b(?:Account|SharedAccess)Key\s*=\s*)([A-Za-z0-9+/]{20,}={0,2})"),
        assigned=("key",),
        group=2,
    ),
    # scheme://user:password@host -> keep user and host, drop the password. The password
    # runs to the last "@" before the host, so an unescaped "@" in it does not leak the rest.
    Rule(
        "url-password",
        re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@'\"]*:)([^\s/'\"]+)(@)"),
        literals=("://",),
        group=2,
    ),
    # Passwords given on a command line: curl -u user:pw, mysql -ppw, docker login -p pw.
    Rule(
        "curl-password",
        re.compile(r"(?i)(\bcurl\b[^\n]*?\s(?:-u|--user)(?:\s+|=)?[\"']?[^\s:'\"]+:)([^\s'\"]+)"),
        literals=("curl",),
        group=2,
    ),
    Rule(
        # -p is the password only when glued to it ("-p secret" prompts); -P is the port.
        "mysql-password",
        re.compile(r"(\b(?i:mysql|mariadb)[a-z\-]*\b[^\n]*?\s-p[\"']?)([^\s'\"]+)"),
        literals=("mysql", "mariadb"),
        group=2,
    ),
    Rule(
        "docker-password",
        re.compile(
            r"(?i)(\b(?:docker|podman)\s+login\b[^\n]*?\s(?:-p|--password)(?:\s+|=)[\"']?)"
            r"([^\s'\"]+)"
        ),
        literals=("docker", "podman"),
        group=2,
    ),
    Rule(
        "bearer-token",
        re.compile(
            r"(?i)(\bauthorization\s*[:=]\s*[\"']?(?:bearer|token|basic)\s+)([A-Za-z0-9._~+/=\-]{8,})"
        ),
        assigned=("auth",),
        group=2,
    ),
    # NAME_KEY=value, "password": "value", secret: value ... in env files, configs, shell.
    Rule(
        "assignment",
        re.compile(
            r"(?i)(\b[A-Z0-9_.\-]*(?:api[_\-]?key|apikey|secret|passwd|password|pwd|token|"
            r"access[_\-]?key|private[_\-]?key|client[_\-]?secret|auth(?!or))[A-Z0-9_\-]*[\"']?"
            r"\s*(?::=|=|:)\s*[\"']?)([^\s\"',;}{)]{6,})"
        ),
        assigned=_ASSIGNED_WORDS,
        group=2,
        assigns=True,
    ),
    # DB_PASS=value, PASS=value, passphrase: value. The name must end in a whole "pass" part
    # (bypass=, compass:, pass_rate= are not passwords), and the value needs six characters.
    Rule(
        "pass-assignment",
        re.compile(
            r"(?i)(\b(?:[A-Z0-9]+[_.\-])*pass(?:phrase|wd|word)?[\"']?"
            r"\s*(?::=|=|:)\s*[\"']?)([^\s\"',;}{)]{6,})"
        ),
        assigned=("pass",),
        group=2,
        assigns=True,
    ),
)

# Values that are obviously placeholders are not secrets: keep them readable.
_PLACEHOLDER = re.compile(
    r"(?i)^(?:\$\{?[A-Z0-9_]+\}?|<[^>]*>|x{4,}|\*{3,}|changeme|example|your[_\-].*|"
    r"\[REDACTED:[a-z\-]+\]|none|null|true|false|redacted|placeholder|dummy|test|"
    r"os\.environ.*|env\(.*|process\.env.*|getenv.*|self\..*|config\..*|settings\..*)$"
)

# In the source of a programming language (``redact(text, code=True)``: the chunker's
# grammar languages), an unquoted assigned value that is code, not a literal: a call or
# an index on a lower-case name (``config("SECRET_KEY", cast=Secret)``, ``next(counter)``,
# ``shlex.split(env)``) or a path (``Token::Placeholder``; ``Token::Text(buf)`` reads as ``Token`` assigned
# ``:Text(buf``), and an unquoted lower-case word on the line after a name and ":"
# (``if ws.token:`` then ``return False``). A quoted value is a literal and is still judged; so
# is a plain or dotted name on the name's line. Elsewhere (env files, YAML, properties,
# shell) an unquoted value is a literal, whatever characters it holds
# (``PASSWORD=Summer(2023)!``), and may stand on the next line.
_CODE_CALL = re.compile(r"[a-z_][a-z_]*(?:\.[a-z_][A-Za-z_]*)*[(\[].*")
_CODE_PATH = re.compile(r":?(?:[A-Za-z_]+::)*[A-Za-z_]+(?:[(\[].*|\]*)")


def _is_code(value: str) -> bool:
    """Whether an unquoted value in source is code (_CODE_CALL: a call or an index on a
    lower-case dotted name without digits; _CODE_PATH: a ``::`` path of names without
    digits). A generated password holds digits or capitals where these have none."""
    if _CODE_CALL.fullmatch(value):
        return True
    return (value.startswith(":") or "::" in value) and _CODE_PATH.fullmatch(value) is not None


_QUOTES = ("'", '"')

# File names that are never read at all (code lane walker): dotenv files, key
# material, credential stores.
SECRET_FILE_PATTERNS: tuple[str, ...] = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "id_rsa",
    "id_rsa.*",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "*.ppk",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    "credentials",
    "credentials.json",
    "*.credentials",
    "secrets.*",
    "*.secret",
    "*.secrets",
    ".htpasswd",
    "*.kdbx",
)

# Names a pattern above matches that are source code, not stored secrets (the standard
# library's ``secrets.py``): such a file is read, and its text redacted like any other.
SOURCE_FILE_EXCEPTIONS: tuple[str, ...] = tuple(
    f"secrets.{ext}"
    for ext in (
        *("py", "pyi", "rb", "js", "mjs", "cjs", "jsx", "ts", "mts", "cts", "tsx", "go", "rs"),
        *("java", "kt", "scala", "cs", "c", "h", "cc", "cpp", "hpp", "php", "swift", "ex", "exs"),
    )
)


def redact_counted(text: str, code: bool = False, *, keep_lines: bool = False) -> tuple[str, int]:
    """Return ``text`` with every recognised secret replaced, and how many were. ``code``:
    the text is a programming language's source (_is_code). ``keep_lines``: a replaced
    secret that spans lines (a private key block) leaves its line breaks after the marker,
    so the text keeps its line count and every line after it its number."""
    if not text:
        return text, 0
    count = 0
    for rule in RULES:

        def _sub(m: re.Match[str], rule: Rule = rule) -> str:
            nonlocal count
            value = m.group(rule.group)
            if rule.group and _PLACEHOLDER.match(value):
                return m.group(0)
            if (
                code
                and rule.assigns
                and not m.group(1).endswith(_QUOTES)
                and (
                    ("\n" in m.group(1) and value.isalpha() and value.islower()) or _is_code(value)
                )
            ):
                return m.group(0)
            count += 1
            marker = f"[REDACTED:{rule.kind}]"
            if keep_lines:
                marker += "\n" * value.count("\n")
            if rule.group == 0:
                return marker
            start, end = m.span(rule.group)
            base = m.start(0)
            whole = m.group(0)
            return whole[: start - base] + marker + whole[end - base :]

        text = rule.pattern.sub(_sub, text)
    return text, count


def redact(text: str, code: bool = False) -> str:
    """Return ``text`` with every recognised secret replaced by ``[REDACTED:<kind>]``;
    ``code``: the text is a programming language's source (_is_code)."""
    return redact_counted(text, code)[0]


def looks_like_secret(value: str) -> bool:
    """True when ``value`` (a whole string, e.g. a config value) would be redacted."""
    return redact_counted(value)[1] > 0
