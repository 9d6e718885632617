"""The memory operations behind ``MemoryService``: the caller's scope from its principal,
request checks, safety (secrets refused, paths held to the caller's workspaces, output
redacted) and the protobuf answers. Plain Python over ``MemoryStore``; blocking (the
application runs each call in a thread)."""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import asdict, replace
from datetime import UTC, datetime

from google.protobuf.message import Message

from knowledge_server._gen.knowledge.v1 import memory_pb2, options_pb2
from knowledge_server.auth_model import Principal
from knowledge_server.errors import (
    InvalidRequest,
    PathOutsideScope,
    PermissionDenied,
    SecretRefused,
)
from knowledge_server.memory.policy import (
    SCHEMA_VERSION,
    STORES,
    MemoryPolicy,
    PolicyError,
    validate,
)
from knowledge_server.memory.store import (
    RELATION_ARROW,
    Cut,
    Entry,
    MemoryStore,
    Scope,
)
from knowledge_server.redact import looks_like_secret, redact
from knowledge_server.workspaces import is_under, normalise_workspace, really_in_scope

__all__ = ["READS", "WRITES", "MemoryOps", "memory_scope"]

MEMORY_SCHEMA = "knowledge.memory/v1"
POLICY_SCHEMA = "knowledge.policy/v1"
DEFAULT_CONFIDENCE = 0.7
DEFAULT_RESTORE = 10
ARCHIVED_IDS = 200

# Operation name -> whether it writes (writes are audited).
READS = ("recall", "timeline", "rooms", "relations", "policy")
WRITES = ("remember", "consolidate", "restore")

# An absolute path, or one from a home folder (``~/``, ``~user/``), inside a text (the path
# boundary check).
_PATH = re.compile(r"(?<![\w.~/-])((?:~[\w.-]*)?/[^\s'\"`,;()<>\[\]{}]+)")
OUTSIDE = "[PATH OUTSIDE WORKSPACE]"


def memory_scope(principal: Principal, requested: str) -> Scope:
    """Whose memory a request reads or writes: always the principal's organisation, and a
    workspace within the principal's (by string and by real path). Empty = the principal's
    only workspace; an unrestricted principal without one names the organisation's own
    memory (workspace "")."""
    if "\x00" in requested:
        raise InvalidRequest(
            "workspace: a path cannot contain a NUL character", metadata={"field": "workspace"}
        )
    allowed = (
        None
        if principal.workspaces is None
        else [normalise_workspace(w) for w in principal.workspaces]
    )
    if requested:
        ws = normalise_workspace(requested)
        if allowed is None or ws in allowed:
            return Scope(principal.organisation, ws)
        if not (any(is_under(ws, a) for a in allowed) and really_in_scope(ws, allowed)):
            raise PermissionDenied("workspace: outside the workspaces of this principal")
        return Scope(principal.organisation, _sub_workspace(ws, allowed))
    if allowed is None:
        return Scope(principal.organisation, "")
    if len(allowed) == 1:
        return Scope(principal.organisation, allowed[0])
    raise InvalidRequest(
        "workspace: this principal has several workspaces; name the one whose memory to use",
        metadata={"field": "workspace"},
    )


def _sub_workspace(ws: str, allowed: list[str]) -> str:
    """The memory of a folder inside one of ``allowed`` (the principal's workspaces): the
    folder must exist, and is named by where it really is (every link resolved) under the
    workspace that holds it. Each memory has its own capacity, so a made-up path would be
    a fresh store for every name, and two links to one folder two memories of it."""
    real = os.path.realpath(ws)
    holders = [a for a in allowed if is_under(real, os.path.realpath(a))]
    if not holders or not os.path.isdir(real):
        raise InvalidRequest(
            "workspace: a sub-workspace must be an existing directory inside this"
            " principal's workspace",
            metadata={"field": "workspace"},
        )
    # The innermost workspace holding it, so one folder has one name.
    root = max(holders, key=lambda a: len(os.path.realpath(a)))
    inside = os.path.relpath(real, os.path.realpath(root))
    return root if inside == "." else os.path.join(root, inside)


def check_rules(req: Message) -> None:
    """The required fields, accepted values and bounds the proto declares for a request's
    fields (``(knowledge.v1.rules)``; a zero or empty value means the default and passes,
    unless the field is required). A required text holding only spaces is empty: every
    operation trims the names it reads, as Remember trims what it stores."""
    for field in req.DESCRIPTOR.fields:
        options = field.GetOptions()
        if not options.HasExtension(options_pb2.rules):
            continue
        rules = options.Extensions[options_pb2.rules]
        value = getattr(req, field.name)
        if rules.required and isinstance(value, str) and not value.strip():
            raise InvalidRequest(f"{field.name}: required", metadata={"field": field.name})
        if rules.values and value and value not in rules.values:
            raise InvalidRequest(
                f"{field.name}: expected one of {', '.join(rules.values)}",
                metadata={"field": field.name},
            )
        if isinstance(value, int) and not isinstance(value, bool) and value:
            low = rules.minimum if rules.HasField("minimum") else None
            high = rules.maximum if rules.HasField("maximum") else None
            if (low is not None and value < low) or (high is not None and value > high):
                raise InvalidRequest(
                    f"{field.name}: must be within {'' if low is None else low}.."
                    f"{'' if high is None else high}",
                    metadata={"field": field.name},
                )


# The scheme of a URL that ends right before a match of _PATH ("https:" of "https://...").
_SCHEME_BEFORE = re.compile(r"[A-Za-z][\w+.-]*:$")


def _local_path(text: str, m: re.Match[str]) -> str | None:
    """The local path a match of ``_PATH`` names: itself, the path of a ``file://`` URL,
    or None for another URL (``https://host/...`` names no file here)."""
    path = m.group(1)
    scheme = _SCHEME_BEFORE.search(text, 0, m.start(1))
    if scheme is None or not path.startswith("//"):
        return path
    if scheme.group(0).lower() != "file:":
        return None
    rest = path[2:]
    return rest[rest.index("/") :] if "/" in rest else "/"


def _paths(text: str) -> list[str]:
    return [p for m in _PATH.finditer(text) if (p := _local_path(text, m)) is not None]


def _inside(path: str, roots: list[str]) -> bool:
    p = normalise_workspace(path)
    return any(is_under(p, r) for r in roots) and really_in_scope(p, roots)


# Line breaks and tabs a value may hold (a procedure's steps); a category or key is one line,
# and so is a relation's target (it becomes part of the edge's key).
_VALUE_SPACING = frozenset("\n\t")
# Format characters that change what a reader sees without being seen (zero-width, bidi
# overrides) are refused, but for two a value may need: the zero-width joiner between two
# emoji of one sequence, and the zero-width non-joiner between letters (Persian, Indic).
_JOINER, _NON_JOINER = "\u200d", "\u200c"


# Code point ranges of emoji a joiner may join (pictographs, arrows, geometric shapes,
# technical and miscellaneous symbols, dingbats; the emoji presentation selector).
_PICTOGRAPHS = (
    (0x1F000, 0x1FAFF),
    (0x2190, 0x21FF),
    (0x2300, 0x23FF),
    (0x2600, 0x27BF),
    (0x2B00, 0x2BFF),
    (0xFE0F, 0xFE0F),
)


def _pictograph(c: str) -> bool:
    o = ord(c)
    return any(lo <= o <= hi for lo, hi in _PICTOGRAPHS)


def _letter(c: str) -> bool:
    return unicodedata.category(c)[0] in "LM"


def _allowed_format(text: str, i: int) -> bool:
    """Whether the format character at ``text[i]`` is one a value may hold where it is."""
    c = text[i]
    before, after = text[i - 1 : i], text[i + 1 : i + 2]
    if not before or not after:
        return False
    if c == _JOINER:  # an emoji sequence, or a conjunct of an Indic script (Sinhala)
        return (_pictograph(before) and _pictograph(after)) or (_letter(before) and _letter(after))
    if c == _NON_JOINER:
        return _letter(before) and _letter(after)
    return False


def _check_characters(fields: dict[str, str], *, one_line_value: bool = False) -> None:
    """Control characters (an escape sequence that moves a terminal's cursor or hides text,
    a line break that starts a line of its own in what an agent reads, an invisible or
    text-reversing format character) are refused: memory text is shown to people and agents
    as it was written."""
    for name, text in fields.items():
        multi_line = name == "value" and not one_line_value
        allowed = _VALUE_SPACING if multi_line else frozenset()
        for i, c in enumerate(text):
            kind = unicodedata.category(c)
            bad = (
                (kind == "Cc" and c not in allowed)
                or (not multi_line and kind in ("Zl", "Zp"))
                or (kind == "Cf" and not (name == "value" and _allowed_format(text, i)))
            )
            if bad:
                what = (
                    "a line break"
                    if c in "\n\r\u2028\u2029"
                    else f"the invisible character U+{ord(c):04X}"
                    if kind == "Cf"
                    else f"control character {c!r}"
                )
                raise InvalidRequest(
                    f"{name}: cannot contain {what}"
                    + ("" if multi_line else f" (a {name} is one line)"),
                    metadata={"field": name},
                )


def _visible(text: str) -> str:
    """``text`` without its format characters: what the secret checks read (a joiner inside
    a token would otherwise hide it from them)."""
    if text.isprintable():
        return text
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


# A name that says its value is a credential: "password", "DB_PASSWORD", "dbPassword",
# "DBPassword", "passwords:", "root_pass", "pw", "db_passwort", "Kennwort", "SECRET_KEY",
# "api key", "githubToken", "GITHUB_PAT" (not "password policy", "secret store", "token
# refresh", "max_tokens"). Matched on the name with camelCase split into words,
# lower-cased.
_CREDENTIAL_WORD = (
    r"(?:pass(?:word|wd|phrase|wort)?s?|pwd|pw|kennw(?:ort|örter)|secrets?|secret[\s_-]?key"
    r"|token|(?:api|access|private|signing)[\s_-]?key|client[\s_-]?secret|credentials?"
    r"|(?:github|gitlab|personal)[\s_-]?(?:pat|access[\s_-]?token))"
)
_CREDENTIAL_NAME = re.compile(r"(?:^|[\s_.:/-])" + _CREDENTIAL_WORD + r"[\s:=]*$")
# A credential written out in a sentence ("admin password is Tr0ub4dor&3x", "the api key
# for prod is 9f8e...", "Passwort: geheim123", "password was set to ...", "password ->
# ..."): a credential's name (the words of ``_CREDENTIAL_WORD`` but "pass" and "pw", which
# prose uses otherwise: "tests pass: 12/12"), then a connector ("is", "was", "ist",
# "lautet", ":", "=", "->", "set to"), up to three short words between them ("for prod"),
# or the word right after the name with no connector; that word is judged as a named value
# is (``_credential_value``), so "the password is stored in the vault", "token is
# refreshed hourly" and "password policy: 12 characters" are facts.
_SENTENCE_NAME = (
    r"(?:pass(?:word|wd|phrase|wort)s?|pwd|kennw(?:ort|örter)|secrets?|secret[\s_-]?key"
    r"|token|(?:api|access|private|signing)[\s_-]?key|client[\s_-]?secret|credentials?"
    r"|(?:github|gitlab|personal)[\s_-]?(?:pat|access[\s_-]?token))"
)
_CONNECTOR = (
    r"(?:[:=]|->|=>|(?:(?:is|was|war)\s+)?set\s+to|(?:is|was|ist|lautet|war|wurde)(?:\s*:)?)"
)
_CREDENTIAL_IN_TEXT = re.compile(
    r"(?<![\w-])(?P<name>" + _SENTENCE_NAME + r")(?![\w-])"
    r"(?:(?:\s+[^\W\d_]{1,12}){0,3}?\s*" + _CONNECTOR + r"\s*|\s+)(?P<value>\S+)",
    re.IGNORECASE,
)
# A URL without a user part names where something is ("the token endpoint is https://...").
_PLAIN_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s@]+", re.IGNORECASE)
# "PAT" alone, in capitals (a name like "Pat" is a person).
_PAT = re.compile(r"(?:^|[\s_.:/-])PAT[\s:=]*$")
# A PIN: a name ending in "pin" or "pin code" with four to twelve digits.
_PIN_NAME = re.compile(r"(?:^|[\s_.:/-])pin(?:[\s_-]?code)?[\s:=]*$")
# Names whose credentials may be digits only (a numeric password).
_PASSWORD_NAME = re.compile(r"(?:pass(?:word|wd|phrase|wort)?|pwd|pw|kennwort)s?[\s:=]*$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# Values that say where a credential is, not what it is. Each must match the whole value
# (a password that only starts like a path is still a password); none nests repetitions,
# so a long value costs linear time.
_PATH_VALUE = re.compile(r"(?:~[\w.-]*|\.{1,2})?/[\w./-]+")
_VARIABLE = re.compile(r"\$\{?[A-Z_][A-Z0-9_]*\}?|%[A-Za-z_]\w*%")
_SCHEME_REFERENCE = re.compile(
    r"(?:vault|op|ssm|kms|gcp|azure|keychain|keyring|env|secretsmanager)"
    r":(?://)?[\w.-]+(?:/[\w.-]+)+|arn:aws:[\w-]+:[\w-]*:\d*:[\w/+=,.@-]+"
)
_MANAGER_NAME = re.compile(r"[A-Za-z]+(?:[-_ ][A-Za-z]+)*")
_MANAGER_WORDS = ("vault", "secret", "keychain", "keyring", "1password", "bitwarden", "lastpass")
_VERSION = re.compile(r"[=<>~^!]{0,3}v?\d+(?:\.\d+){1,3}(?:[-+][0-9A-Za-z.]{1,20})?")
_LONGEST_REFERENCE = 300


def _reference(v: str) -> bool:
    """Whether ``v`` (one word) is where a credential is kept or not one at all: a path, an
    environment variable, a secret manager's reference or name, a version."""
    if len(v) > _LONGEST_REFERENCE:
        return False
    return bool(
        _PATH_VALUE.fullmatch(v)
        or _VARIABLE.fullmatch(v)
        or _SCHEME_REFERENCE.fullmatch(v)
        or _VERSION.fullmatch(v)
        or (_MANAGER_NAME.fullmatch(v) and any(w in v.lower() for w in _MANAGER_WORDS))
    )


def _secret_pair(name: str, value: str) -> bool:
    """Whether ``name`` names ``value`` as a credential (see ``_names_a_secret``)."""
    words = _CAMEL.sub(" ", name.strip())
    lower = words.lower()
    v = _visible(value).strip()
    if _PIN_NAME.search(lower):
        return v.isdigit() and 4 <= len(v) <= 12
    if not (_CREDENTIAL_NAME.search(lower) or _PAT.search(words)):
        return False
    return _credential_value(lower, v)


def _credential_value(lower_name: str, v: str) -> bool:
    """Whether ``v`` reads as the credential a name (lower case) names: one word of six or
    more characters with a digit or a symbol, or of sixteen or more, that is not where a
    credential is kept; digits alone only under a password's name."""
    if len(v) < 6 or any(c.isspace() for c in v) or _reference(v):
        return False
    if v.isdigit():  # a count, a number: a credential only under a password's name
        return bool(_PASSWORD_NAME.search(lower_name))
    return len(v) >= 16 or any(not c.isalpha() for c in v)


def _told(m: re.Match[str]) -> str:
    """The credential a ``_CREDENTIAL_IN_TEXT`` match writes out ("" when its word reads
    as no credential); the word's closing punctuation is not part of it. A word that ends
    in ":" is a label ("policy:"), a hyphenated word of letters is prose ("reset-links"),
    and a URL without a user part is an address."""
    raw = m.group("value")
    word = raw.rstrip(".,;:!?)]}\"'")
    if not word or raw.endswith(":") or raw.startswith("[REDACTED") or _PLAIN_URL.fullmatch(word):
        return ""
    if all(part.isalpha() for part in word.split("-")):
        return ""
    return word if _credential_value(m.group("name").lower(), word) else ""


def _tells_a_secret(text: str) -> bool:
    """Whether ``text`` writes a credential out after its name ("the admin password is
    Tr0ub4dor&3x")."""
    return any(_told(m) for m in _CREDENTIAL_IN_TEXT.finditer(_visible(text)))


def _without_told_secrets(text: str) -> str:
    """``text`` with each credential it writes out after its name as ``_HIDDEN``: an
    entry stored before such writes were refused is shown without it."""

    def hide(m: re.Match[str]) -> str:
        word = _told(m)
        if not word:
            return m.group(0)
        start = m.start("value") - m.start(0)
        return m.group(0)[:start] + _HIDDEN + m.group(0)[start + len(word) :]

    return _CREDENTIAL_IN_TEXT.sub(hide, text)


def _names_a_secret(names: tuple[str, ...], value: str) -> bool:
    """Whether an entry is a secret split over its name and its value: a category, key or
    relation source that names a credential, with a value that reads as one: one word of
    six or more characters with a digit or a symbol in it, or of sixteen or more, that is
    not a path, a variable, a secret manager's reference or name or a version ("password"
    = "Tr0ub4dor&3"; "password" = "in the team vault" is where it is kept, and fine); or a
    PIN's four to twelve digits. The redactor's assignment rule is not used here: it reads
    "token" in "tokenizer" and "auth" in "auth = oauth2", which are facts, not secrets."""
    return any(_secret_pair(n, value) for n in names if n.strip())


def _relation_source(e: Entry) -> str:
    suffix = RELATION_ARROW + e.value
    return e.key[: -len(suffix)] if e.key.endswith(suffix) else e.key


_HIDDEN = "[REDACTED:credential]"


def _ts(text: str, target: object) -> None:
    target.FromDatetime(datetime.fromisoformat(text.replace("Z", "+00:00")))  # type: ignore[attr-defined]


class MemoryOps:
    """The operations over one store; ``policy`` is the one the store runs with."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.policy = store.policy

    # -- safety ---------------------------------------------------------------------------
    @staticmethod
    def _roots(principal: Principal, scope: Scope) -> list[str] | None:
        """Roots paths in memory may name: the memory's workspace for a scoped principal;
        None (any) for an unrestricted one."""
        if principal.workspaces is None:
            return None
        return [scope.workspace]

    def _check_input(self, principal: Principal, scope: Scope, fields: dict[str, str]) -> None:
        # An entry is a name and a value: "password" = "Tr0ub4dor&3" is a secret though
        # neither half is one alone (the category and the key both name the value).
        names = (fields.get("category", ""), fields.get("key", ""))
        if _names_a_secret(names, fields.get("value", "")):
            raise SecretRefused(
                "value: reads as the credential its category or key names; memory never"
                " stores secrets: leave the secret out and describe where it is kept",
                metadata={"field": "value"},
            )
        for name, text in fields.items():
            if text and (looks_like_secret(_visible(text)) or _tells_a_secret(text)):
                raise SecretRefused(
                    f"{name}: looks like a secret (a key, token or password); memory never"
                    " stores secrets: leave the secret out and describe where it is kept",
                    metadata={"field": name},
                )
        roots = self._roots(principal, scope)
        if roots is None:
            return
        for name, text in fields.items():
            for path in _paths(text):
                if not _inside(os.path.expanduser(path), roots):
                    raise PathOutsideScope(
                        f"{name}: names a path outside this workspace ({scope.workspace});"
                        " memory holds paths of its own workspace only",
                        metadata={"field": name},
                    )

    def _out(self, text: str, roots: list[str] | None) -> str:
        """Output boundary: redacted, and paths outside the caller's workspace masked
        (a policy or token change may narrow what a caller sees after the write). A text
        whose format characters hide a secret from the redactor loses them."""
        visible = _visible(text)
        text = redact(visible) if redact(visible) != visible else redact(text)
        if _tells_a_secret(text):  # read without format characters, as the write checks
            text = _without_told_secrets(_visible(text))
        if roots is None:
            return text
        shown = text

        def mask(m: re.Match[str]) -> str:
            path = _local_path(shown, m)
            if path is None or _inside(os.path.expanduser(path), roots):
                return m.group(1)
            return OUTSIDE

        return _PATH.sub(mask, text)

    def _entry(self, e: Entry, scope: Scope, roots: list[str] | None) -> memory_pb2.MemoryEntry:
        # An entry stored before writes were checked for secrets split over name and value.
        source = _relation_source(e) if e.store == "relations" else e.key
        hidden = _names_a_secret((e.category, source), e.value)
        key = f"{source}{RELATION_ARROW}{_HIDDEN}" if hidden and source != e.key else e.key
        out = memory_pb2.MemoryEntry(
            id=e.evidence_id,
            store=e.store,
            category=self._out(e.category, roots),
            key=self._out(key, roots),
            value=_HIDDEN if hidden else self._out(e.value, roots),
            confidence=e.confidence,
            confirmations=e.confirmations,
            supersedes=f"mem:{e.supersedes}" if e.supersedes is not None else "",
            current=e.current,
            workspace=scope.workspace,
        )
        _ts(e.created_at, out.created_at)
        _ts(e.updated_at, out.updated_at)
        _ts(e.valid_from, out.valid_from)
        if e.valid_until is not None:
            _ts(e.valid_until, out.valid_until)
        return out

    @staticmethod
    def _cut(cut: Cut, returned: int) -> memory_pb2.Truncation:
        return memory_pb2.Truncation(
            total=cut.total,
            returned=returned,
            omitted=cut.total - returned,
            limit_name=cut.limit_name,
            limit=cut.limit,
            omitted_ids=list(cut.omitted_ids),
        )

    # -- operations -----------------------------------------------------------------------
    def run(self, op: str, req: Message, principal: Principal) -> tuple[Message, list[str]]:
        """Answer ``op``; also the ids a write touched (for its audit event)."""
        check_rules(req)
        if op == "policy":
            return self.policy_answer(req), []  # type: ignore[arg-type]
        scope = memory_scope(principal, getattr(req, "workspace", ""))
        roots = self._roots(principal, scope)
        handler = getattr(self, f"_{op}")
        return handler(req, principal, scope, roots)  # type: ignore[no-any-return]

    def _remember(
        self,
        req: memory_pb2.RememberRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        store = req.store or "facts"
        category, key, value = req.category.strip(), req.key.strip(), req.value.strip()
        if not category:
            raise InvalidRequest("category: required", metadata={"field": "category"})
        if not value:
            raise InvalidRequest("value: required", metadata={"field": "value"})
        if not key:
            if store != "history":
                raise InvalidRequest(
                    "key: required (only history entries may leave it empty)",
                    metadata={"field": "key"},
                )
            key = datetime.now(UTC).strftime("h-%Y%m%dT%H%M%S.%fZ")
        confidence = req.confidence or DEFAULT_CONFIDENCE
        if not 0.0 < confidence <= 1.0:
            raise InvalidRequest(
                "confidence: must be within (0, 1]", metadata={"field": "confidence"}
            )
        _check_characters(
            {"category": category, "key": key, "value": value},
            one_line_value=store == "relations",
        )
        self._check_input(principal, scope, {"category": category, "key": key, "value": value})
        if store == "relations":
            if RELATION_ARROW.strip() in key or RELATION_ARROW.strip() in value:
                raise InvalidRequest(
                    f"key: a relation's source and target cannot contain {RELATION_ARROW.strip()!r}",
                    metadata={"field": "key"},
                )
            key = f"{key}{RELATION_ARROW}{value}"
        written = self.store.remember(scope, store, category, key, value, confidence)
        resp = memory_pb2.RememberResponse(
            schema=MEMORY_SCHEMA,
            outcome=written.outcome,
            reclaimed=written.reclaimed,
        )
        resp.entry.CopyFrom(self._entry(written.entry, scope, roots))
        targets = [written.entry.evidence_id]
        if written.contradiction is not None:
            resp.contradiction.severity = written.contradiction.severity
            resp.contradiction.previous.CopyFrom(
                self._entry(written.contradiction.previous, scope, roots)
            )
            targets.append(written.contradiction.previous.evidence_id)
        targets.extend(f"mem:{i}" for i in written.archived_ids)
        return resp, targets

    def _recall(
        self,
        req: memory_pb2.RecallRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        result = self.store.recall(
            scope, req.store or "facts", req.query, category=req.category.strip(), limit=req.limit
        )
        resp = memory_pb2.RecallResponse(schema=MEMORY_SCHEMA)
        resp.entries.extend(self._entry(e, scope, roots) for e in result.entries)
        resp.truncation.CopyFrom(self._cut(result.cut, len(result.entries)))
        return resp, []

    def _timeline(
        self,
        req: memory_pb2.TimelineRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        versions, cut, archived = self.store.timeline(
            scope, req.store or "facts", req.category.strip(), req.key.strip(), limit=req.limit
        )
        resp = memory_pb2.TimelineResponse(schema=MEMORY_SCHEMA, archived_versions=archived)
        resp.versions.extend(self._entry(e, scope, roots) for e in versions)
        resp.truncation.CopyFrom(self._cut(cut, len(versions)))
        return resp, []

    def _rooms(
        self,
        req: memory_pb2.RoomsRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        rooms, cut = self.store.rooms(scope, req.store or "facts", limit=req.limit)
        resp = memory_pb2.RoomsResponse(schema=MEMORY_SCHEMA)
        for category, n, updated in rooms:
            room = resp.rooms.add(category=self._out(category, roots), entries=n)
            _ts(updated, room.updated_at)
        # The rooms left out are named by their categories: text, through the same boundary.
        left_out = tuple(self._out(c, roots) for c in cut.omitted_ids)
        resp.truncation.CopyFrom(self._cut(replace(cut, omitted_ids=left_out), len(rooms)))
        return resp, []

    def _relations(
        self,
        req: memory_pb2.RelationsRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        edges, cut = self.store.relations(scope, req.ref.strip(), limit=req.limit)
        resp = memory_pb2.RelationsResponse(schema=MEMORY_SCHEMA)
        for e in edges:
            source = _relation_source(e)
            hidden = _names_a_secret((e.category, source), e.value)
            resp.edges.add(
                id=e.evidence_id,
                kind=self._out(e.category, roots),
                source=self._out(source, roots),
                target=_HIDDEN if hidden else self._out(e.value, roots),
                confidence=e.confidence,
                confirmations=e.confirmations,
            )
        resp.truncation.CopyFrom(self._cut(cut, len(edges)))
        return resp, []

    def policy_answer(self, req: memory_pb2.PolicyRequest) -> memory_pb2.PolicyResponse:
        problems: list[str] = []
        try:
            validate(self.policy, "the server's configuration")
        except PolicyError as exc:
            problems.append(str(exc))
        resp = memory_pb2.PolicyResponse(
            schema=POLICY_SCHEMA, schema_version=SCHEMA_VERSION, valid=not problems
        )
        resp.problems.extend(problems)
        resp.policy.CopyFrom(policy_message(self.policy))
        return resp

    def _consolidate(
        self,
        req: memory_pb2.ConsolidateRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        stores = list(STORES) if req.all else ["facts"]
        report = self.store.consolidate(scope, stores, dry_run=req.dry_run)
        ids = [f"mem:{i}" for i in report.archived_ids]
        resp = memory_pb2.ConsolidateResponse(
            schema=MEMORY_SCHEMA,
            dry_run=report.dry_run,
            stores=stores,
            decayed=report.decayed,
            merged=report.merged,
            compacted=report.compacted,
            archived_ids=ids[:ARCHIVED_IDS],
        )
        return resp, [] if req.dry_run else ids

    def _restore(
        self,
        req: memory_pb2.RestoreRequest,
        principal: Principal,
        scope: Scope,
        roots: list[str] | None,
    ) -> tuple[Message, list[str]]:
        report = self.store.restore(
            scope, req.store or "facts", req.query, req.limit or DEFAULT_RESTORE
        )
        resp = memory_pb2.RestoreResponse(
            schema=MEMORY_SCHEMA,
            as_history=report.as_history,
            already_live=report.already_live,
            reclaimed=report.reclaimed,
        )
        resp.restored.extend(self._entry(e, scope, roots) for e in report.restored)
        return resp, [e.evidence_id for e in report.restored] + [
            f"mem:{i}" for i in report.archived_ids
        ]


def policy_message(policy: MemoryPolicy) -> memory_pb2.MemoryPolicy:
    return memory_pb2.MemoryPolicy(**asdict(policy))
