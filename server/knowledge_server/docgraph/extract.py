"""LLM extraction of entities and relations from one chunk, with strict validation and a cache.

No mention, no fact: an entity is accepted only when its mention is found in the chunk text
(case-insensitive exact substring) and its name occurs there too; a relation only between two
accepted entities and with an evidence quote found in the text. Everything rejected is counted.

The cache stores the *validated* result as names, kinds and offsets, never the quotes, so the
database does not become a second copy of the corpus.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..redact import redact
from .llm import LLMClient
from .model import ENTITY_KINDS, RELATION_KINDS, DocChunk, norm_name
from .prompts import PROMPT_VERSION, extraction_messages

__all__ = [
    "ChunkResult",
    "ExtractionSettings",
    "MentionFact",
    "RelationFact",
    "extract_chunk",
    "extraction_cache_key",
    "unfence",
    "validate_extraction",
]


@dataclass(frozen=True, slots=True)
class ExtractionSettings:
    """Settings that change what extraction produces; all of them enter the cache key."""

    max_entities_per_chunk: int = 32
    max_relations_per_chunk: int = 32
    min_name_chars: int = 2
    max_name_chars: int = 120
    max_prompt_chars: int = 16_000  # longer chunk texts are cut for the prompt (cost bound)


@dataclass(frozen=True, slots=True)
class MentionFact:
    """An entity seen at ``chunk.text[char_start:char_end]``."""

    name: str
    kind: str
    chunk_id: str
    char_start: int
    char_end: int
    built_by: str


@dataclass(frozen=True, slots=True)
class RelationFact:
    """A relation whose evidence is ``chunk.text[char_start:char_end]``."""

    src_name: str
    src_kind: str
    dst_name: str
    dst_kind: str
    kind: str
    chunk_id: str
    char_start: int
    char_end: int
    built_by: str


@dataclass(slots=True)
class ChunkResult:
    mentions: list[MentionFact] = field(default_factory=list)
    relations: list[RelationFact] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)

    def to_cache_json(self) -> str:
        # Names, kinds and offsets only: quotes are re-derivable from the chunk text.
        return json.dumps(
            {
                "entities": [[m.name, m.kind, m.char_start, m.char_end] for m in self.mentions],
                "relations": [
                    [
                        r.src_name,
                        r.src_kind,
                        r.dst_name,
                        r.dst_kind,
                        r.kind,
                        r.char_start,
                        r.char_end,
                    ]
                    for r in self.relations
                ],
                "counters": dict(sorted(self.counters.items())),
            },
            sort_keys=True,
            ensure_ascii=False,
        )

    @classmethod
    def from_cache_json(cls, chunk: DocChunk, data: str) -> ChunkResult:
        obj = json.loads(data)
        res = cls(counters=Counter(obj.get("counters", {})))
        for name, kind, cs, ce in obj["entities"]:
            res.mentions.append(MentionFact(name, kind, chunk.chunk_id, cs, ce, "llm"))
        for sn, sk, dn, dk, kind, cs, ce in obj["relations"]:
            res.relations.append(RelationFact(sn, sk, dn, dk, kind, chunk.chunk_id, cs, ce, "llm"))
        return res


def extraction_cache_key(
    chunk: DocChunk, model_identity: str, temperature: float, settings: ExtractionSettings
) -> str:
    material = json.dumps(
        [chunk.content_hash, model_identity, PROMPT_VERSION, temperature, asdict(settings)],
        sort_keys=True,
    )
    return "extract:" + hashlib.sha256(material.encode("utf-8")).hexdigest()


def _find(text: str, needle: str) -> tuple[int, int] | None:
    """Where ``needle`` first occurs in ``text``, case ignored: its start and end in
    ``text`` itself. Offsets found in ``text.lower()`` pointed elsewhere once a letter
    before them changed length when lower-cased ("İ" is two characters)."""
    if not needle:
        return None
    m = re.search(re.escape(needle), text, re.IGNORECASE)
    return (m.start(), m.end()) if m else None


def unfence(content: str) -> str:
    """Strip one Markdown code fence around a JSON answer (some endpoints add it anyway)."""
    text = content.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        text = text[3:-3]
        first_nl = text.find("\n")
        if first_nl >= 0 and text[:first_nl].strip().isalpha():
            text = text[first_nl + 1 :]  # language tag such as "json"
    return text


def validate_extraction(chunk: DocChunk, content: str, settings: ExtractionSettings) -> ChunkResult:  # noqa: C901 - one check per rejection reason, each counted
    """Parse and validate an LLM answer for ``chunk``; every rejection is counted."""
    res = ChunkResult()
    c = res.counters
    try:
        obj = json.loads(unfence(content))
    except (ValueError, TypeError):
        c["malformed_json"] += 1
        return res
    if not isinstance(obj, dict):
        c["malformed_json"] += 1
        return res
    ents = obj.get("entities", [])
    rels = obj.get("relations", [])
    if not isinstance(ents, list) or not isinstance(rels, list):
        c["malformed_json"] += 1
        return res
    text = chunk.text
    accepted: dict[str, tuple[str, str]] = {}  # norm name -> (name, kind); first kind wins
    seen_keys: set[tuple[str, str]] = set()
    for e in ents:
        if not isinstance(e, dict):
            c["bad_entity"] += 1
            continue
        name, kind, mention = e.get("name"), e.get("kind"), e.get("mention")
        if not (isinstance(name, str) and isinstance(kind, str) and isinstance(mention, str)):
            c["bad_entity"] += 1
            continue
        name = " ".join(name.split())
        norm = norm_name(name)
        if not (settings.min_name_chars <= len(norm) <= settings.max_name_chars):
            c["bad_entity"] += 1
            continue
        if kind not in ENTITY_KINDS:
            c["unknown_kind"] += 1
            continue
        if redact(name) != name:
            c["redacted_name"] += 1  # a secret is never an entity name
            continue
        span = _find(text, mention)
        if span is None:
            c["mention_not_found"] += 1
            continue
        if _find(text, name) is None and _find(mention, norm) is None:
            c["name_not_in_text"] += 1
            continue
        if (norm, kind) in seen_keys:
            c["duplicate_entity"] += 1
            continue
        if len(res.mentions) >= settings.max_entities_per_chunk:
            c["entity_over_cap"] += 1
            continue
        seen_keys.add((norm, kind))
        accepted.setdefault(norm, (name, kind))
        res.mentions.append(MentionFact(name, kind, chunk.chunk_id, *span, "llm"))
        c["entity_accepted"] += 1
    seen_rel: set[tuple[str, str, str, int]] = set()
    for r in rels:
        if not isinstance(r, dict):
            c["bad_relation"] += 1
            continue
        src, dst, kind, ev = r.get("src"), r.get("dst"), r.get("kind"), r.get("evidence")
        if not all(isinstance(v, str) for v in (src, dst, kind, ev)):
            c["bad_relation"] += 1
            continue
        if kind not in RELATION_KINDS:
            c["unknown_relation_kind"] += 1
            continue
        s, d = accepted.get(norm_name(src)), accepted.get(norm_name(dst))  # type: ignore[arg-type]
        if s is None or d is None or s == d:
            c["relation_unknown_entity"] += 1
            continue
        found = _find(text, ev.strip())  # type: ignore[union-attr]
        if found is None:
            c["evidence_not_found"] += 1
            continue
        pos, end = found
        key = (norm_name(s[0]) + "|" + s[1], norm_name(d[0]) + "|" + d[1], kind, pos)
        if key in seen_rel:
            c["duplicate_relation"] += 1
            continue
        if len(res.relations) >= settings.max_relations_per_chunk:
            c["relation_over_cap"] += 1
            continue
        seen_rel.add(key)
        res.relations.append(
            RelationFact(s[0], s[1], d[0], d[1], kind, chunk.chunk_id, pos, end, "llm")
        )
        c["relation_accepted"] += 1
    return res


def extract_chunk(client: LLMClient, chunk: DocChunk, settings: ExtractionSettings) -> ChunkResult:
    """One LLM call for one chunk (raises :class:`~.llm.LLMUnavailable`).

    The text sent is redacted: a secret that slipped past ingestion never reaches the provider.
    Validation still runs against the original text, so a mention of a redaction marker is not
    found there and is rejected.
    """
    system, user = extraction_messages(redact(chunk.text[: settings.max_prompt_chars]))
    content = client.chat_json(system, user)
    return validate_extraction(chunk, content, settings)
