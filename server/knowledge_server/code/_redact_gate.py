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

# Literals of which every token-shaped rule needs at least one (checked on lower-cased
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

_rules = getattr(_redact_mod, "_RULES", None)
_ENABLED = _rules is not None and frozenset(r.kind for r in _rules) == _KNOWN_KINDS


def redact_text(text: str) -> str:
    if _ENABLED:
        low = text.lower()
        if not any(lit in low for lit in _LITERALS) and not (
            any(w in low for w in _WORDS) and _ASSIGN.search(low)
        ):
            return text
    return _redact_mod.redact(text)


_HOT = re.compile("|".join(re.escape(w) for w in _LITERALS + _WORDS))


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
    low = text.lower()
    if "private key" in low:
        return None
    positions = [m.start() for m in _HOT.finditer(low)]
    if not positions:
        return lines
    hot: set[int] = set()
    line_no = 0
    offset = 0
    it = iter(positions)
    pos = next(it, None)
    n = len(lines)
    while pos is not None and line_no < n:
        end = offset + len(lines[line_no])
        if pos <= end:
            hot.add(line_no)
            pos = next(it, None)
            continue
        offset = end + 1
        line_no += 1
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
        red = _redact_mod.redact(seg)
        if red == seg:
            continue
        parts = red.split("\n")
        if len(parts) != b - a + 1:
            return None
        out[a : b + 1] = parts
    return out
