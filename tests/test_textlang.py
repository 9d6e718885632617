"""The shared language data: one stop-word list per language, the Snowball Russian stemmer."""

from __future__ import annotations

import ast
from pathlib import Path

from knowledge_server import textlang
from knowledge_server.textlang import STOP_WORDS, STOP_WORDS_EN, STOP_WORDS_RU, stem_ru

PACKAGE = Path(textlang.__file__).parent


def test_inflected_russian_forms_share_a_stem() -> None:
    assert {stem_ru(w) for w in ("чинил", "чинили", "чинила", "Чинили", "ЧИНИЛ")} == {"чин"}
    assert stem_ru("миграции") == stem_ru("миграция") == stem_ru("миграцию")
    assert stem_ru("ёлки") == stem_ru("елка")
    assert stem_ru("агент") == "агент"


def test_lists_are_per_language_and_lower_case() -> None:
    assert all(w.isascii() and w == w.lower() for w in STOP_WORDS_EN)
    assert not any(w.isascii() for w in STOP_WORDS_RU)
    assert all(w == w.lower() for w in STOP_WORDS_RU)
    assert STOP_WORDS == STOP_WORDS_EN | STOP_WORDS_RU
    assert {"the", "where", "кто", "ещё", "еще"} <= STOP_WORDS


def _string_collections(tree: ast.AST) -> list[tuple[int, list[str]]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            strings = [
                e.value
                for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            found.append((node.lineno, strings))
    return found


def test_no_module_keeps_its_own_stop_word_list() -> None:
    copies = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "textlang.py" or "_gen" in path.parts:
            continue
        for line, strings in _string_collections(ast.parse(path.read_text(encoding="utf-8"))):
            stop = [s for s in strings if s in STOP_WORDS]
            if len(stop) >= 5 and len(stop) * 2 >= len(strings):
                copies.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert copies == []


def test_the_scan_finds_a_copy() -> None:
    tree = ast.parse('_STOP = frozenset(["the", "and", "of", "to", "кто", "what", "foo"])')
    [(_, strings)] = _string_collections(tree)
    assert len([s for s in strings if s in STOP_WORDS]) == 6
