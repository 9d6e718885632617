"""Structural extraction (no LLM): facts stated explicitly by a document's form.

Front matter (the chunk starting at line 1 with ``---``): ``eip:`` / ``title:`` name the
document, ``requires:`` lists required documents, ``author:`` persons, ``category:``,
``type:``, ``status:`` classify it. Front matter is scanned line by line rather than with a YAML
parser because every fact needs the exact offsets of its value.

Body (outside fenced code blocks), each fact's mention being the exact span in the chunk text:

* headings -> ``section`` entities; the hierarchy gives ``has_section`` relations (document ->
  top-level heading, heading -> sub-heading);
* defined terms -> ``term`` entities and ``defines`` relations: glossary list items and
  paragraphs opening with ``**Term**:`` / ``**Term:**`` / ``**Term** -`` or ```` `Term`: ````,
  ``<dfn>Term</dfn>``, definition lists (a line followed by ``:   definition``);
* identifiers in code spans (```` `base_fee_per_gas` ````, ```` `Request.url` ````) ->
  ``identifier`` entities;
* RFC 2119 keywords binding a subject ("The `x` MUST ...", "Clients SHOULD ...") -> the subject
  (``identifier`` or ``concept``) and a ``must`` / ``must_not`` / ``should`` / ``should_not`` /
  ``may`` relation from the document, citing subject .. keyword;
* link text of external links -> ``reference`` entities and ``cites`` relations; links to other
  Markdown documents -> ``links_to`` the target document;
* table header cells -> ``table_column`` entities;
* cross-references written as ``EIP-n`` / ``ERC-n`` -> ``standard`` entities and ``references``
  relations.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter, defaultdict

from ..redact import redact
from .extract import ChunkResult, MentionFact, RelationFact
from .model import DocChunk, norm_name

__all__ = ["STRUCTURAL_VERSION", "document_entities", "extract_structural"]

STRUCTURAL_VERSION = "structural/2"

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):[ \t]*(.*?)[ \t]*$")
_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
_EIP_FILE = re.compile(r"^(?:eip|erc)-(\d+)\.md$", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_CLASSIFIERS = {
    "category": ("category", "in_category"),
    "type": ("doc_type", "has_type"),
    "status": ("status", "has_status"),
}

Span = tuple[int, int]
DocEntity = tuple[str, str, str, Span]  # name, kind, chunk_id, (char_start, char_end)


def _front_matter_fields(chunk: DocChunk) -> list[tuple[str, str, int]]:
    """``(key, value, value_offset)`` for each ``key: value`` line of a front matter chunk."""
    if chunk.start_line != 1 or not chunk.text.startswith("---"):
        return []
    out = []
    offset = 0
    for line in chunk.text.split("\n"):
        m = _FIELD.match(line)
        if m and m.group(2):
            out.append((m.group(1).lower(), m.group(2), offset + m.start(2)))
        offset += len(line) + 1
    return out


def _split_top_level(value: str) -> list[tuple[str, int]]:
    """Split on commas outside parentheses/angle brackets; returns (part, offset in value)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append((value[start:i], start))
            start = i + 1
    parts.append((value[start:], start))
    out = []
    for part, off in parts:
        stripped = part.strip()
        if stripped:
            out.append((stripped, off + part.index(stripped)))
    return out


def _person_name(part: str) -> str:
    name = re.sub(r"\([^)]*\)|<[^>]*>", "", part)
    return " ".join(name.split())


# --- body signals ---------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(?<!`)`([^`\n]{2,80})`(?!`)")
_IDENT = re.compile(r"^[A-Za-z_$][\w$]*(?:(?:\.|::|->)[A-Za-z_$][\w$]*)*(?:\(\))?$")
_LIST = r"^[ \t]*(?:[-*+][ \t]+|\d+[.)][ \t]+)?"
_BOLD_TERM = re.compile(_LIST + r"\*\*([^*\n]{2,80}?)(:?)\*\*([ \t]*[:\u2013\u2014-])?[ \t]+\S")
_CODE_TERM = re.compile(_LIST + r"`([^`\n]{2,80})`[ \t]*[:\u2013\u2014][ \t]+\S")
_DFN = re.compile(r"<dfn(?:\s[^>]*)?>([^<\n]{2,80})</dfn>", re.IGNORECASE)
_DEF_ITEM = re.compile(r"^:[ \t]+\S")
_RFC2119 = re.compile(r"\b(MUST NOT|MUST|SHALL NOT|SHALL|SHOULD NOT|SHOULD|MAY)\b")
_RFC_KIND = {
    "MUST": "must",
    "SHALL": "must",
    "MUST NOT": "must_not",
    "SHALL NOT": "must_not",
    "SHOULD": "should",
    "SHOULD NOT": "should_not",
    "MAY": "may",
}
_SENTENCE_BREAK = re.compile(r"(?:[.;!?:][ \t]+|^[ \t]*(?:[-*+]|\d+[.)])[ \t]+|^[ \t]*)")
_DETERMINER = re.compile(
    r"^(?:the|a|an|this|that|these|those|each|every|all|any|such|its|their)[ \t]+", re.IGNORECASE
)
_PRONOUNS = frozenset(
    "it they this that which who we you he she one there these those implementations".split()
)
_PHRASE_WORD = re.compile(r"^[A-Za-z][\w'-]*$")
_ANY_LINK = re.compile(r"(?<!!)\[([^\]\n]{2,120})\]\(([^)\s]+)\)")
_GENERIC_LINK_TEXT = frozenset({"here", "link", "this", "this link", "source", "see here", "docs"})
_TABLE_SEP = re.compile(r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$")
_CROSS_REF = re.compile(r"\b(EIP|ERC)-(\d{1,5})\b")
_HAS_LETTER = re.compile(r"[A-Za-z]")


def _identifier(text: str) -> bool:
    """A code span that names something (not a number, a hex value, an expression)."""
    t = text.strip()
    return (
        t == text
        and 2 <= len(t) <= 60
        and _IDENT.match(t) is not None
        and not t.lower().startswith("0x")
        and _HAS_LETTER.search(t) is not None
    )


def _subject(line: str, upto: int) -> tuple[int, int] | None:
    """Span (in ``line``) of the subject an RFC 2119 keyword at ``upto`` binds, or None."""
    starts = [m.end() for m in _SENTENCE_BREAK.finditer(line, 0, upto)]
    begin = max(starts) if starts else 0
    prefix = line[begin:upto]
    spans = list(_CODE_SPAN.finditer(prefix))
    if spans:
        last = spans[-1]
        if prefix[last.end() :].strip() == "" and _identifier(last.group(1)):
            return begin + last.start(1), begin + last.end(1)
    phrase = prefix.rstrip()
    lead = _DETERMINER.match(phrase)
    start = lead.end() if lead else 0
    words = phrase[start:].split()
    if not 1 <= len(words) <= 4 or not all(_PHRASE_WORD.match(w) for w in words):
        return None
    if words[-1].lower() in _PRONOUNS or (len(words) == 1 and len(words[0]) < 3):
        return None
    return begin + start, begin + len(phrase)


def _table_cells(line: str) -> list[tuple[str, int]]:
    out, pos = [], 0
    for part in line.split("|"):
        cell = part.strip()
        if cell:
            out.append((cell, pos + part.index(cell)))
        pos += len(part) + 1
    return out


BodyFact = tuple[str, str, Span, str | None, Span | None]  # name, kind, mention, rel, evidence


def body_facts(text: str) -> tuple[list[BodyFact], list[tuple[int, str, Span]]]:  # noqa: C901 - one branch per form a document states a fact by
    """Facts stated by the form of a chunk's body, and its headings ``(level, name, span)``.

    Offsets are into ``text``; fenced code blocks are skipped.
    """
    facts: list[BodyFact] = []
    headings: list[tuple[int, str, Span]] = []
    lines = text.split("\n")
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    in_fence = False
    for i, line in enumerate(lines):
        base = offsets[i]
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence or not line.strip():
            continue
        h = _HEADING.match(line)
        if h:
            level = len(line) - len(line.lstrip("#"))
            name = h.group(1).strip()
            if _HAS_LETTER.search(name):
                headings.append((level, name, (base + h.start(1), base + h.start(1) + len(name))))
            continue
        if i + 1 < len(lines) and "|" in line and _TABLE_SEP.match(lines[i + 1]):
            for cell, off in _table_cells(line):
                name = cell.strip("`*_ ")
                if name and len(name) <= 60 and _HAS_LETTER.search(name):
                    start = base + off + cell.index(name)
                    facts.append((name, "table_column", (start, start + len(name)), None, None))
            continue
        for rx in (_BOLD_TERM, _CODE_TERM):
            m = rx.match(line)
            if m and (rx is _CODE_TERM or m.group(2) or m.group(3)):
                raw = m.group(1)
                name = raw.strip().strip("`*_").strip()
                if _HAS_LETTER.search(name):
                    start = base + m.start(1) + raw.index(name)
                    span = (start, start + len(name))
                    facts.append((name, "term", span, "defines", span))
                break
        for m in _DFN.finditer(line):
            name = m.group(1).strip()
            span = (base + m.start(1), base + m.start(1) + len(name))
            facts.append((name, "term", span, "defines", span))
        if (
            i + 1 < len(lines)
            and _DEF_ITEM.match(lines[i + 1])
            and not line.lstrip().startswith(("-", "*", "|", ">", ":", "<"))
            and len(line.strip()) <= 80
        ):
            name = line.strip()
            start = base + line.index(name)
            facts.append((name, "term", (start, start + len(name)), "defines", None))
        for m in _CODE_SPAN.finditer(line):
            if _identifier(m.group(1)):
                facts.append(
                    (m.group(1), "identifier", (base + m.start(1), base + m.end(1)), None, None)
                )
        for m in _RFC2119.finditer(line):
            subj = _subject(line, m.start())
            if subj is None:
                continue
            name = line[subj[0] : subj[1]]
            kind = "identifier" if _identifier(name) and "`" in line[: subj[1] + 1] else "concept"
            facts.append(
                (
                    name,
                    kind,
                    (base + subj[0], base + subj[1]),
                    _RFC_KIND[m.group(1)],
                    (base + subj[0], base + m.end()),
                )
            )
        for m in _ANY_LINK.finditer(line):
            label, target = m.group(1).strip(), m.group(2)
            if "://" not in target or label.lower() in _GENERIC_LINK_TEXT:
                continue
            label = label.strip("`*_ ")
            if len(label) < 3 or not _HAS_LETTER.search(label) or "://" in label:
                continue
            start = base + m.start(1) + m.group(1).index(label)
            facts.append(
                (
                    label,
                    "reference",
                    (start, start + len(label)),
                    "cites",
                    (base + m.start(), base + m.end()),
                )
            )
        for m in _CROSS_REF.finditer(line):
            name = f"{m.group(1)}-{int(m.group(2))}"
            span = (base + m.start(), base + m.end())
            facts.append((name, "standard", span, "references", span))
    return facts, headings


def document_entities(by_path: dict[str, list[DocChunk]]) -> dict[str, DocEntity]:
    """The entity naming each document: ``eip:`` -> standard, ``title:`` / first heading."""
    docs: dict[str, DocEntity] = {}
    for path, chunks in by_path.items():
        for chunk in chunks:
            for key, value, off in _front_matter_fields(chunk):
                if key == "eip" and value.isdigit():
                    docs[path] = (
                        f"EIP-{value}",
                        "standard",
                        chunk.chunk_id,
                        (off, off + len(value)),
                    )
                    break
                if key == "title" and path not in docs:
                    docs[path] = (value, "document", chunk.chunk_id, (off, off + len(value)))
            if path in docs and docs[path][1] == "standard":
                break
        if path in docs:
            continue
        for chunk in chunks:
            pos = 0
            for line in chunk.text.split("\n"):
                m = _HEADING.match(line)
                if m:
                    docs[path] = (
                        m.group(1),
                        "document",
                        chunk.chunk_id,
                        (pos + m.start(1), pos + m.end(1)),
                    )
                    break
                pos += len(line) + 1
            if path in docs:
                break
    return docs


def extract_structural(chunks: list[DocChunk]) -> ChunkResult:  # noqa: C901 - one branch per front-matter field and link form of the document format
    """Structural facts for a set of document chunks (built_by="structural")."""
    res = ChunkResult()
    c: Counter[str] = res.counters
    by_path: dict[str, list[DocChunk]] = defaultdict(list)
    for ch in sorted(chunks, key=lambda x: (x.path, x.start_line, x.chunk_id)):
        by_path[ch.path].append(ch)
    docs = document_entities(by_path)

    clean: dict[str, bool] = {}  # name -> not redacted and not empty (names repeat)

    def mention(name: str, kind: str, chunk: DocChunk, span: Span) -> bool:
        ok = clean.get(name)
        if ok is None:
            ok = clean[name] = redact(name) == name and bool(norm_name(name))
        if not ok:
            c["structural_rejected"] += 1
            return False
        res.mentions.append(MentionFact(name, kind, chunk.chunk_id, span[0], span[1], "structural"))
        return True

    def relate(
        src: tuple[str, str], dst: tuple[str, str], kind: str, chunk: DocChunk, span: Span
    ) -> None:
        if norm_name(src[0]) == norm_name(dst[0]) and src[1] == dst[1]:
            return
        res.relations.append(
            RelationFact(
                src[0], src[1], dst[0], dst[1], kind, chunk.chunk_id, span[0], span[1], "structural"
            )
        )

    for path, chunks_of in by_path.items():
        doc = docs.get(path)
        if doc is None:
            c["document_without_name"] += 1
        else:
            name, kind, cid, span = doc
            home = next(ch for ch in chunks_of if ch.chunk_id == cid)
            mention(name, kind, home, span)
        doc_key = (doc[0], doc[1]) if doc else None
        stack: list[tuple[int, str]] = []  # (heading level, name) of the open sections
        for chunk in chunks_of:
            for key, value, off in _front_matter_fields(chunk):
                if doc_key is None:
                    break
                if key == "requires":
                    for part, poff in _split_top_level(value):
                        span = (off + poff, off + poff + len(part))
                        target = (
                            (f"EIP-{part}", "standard") if part.isdigit() else (part, "document")
                        )
                        if mention(target[0], target[1], chunk, span):
                            relate(doc_key, target, "requires", chunk, span)
                elif key == "author":
                    for part, poff in _split_top_level(value):
                        person = _person_name(part)
                        if not person:
                            continue
                        start = off + poff + part.index(person.split(" ")[0])
                        span = (start, start + len(person))
                        if chunk.text[span[0] : span[1]] != person:
                            span = (off + poff, off + poff + len(part))  # odd spacing: whole part
                        if mention(person, "person", chunk, span):
                            relate(doc_key, (person, "person"), "authored_by", chunk, span)
                elif key in _CLASSIFIERS:
                    ekind, rkind = _CLASSIFIERS[key]
                    span = (off, off + len(value))
                    if mention(value, ekind, chunk, span):
                        relate(doc_key, (value, ekind), rkind, chunk, span)
            if doc_key is None:
                continue
            if not (chunk.start_line == 1 and chunk.text.startswith("---")):
                facts, headings = body_facts(chunk.text)
                for name, kind, span, rel, evid in facts:
                    if mention(name, kind, chunk, span) and rel is not None:
                        relate(doc_key, (name, kind), rel, chunk, evid or span)
                for level, name, span in headings:
                    while stack and stack[-1][0] >= level:
                        stack.pop()
                    if (norm_name(name), "document") == (norm_name(doc_key[0]), doc_key[1]):
                        continue  # the heading that names the document
                    if mention(name, "section", chunk, span):
                        parent = (stack[-1][1], "section") if stack else doc_key
                        relate(parent, (name, "section"), "has_section", chunk, span)
                        stack.append((level, name))
            for m in _LINK.finditer(chunk.text):
                target_ref = m.group(2).split("#", 1)[0]
                if not target_ref.lower().endswith(".md") or "://" in target_ref:
                    continue
                target_path = posixpath.normpath(
                    posixpath.join(posixpath.dirname(path), target_ref)
                )
                base = posixpath.basename(target_path)
                eip = _EIP_FILE.match(base)
                if eip:
                    target = (f"EIP-{int(eip.group(1))}", "standard")
                elif target_path in docs:
                    target = (docs[target_path][0], docs[target_path][1])
                else:
                    c["link_target_unknown"] += 1
                    continue
                span = (m.start(), m.end())
                if mention(target[0], target[1], chunk, span):
                    relate(doc_key, target, "links_to", chunk, span)
    c["structural_mentions"] += len(res.mentions)
    c["structural_relations"] += len(res.relations)
    return res
