"""A cheap pre-check in front of :func:`knowledge_server.redact.redact`.

Running every redaction rule over every chunk dominated indexing time. Each rule
can only match text that contains one of a few literals (a key word such as
``token`` or a prefix such as ``AKIA``), so a single case-insensitive scan for
those literals decides whether the full rule set must run. ``redact`` stays the
only authority: when its rule set is not the one this gate was written against,
the gate switches itself off and every text goes through ``redact``.
"""

from __future__ import annotations

import re

from knowledge_server import redact as _redact_mod

_KNOWN_KINDS = frozenset(
    {
        "private-key",
        "aws-access-key",
        "aws-secret-key",
        "github-token",
        "gitlab-token",
        "slack-token",
        "openai-key",
        "google-api-key",
        "stripe-key",
        "jwt",
        "url-password",
        "bearer-token",
        "assignment",
    }
)

# Literals of which every token-shaped rule needs at least one (checked on case-folded
# text with `in`, which is far cheaper than a regex alternation).
_LITERALS = (
    "private key",
    "akia",
    "asia",
    "agpa",
    "aida",
    "aroa",
    "anpa",
    "anva",
    "aipa",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xox",
    "sk-",
    "aiza",
    "_live_",
    "_test_",
    "eyj",
    "://",
)
# The assignment-shaped rules (assignment, aws-secret-key, bearer-token) need one of
# these words followed by an assignment operator.
_WORDS = ("key", "secret", "passw", "pwd", "token", "auth")
_ASSIGN = re.compile(r"(?:key|secret|passw|pwd|token|auth)[a-z0-9_\-]*[\"']?\s*[:=]")
# The same shape on text that is not lower-cased, folding case exactly as the rules'
# ``(?i)`` does (lower-casing is not the same: "İ" becomes two characters, "ſ" stays).
_ASSIGN_ANY_CASE = re.compile(_ASSIGN.pattern, re.IGNORECASE)

_rules = getattr(_redact_mod, "_RULES", None)
_ENABLED = _rules is not None and frozenset(r.kind for r in _rules) == _KNOWN_KINDS


def _may_hold_secret(text: str) -> bool:
    """False when no rule can match ``text``.

    Case-folded, every literal and key word a rule matches turns into the gate's own
    spelling ("ſecret" into "secret"); the assignment shape is then checked on the
    text itself with the same case folding as the rules' ``(?i)``, because lower-casing
    changes some letters a rule still matches ("tokenİ = ..." would slip through).
    """
    folded = text.casefold()
    if any(lit in folded for lit in _LITERALS):
        return True
    return any(w in folded for w in _WORDS) and _ASSIGN_ANY_CASE.search(text) is not None


def redact_text(text: str) -> str:
    if _ENABLED and not _may_hold_secret(text):
        return text
    return _redact_mod.redact(text)


def _by_first_char(literals: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """One pattern per first character. A pattern with a literal first character lets
    ``re`` jump between occurrences of that character, where a single alternation of
    all literals attempts a match at nearly every position (three times slower)."""
    groups: dict[str, list[str]] = {}
    for lit in literals:
        groups.setdefault(lit[0], []).append(lit)
    return tuple(re.compile("|".join(map(re.escape, g))) for g in groups.values())


_HOT = _by_first_char(_LITERALS + _WORDS)


def redact_lines(lines: list[str]) -> list[str] | None:
    """Redact a file given as lines, keeping the line count.

    Only lines holding one of the gate literals (plus the lines up to the next
    non-blank one, where a value may follow ``key =`` across a line break) go
    through ``redact``: every rule's match starts on such a line. Returns None when a
    replacement would change the line count (a multi-line private key), so the
    caller can redact its chunks one by one instead.
    """
    if not _ENABLED:
        return None
    text = "\n".join(lines)
    folded = text.casefold()
    if "private key" in folded:
        return None
    positions = sorted({m.start() for pattern in _HOT for m in pattern.finditer(folded)})
    if not positions:
        return lines
    # Line numbers are counted on ``folded`` itself: case folding keeps every newline
    # but may change the length of a line ("İ" becomes two characters).
    hot: set[int] = set()
    line_no = 0
    offset = 0
    for pos in positions:
        line_no += folded.count("\n", offset, pos)
        offset = pos
        hot.add(line_no)
    n = len(lines)
    out = list(lines)
    segments: list[tuple[int, int]] = []
    for i in sorted(hot):
        j = i + 1
        while j < n and j - i < 20 and not lines[j].strip():
            j += 1
        j = min(j, n - 1)
        if segments and i <= segments[-1][1] + 1:
            segments[-1] = (segments[-1][0], max(segments[-1][1], j))
        else:
            segments.append((i, j))
    for a, b in segments:
        seg = "\n".join(lines[a : b + 1])
        if not _may_hold_secret(seg):  # e.g. a key word that is not assigned: "for key in d"
            continue
        red = _redact_mod.redact(seg)
        if red == seg:
            continue
        parts = red.split("\n")
        if len(parts) != b - a + 1:
            return None
        out[a : b + 1] = parts
    return out
