"""Structural extraction without an LLM: what a document states by its form, each fact cited.

Headings and their hierarchy, defined terms (glossary lists, ``**Term**:``, ``<dfn>``,
definition lists), identifiers in code spans, RFC 2119 keywords binding a subject, link text,
table header cells, cross-references; themes exist without an LLM.
"""

from __future__ import annotations

from pathlib import Path

from knowledge_server.docgraph.build import DocGraphBuilder
from knowledge_server.docgraph.model import line_span
from knowledge_server.docgraph.ops import DocGraphOps
from knowledge_server.docgraph.sample import load_markdown_chunks
from knowledge_server.docgraph.store import DocGraphStore
from knowledge_server.docgraph.structural import body_facts

GUIDE = """# Request Guide

Intro text about the `Request` object and [the ASGI spec](https://asgi.readthedocs.io/en/latest/).
See [here](https://example.org/x) and EIP-1559 for fees.

## Glossary

- **Scope**: the connection dictionary.
- **Receive channel:** an awaitable.
- `send_timeout`: seconds to wait.

Middleware stack
:   the ordered list of middleware.

A <dfn>route</dfn> maps a path to an endpoint.

### Rules

The `base_fee_per_gas` MUST be greater than zero.
Clients SHOULD NOT retry. It MAY fail.

| Parameter | Default value |
|---|---|
| `max_age` | 600 |

```python
# Not a heading
x = `not_an_identifier`
```
"""


def _facts(text: str) -> dict[tuple[str, str], tuple[str | None, str]]:
    facts, _ = body_facts(text)
    return {(n, k): (rel, text[s:e]) for n, k, (s, e), rel, _ in facts}


def test_body_forms_give_cited_facts() -> None:
    """Catches: a form the extractor misses, or a mention whose offsets are not its name."""
    facts, headings = body_facts(GUIDE)
    got = _facts(GUIDE)
    assert got[("Scope", "term")] == ("defines", "Scope")
    assert got[("Receive channel", "term")] == ("defines", "Receive channel")
    assert got[("send_timeout", "term")] == ("defines", "send_timeout")
    assert got[("Middleware stack", "term")] == ("defines", "Middleware stack")
    assert got[("route", "term")] == ("defines", "route")
    assert got[("Request", "identifier")] == (None, "Request")
    assert got[("base_fee_per_gas", "identifier")][0] == "must"
    assert got[("Clients", "concept")][0] == "should_not"
    assert got[("the ASGI spec", "reference")] == ("cites", "the ASGI spec")
    assert got[("Parameter", "table_column")][1] == "Parameter"
    assert got[("Default value", "table_column")][1] == "Default value"
    assert got[("EIP-1559", "standard")] == ("references", "EIP-1559")
    names = {n for n, *_ in facts}
    assert "here" not in names  # generic link text is not a name
    assert "It" not in names  # a pronoun is not a subject
    assert "not_an_identifier" not in names  # fenced code is skipped
    assert [(lvl, n) for lvl, n, _ in headings] == [
        (1, "Request Guide"),
        (2, "Glossary"),
        (3, "Rules"),
    ]
    for _, name, (s, e) in headings:
        assert GUIDE[s:e] == name
    for name, _kind, (s, e), _rel, evid in facts:
        assert GUIDE[s:e] == name, name  # every mention quotes the name itself
        if evid is not None:
            assert evid[0] <= s and evid[1] >= e


def test_structural_build_has_hierarchy_themes_and_real_addresses(tmp_path: Path) -> None:
    """Catches: headings without hierarchy, no themes without an LLM, or a fact whose path:line
    does not hold its quote."""
    root = tmp_path / "docs"
    root.mkdir()
    body = "The `FeeVault` uses `gas_target` and `base_fee`.\n\n"
    for i in range(3):
        (root / f"doc{i}.md").write_text(
            f"# Doc {i}\n\n## Fees\n\n{body}More on `FeeVault`, `gas_target`, `base_fee`.\n\n"
            f"### Limits\n\n{body}",
            encoding="utf-8",
        )
    chunks = load_markdown_chunks(root, "*.md")
    store = DocGraphStore(tmp_path / "data")
    report = DocGraphBuilder(store, None).build(chunks)
    assert report.llm_state == "not_configured" and report.themes >= 1
    rels = {
        (s, k, d)
        for s, k, d in store.rows(
            "SELECT s.name, r.kind, d.name FROM entity_relation r "
            "JOIN entity s ON s.rev_id=r.rev_id AND s.entity_id=r.src_entity_id "
            "JOIN entity d ON d.rev_id=r.rev_id AND d.entity_id=r.dst_entity_id"
        )
    }
    assert ("Doc 0", "has_section", "Fees") in rels
    assert ("Fees", "has_section", "Limits") in rels
    by_id = {c.chunk_id: c for c in chunks}
    lines = {p.name: p.read_text(encoding="utf-8").split("\n") for p in root.iterdir()}
    for name, cid, path, sl, cs, ce in store.rows(
        "SELECT e.name, m.chunk_id, m.path, m.start_line, m.char_start, m.char_end "
        "FROM entity_mention m JOIN entity e ON e.rev_id=m.rev_id AND e.entity_id=m.entity_id"
    ):
        chunk = by_id[cid]
        quote = chunk.text[cs:ce]
        assert line_span(chunk, cs, ce)[0] == sl
        assert quote in lines[path][sl - 1], (name, path, sl)
    answer = DocGraphOps(store).search_levels("where is gas_target defined")
    assert answer["found"] and answer["low_level"]
    assert any(
        m["name"] == "gas_target" for h in answer["low_level"] for m in h["matched_entities"]
    )


def test_hub_headings_do_not_make_themes(tmp_path: Path) -> None:
    """Catches: a heading every document has ("Specification") joining all documents into
    themes about nothing."""
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(8):
        (root / f"d{i}.md").write_text(
            f"# D{i}\n\n## Specification\n\nUses `alpha{i}` and `beta{i}`.\n\n"
            f"## Rationale\n\n`alpha{i}` with `beta{i}` again.\n",
            encoding="utf-8",
        )
    store = DocGraphStore(tmp_path / "data")
    DocGraphBuilder(store, None).build(load_markdown_chunks(root, "*.md"))
    titles = {r[0] for r in store.rows("SELECT title FROM theme")}
    members = {
        r[0]
        for r in store.rows(
            "SELECT e.norm_name FROM theme_member tm JOIN entity e ON e.rev_id=tm.rev_id AND "
            "e.entity_id=tm.entity_id"
        )
    }
    assert "specification" not in members and "rationale" not in members
    assert titles  # the documents' own identifiers still make themes
