"""Deterministic routing (seed 000 §6): cue words -> intent -> lane weights.

No LLM. The table holds the seed's Russian cue words, their English equivalents
and Chinese ones where natural. A question that matches several intents is routed
to the strongest, keeps every lane, and gets a lower confidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WEIGHTS: dict[str, dict[str, float]] = {
    "find_agent": {"episodes": 1.0, "skills": 0.6, "code": 0.4},
    "find_code": {"code": 1.0, "episodes": 0.3, "skills": 0.2},
    "find_skill": {"skills": 1.0, "episodes": 0.5, "code": 0.2},
    "find_knowledge": {"episodes": 0.8, "code": 0.8, "skills": 0.4},
}

# Stems: matched at the start of a word, so "чинил" matches "чинила", "where" not "somewhere".
CUES: dict[str, tuple[str, ...]] = {
    "find_agent": (
        "кто",
        "когда",
        "почему",
        "решал",
        "делал",
        "сесси",
        "агент",
        "who",
        "when",
        "why",
        "solved",
        "fixed",
        "did",
        "session",
        "agent",
        "subagent",
        "谁",
        "何时",
        "什么时候",
        "为什么",
        "会话",
        "代理",
    ),
    "find_code": (
        "где",
        "функци",
        "класс",
        "символ",
        "вызыва",
        "затрон",
        "impact",
        "схем",
        "таблиц",
        "маршрут",
        "политик",
        "where",
        "function",
        "class",
        "symbol",
        "calls",
        "caller",
        "affect",
        "schema",
        "table",
        "route",
        "policy",
        "method",
        "defined",
        "implementation",
        "哪里",
        "在哪",
        "函数",
        "类",
        "符号",
        "调用",
        "影响",
        "表",
        "路由",
        "策略",
    ),
    "find_skill": (
        "навык",
        "skill",
        "whentouse",
        "применял",
        "инструкци",
        "skills",
        "instruction",
        "playbook",
        "how to use",
        "技能",
        "指令",
        "说明",
    ),
}

_WORD = re.compile(r"\w+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclass(frozen=True)
class Route:
    intent: str
    lanes: tuple[str, ...]
    weights: dict[str, float]
    confidence: float
    level: str
    reason: str


def _compile_cues() -> list[tuple[str, list[tuple[str, int]], tuple[int, ...]]]:
    """Per intent: its cues in order, each with how it matches (CJK substring, phrase
    substring, whole word, word prefix), and the prefix lengths in use."""
    out = []
    for intent, cues in CUES.items():
        kinds = []
        for cue in cues:
            if _CJK.search(cue):
                kinds.append((cue, 0))
            elif " " in cue:
                kinds.append((cue, 1))
            elif len(cue) >= 4:
                kinds.append((cue, 3))
            else:
                kinds.append((cue, 2))
        lengths = tuple(sorted({len(c) for c, k in kinds if k == 3}))
        out.append((intent, kinds, lengths))
    return out


_COMPILED = _compile_cues()


def _matches(query: str) -> dict[str, list[str]]:
    words = {w.lower() for w in _WORD.findall(query)}
    lowered = query.lower()
    found: dict[str, list[str]] = {}
    for intent, kinds, lengths in _COMPILED:
        # A cue of 4+ letters matches a word it begins (stems: "fix" words, "чин..." forms).
        prefixes = {w[:n] for w in words for n in lengths if len(w) >= n}
        hits = []
        for cue, kind in kinds:
            if kind == 0:
                hit = cue in query
            elif kind == 1:
                hit = cue in lowered
            elif kind == 2:
                hit = cue in words
            else:
                hit = cue in prefixes
            if hit:
                hits.append(cue)
        if hits:
            found[intent] = hits
    # "навык"/"skill" is a find_skill cue first: do not count it for find_agent as well.
    return found


def route(query: str, mode: str, include: tuple[str, ...]) -> Route:
    if mode in ("docs", "themes"):
        weights = {lane: w for lane, w in WEIGHTS["find_code"].items() if lane in include}
        lanes = tuple(sorted(weights, key=lambda lane: -weights[lane]))
        return Route(
            "find_code",
            lanes,
            weights,
            1.0,
            "high",
            f"mode={mode} set by the caller: documents of the code lane, matched through the document graph's entities and themes when it is built",
        )
    if mode in WEIGHTS:
        weights = {lane: w for lane, w in WEIGHTS[mode].items() if lane in include}
        lanes = tuple(sorted(weights, key=lambda lane: -weights[lane]))
        return Route(mode, lanes, weights, 1.0, "high", f"mode={mode} set by the caller")
    found = _matches(query)
    if not found:
        intent, confidence, reason = (
            "find_knowledge",
            0.5,
            "no cue words; all lanes with balanced weights",
        )
    else:
        ranked = sorted(found.items(), key=lambda kv: (-len(kv[1]), list(WEIGHTS).index(kv[0])))
        intent = ranked[0][0]
        cues = ", ".join(f"«{c}»" for c in ranked[0][1][:3])
        if len(ranked) == 1:
            confidence = 0.86 if len(ranked[0][1]) > 1 else 0.75
            reason = f"cue words {cues} -> {intent}"
        else:
            confidence = 0.55
            others = ", ".join(k for k, _ in ranked[1:])
            reason = f"mixed question: {cues} -> {intent}, also cues for {others}; every lane kept"
    weights = {lane: w for lane, w in WEIGHTS[intent].items() if lane in include}
    lanes = tuple(sorted(weights, key=lambda lane: -weights[lane]))
    level = "high" if confidence >= 0.8 else "medium" if confidence >= 0.6 else "low"
    return Route(intent, lanes, weights, confidence, level, reason)
