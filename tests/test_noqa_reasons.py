"""Every ``noqa`` in hand-written code names its rule and says why.

ruff checks the half it can: PGH004 rejects a ``noqa`` without a rule code and RUF100 one
that suppresses nothing; the reason after the code is held here.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Generated code is regenerated, not edited; the same folders ruff leaves out.
_SKIP_PARTS = frozenset({"_gen", ".venv", "build", "node_modules", "__pycache__"})
_NOQA = re.compile(r"#\s*noqa\b", re.IGNORECASE)
# Well formed: one or more rule codes after "noqa:", then " - " and a reason.
_WELL_FORMED = re.compile(r"#\s*noqa: [A-Z]+[0-9]+(?:, [A-Z]+[0-9]+)* - \S")


def _hand_written() -> list[Path]:
    return sorted(
        p
        for p in REPO_ROOT.rglob("*.py")
        if not _SKIP_PARTS & set(p.relative_to(REPO_ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(REPO_ROOT).parts)
    )


def _bad_noqa(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each ``noqa`` comment without a rule code and a reason."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        m = _NOQA.search(tok.string)
        if m and not _WELL_FORMED.match(tok.string, m.start()):
            out.append((tok.start[0], tok.string))
    return out


def test_every_noqa_names_a_rule_and_a_reason() -> None:
    files = _hand_written()
    assert any(p.name == "app.py" for p in files)  # the scan does see the server
    bad = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {comment}"
        for path in files
        for line, comment in _bad_noqa(path.read_text(encoding="utf-8"))
    ]
    assert bad == []


def test_the_check_tells_a_reasoned_noqa_from_the_others() -> None:
    source = (
        "try:\n"
        "    pass\n"
        "except Exception:  # noqa: BLE001 - keeps serving\n"
        "    pass\n"
        "x = 1  # noqa\n"
        "y = 2  # noqa: E501\n"
        "z = 3  # NOQA:E501 - squeezed\n"
        "w = 4  # noqa: S105, S106 - two codes, one reason\n"
        's = "# noqa in a string is not a comment"\n'
    )
    assert [line for line, _ in _bad_noqa(source)] == [5, 6, 7]
