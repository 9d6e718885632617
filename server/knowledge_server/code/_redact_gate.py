"""A cheap pre-check in front of :func:`knowledge_server.redact.redact`.

Running every redaction rule over every chunk dominated indexing time. Each rule
declares the literals (a prefix such as ``AKIA``) or the assigned key words (``token =``)
that every one of its matches contains, so a single case-insensitive scan for those
decides whether the full rule set must run. The scan is built from the rules' own
declarations: a new rule is covered as soon as it exists (``Rule`` refuses one that
declares nothing), and ``redact`` stays the only authority on what a secret is.
"""

from __future__ import annotations

import re

from knowledge_server.redact import RULES, redact, redact_counted

# Checked on case-folded text with `in`, which is far cheaper than a regex alternation.
_LITERALS = tuple(dict.fromkeys(lit for rule in RULES for lit in rule.literals))
_WORDS = tuple(dict.fromkeys(word for rule in RULES for word in rule.assigned))


def _assigned_shape(words: tuple[str, ...]) -> re.Pattern[str]:
    """A key word, the rest of its name, then an assignment operator, folding case exactly
    as the rules' ``(?i)`` does (lower-casing is not the same: "İ" becomes two characters,
    "ſ" stays)."""
    return re.compile(
        "(?:" + "|".join(map(re.escape, words)) + r")[a-z0-9_\-]*[\"']?\s*[:=]", re.IGNORECASE
    )


_ASSIGN_ANY_CASE = _assigned_shape(_WORDS)
# Literals of the rules whose match may span lines (a private key block).
_SPANNING = tuple(lit for rule in RULES if rule.multiline for lit in rule.literals)


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


def redact_text(text: str, code: bool = False) -> str:
    if not _may_hold_secret(text):
        return text
    return redact(text, code)


def _by_first_char(literals: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    """One pattern per first character. A pattern with a literal first character lets
    ``re`` jump between occurrences of that character, where a single alternation of
    all literals attempts a match at nearly every position."""
    groups: dict[str, list[str]] = {}
    for lit in literals:
        groups.setdefault(lit[0], []).append(lit)
    return tuple(re.compile("|".join(map(re.escape, g))) for g in groups.values())


_HOT = _by_first_char(_LITERALS + _WORDS)
# A line that cannot hold a value: blank, or only the assignment between a key and its
# value (``key``, ``=``, ``value`` on three lines is still one assignment to ``redact``).
_NO_VALUE = re.compile(r"[\s\"':=]*\Z")


def redact_lines(lines: list[str], code: bool = False) -> list[str]:
    """Redact a file given as lines, keeping the line count.

    Only lines holding one of the gate literals (plus the lines up to the next one
    holding more than blanks, quotes and ``=`` or ``:``, where a value may follow
    ``key`` and ``=`` across line breaks) go
    through ``redact``: every rule's match starts on such a line. A file that may hold a
    secret spanning lines (a private key block) is redacted whole, each replaced block
    leaving its line breaks: redacting chunk by chunk would miss the part of a block in a
    chunk that starts after its ``BEGIN`` line.
    """
    text = "\n".join(lines)
    folded = text.casefold()
    if any(lit in folded for lit in _SPANNING):
        return redact_counted(text, code, keep_lines=True)[0].split("\n")
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
        while j < n and j - i < 20 and _NO_VALUE.match(lines[j]):
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
        red = redact_counted(seg, code, keep_lines=True)[0]
        if red != seg:
            out[a : b + 1] = red.split("\n")
    return out
