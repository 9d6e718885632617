"""Text rendering of tool results: compact, one line per item, with the addresses an agent
cites (``path:start_line-end_line``, ``session_id#seq``) and each lane's ``index_rev``.

Each renderer reads the response as ``json_format`` writes it (proto field names; a message
field that is not set is absent)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def plain(value: Any) -> str:
    """A value the service answered (an id, a path, a name) as one printable line: a
    character that is not printable (a line break, a control character) as its escape
    (``\\n``, ``\\x07``), so text from a log or a file name cannot start lines of its own
    in what an agent reads."""
    s = "" if value is None else str(value)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def _one_line(text: Any, limit: int = 200) -> str:
    """``text`` as one line of at most ``limit`` characters: runs of white space as one
    space, other characters that are not printable as their escapes (``plain``)."""
    s = plain(" ".join(str(text or "").split()))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _lines(addr: dict[str, Any] | None) -> str:
    if not addr:
        return "?"
    return f"{plain(addr.get('path', ''))}:{addr.get('start_line', 0)}-{addr.get('end_line', 0)}"


def _lane_head(name: str, lane: dict[str, Any] | None) -> str:
    if lane is None or lane.get("empty_reason") == "not_requested":
        return f"{name}: not requested"
    head = f"{name} (index_rev {lane.get('index_rev') or '-'}"
    if lane.get("capability"):
        head += f", capability {lane['capability']}"
    if lane.get("degraded"):
        head += f", degraded: {lane.get('degradation_reason', '')}"
    n = len(lane.get("items") or [])
    # An empty lane says why (no_match, index_empty, not_indexed, unavailable, budget).
    empty = f", empty: {lane['empty_reason']}" if not n and lane.get("empty_reason") else ""
    return head + f"): {n} item(s){empty}"


def _notices(d: dict[str, Any], *keys: str) -> list[str]:
    out = []
    for key in keys:
        for n in d.get(key) or []:
            if n:
                out.append(f"{key.removesuffix('s')}: {n.get('code', '')}: {n.get('message', '')}")
    return out


def render_search(d: dict[str, Any]) -> list[str]:
    routing = d.get("routing") or {}
    out = [
        f"{d.get('schema', '')} · intent {routing.get('intent', '-')} · found {str(d.get('found')).lower()}"
    ]
    lanes = d.get("lanes") or {}
    ep = lanes.get("episodes")
    out.append(_lane_head("episodes", ep))
    for it in (ep or {}).get("items") or []:
        out.append(
            f"  {plain(it.get('session_id'))}#{it.get('seq')} [{plain(it.get('event_type'))}]"
            f" id={plain(it.get('id'))}"
            f" score={it.get('score', 0):.3f} | {_one_line(it.get('snippet'))}"
        )
    code = lanes.get("code")
    out.append(_lane_head("code", code))
    items = (code or {}).get("items") or []
    # Items of several workspaces may share a path: each then names its workspace.
    several = len({it.get("workspace", "") for it in items}) > 1
    for it in items:
        sym = f" in {plain(it.get('workspace', ''))}" if several else ""
        sym += f" {plain(it['symbol'])}" if it.get("symbol") else ""
        if it.get("match_kind"):  # mode=docs|themes: how the document graph reached it
            names = ", ".join(plain(e.get("name")) for e in (it.get("matched_entities") or [])[:3])
            sym += f" [{plain(it['match_kind'])}{': ' + names if names else ''}]"
        out.append(
            f"  {_lines(it)}{sym} id={plain(it.get('id'))} score={it.get('score', 0):.3f}"
            f" | {_one_line(it.get('snippet'))}"
        )
    skills = lanes.get("skills")
    if skills is not None:
        out.append(_lane_head("skills", skills))
        for it in skills.get("items") or []:
            out.append(
                f"  {plain(it.get('name'))} ({plain(it.get('path'))}) uses={it.get('uses')}"
                f" | {_one_line(it.get('description'))}"
            )
    for a in d.get("actors") or []:
        out.append(
            f"actor {plain(a.get('actor_id'))} ({plain(a.get('kind'))}) score={a.get('score', 0):.3f}"
        )
    return out + _notices(d, "warnings", "errors")


def render_dispatch(d: dict[str, Any]) -> list[str]:
    target = d.get("target") or {}
    out = [
        f"{d.get('schema', '')} · mode {d.get('mode', '')} · target {plain(target.get('actor_id')) or 'none'}"
    ]
    if target.get("dispatch"):
        info = target["dispatch"]
        out.append(
            f"hand-off {info.get('mode')} available={str(info.get('available')).lower()}: {info.get('reason', '')}"
        )
    if d.get("assignment"):
        a = d["assignment"]
        out.append(
            f"assignment {a.get('assignment_id')} status={a.get('status')} created={str(a.get('created')).lower()}"
        )
    pack = d.get("context_pack") or {}
    for ep in pack.get("prior_episodes") or []:
        out.append(
            f"  episode {plain(ep.get('session_id'))}#{ep.get('seq')} | {_one_line(ep.get('snippet'))}"
        )
    refs = pack.get("code_refs") or []
    several = len({ref.get("workspace", "") for ref in refs}) > 1
    for ref in refs:
        where = f" in {plain(ref.get('workspace', ''))}" if several else ""
        out.append(f"  code {_lines(ref)}{where}")
    for risk in pack.get("risks") or []:
        out.append(f"  risk: {_one_line(risk)}")
    return out + _notices(d, "warnings", "errors")


def _episode_line(e: dict[str, Any]) -> str:
    err = " error" if e.get("is_error") else ""
    return (
        f"{plain(e.get('session_id'))}#{e.get('seq')} [{plain(e.get('event_type'))}{err}]"
        f" {plain(e.get('time') or '')}"
    )


def render_episode(d: dict[str, Any]) -> list[str]:
    out = [f"episode (index_rev {d.get('index_rev') or '-'})"]
    for e in d.get("before") or []:
        out.append(f"  before {_episode_line(e)} | {_one_line(e.get('text'))}")
    if d.get("episode"):
        out.append(_episode_line(d["episode"]))
        out.append(str(d["episode"].get("text") or ""))
    for e in d.get("after") or []:
        out.append(f"  after {_episode_line(e)} | {_one_line(e.get('text'))}")
    return out


def render_chunk(d: dict[str, Any]) -> list[str]:
    c = d.get("chunk") or {}
    sym = f" {plain(c['symbol'])}" if c.get("symbol") else ""
    return [
        f"{_lines(c)}{sym} ({c.get('language') or '-'}, index_rev {d.get('index_rev') or '-'})",
        str(c.get("text") or ""),
    ]


def render_status(d: dict[str, Any]) -> list[str]:
    ed = d.get("edition") or {}
    out = [
        f"version {d.get('version')} · edition {ed.get('edition')} · licence {ed.get('licence_state')}"
    ]
    for lane in d.get("lanes") or []:
        counts = ", ".join(f"{k}={v}" for k, v in sorted((lane.get("counts") or {}).items()))
        deg = f", degraded: {lane.get('reason')}" if lane.get("degraded") else ""
        out.append(f"  {lane.get('lane')} (index_rev {lane.get('index_rev') or '-'}{deg}) {counts}")
    return out


def _envelope(d: dict[str, Any]) -> str:
    head = (
        f"{d.get('op')} (index_rev {d.get('index_rev') or '-'}, capability {d.get('capability') or '-'})"
        f" found={str(d.get('found')).lower()} collected={str(d.get('collected')).lower()}"
    )
    if d.get("reason"):
        head += f" reason: {d['reason']}"
    if d.get("error"):
        head += f" error: {d['error'].get('code')}: {d['error'].get('message')}"
    for p in d.get("layer_provenance") or []:
        # Which build answered, for an auditor: model, prompts, fingerprint, time.
        head += (
            f"\nlayer {plain(p.get('workspace'))}: model {p.get('model')}, prompts "
            f"{','.join(p.get('prompt_versions') or [])}, fingerprint "
            f"{str(p.get('fingerprint') or '')[:12]}, built {p.get('built_at')}"
        )
    return head


def _theme_lines(themes: Iterable[dict[str, Any]]) -> list[str]:
    out = []
    for t in themes:
        cites = " ".join(_lines(a) for a in (t.get("citations") or [])[:5])
        out.append(f"  theme {_one_line(t.get('title'), 80)} size={t.get('size')} {cites}".rstrip())
        for e in (t.get("top_entities") or [])[:5]:
            addrs = " ".join(_lines(a) for a in (e.get("addresses") or [])[:3])
            out.append(
                f"    {_one_line(e.get('name'), 80)} ({plain(e.get('kind'))}) {addrs}".rstrip()
            )
    return out


def render_themes(d: dict[str, Any]) -> list[str]:
    return [_envelope(d), *_theme_lines(d.get("themes") or [])]


def render_neighbors(d: dict[str, Any]) -> list[str]:
    out = [_envelope(d)]
    for n in d.get("neighbors") or []:
        out.append(
            f"  {_one_line(n.get('name'), 80)} ({plain(n.get('kind'))}) {plain(n.get('relation'))}"
            f" depth={n.get('depth')}"
            f" {_lines(n.get('address'))}"
        )
    return out


def render_relations(d: dict[str, Any]) -> list[str]:
    out = [_envelope(d)]
    for r in d.get("relations") or []:
        cites = " ".join(_lines(a) for a in (r.get("citations") or [])[:5])
        out.append(
            f"  {plain(r.get('from'))} -> {plain(r.get('to'))} ({plain(r.get('kind'))}) {cites}".rstrip()
        )
    return out


def render_overview(d: dict[str, Any]) -> list[str]:
    counts = (
        f"documents={d.get('documents')} entities={d.get('entities')} "
        f"relations={d.get('relations')} themes={d.get('themes')}"
    )
    out = [_envelope(d), counts]
    return out + _theme_lines(d.get("top_themes") or [])


def render_levels(d: dict[str, Any]) -> list[str]:
    out = [
        _envelope(d),
        f"high_level: {', '.join(d.get('high_level') or [])}",
        f"low_level: {', '.join(d.get('low_level') or [])}",
    ]
    out += _theme_lines(d.get("themes") or [])
    for h in d.get("items") or []:
        out.append(
            f"  {_lines(h.get('address'))} [{h.get('match_kind')}] | {_one_line(h.get('snippet'))}"
        )
    return out


def _quoted(text: Any, indent: str = "  ") -> list[str]:
    """Published or generated text in full, quoted line by line (data, not instructions)."""
    return [f"{indent}> {line}".rstrip() for line in (str(text or "").splitlines() or [""])]


def _evidence(sources: Iterable[dict[str, Any]]) -> list[str]:
    out = []
    for n, s in enumerate(sources, 1):
        out.append(
            f"[{n}] {_one_line(s.get('citation'))} score={float(s.get('score') or 0):.3f}"
            f" knowledge={s.get('knowledge_id')} revision={s.get('revision_id')}"
            f" chunk={s.get('chunk_id')}"
        )
        out += _quoted(s.get("content"))
    return out


def _kb_trace(d: dict[str, Any]) -> str:
    t = d.get("trace") or {}
    return (
        f"trace {d.get('trace_id') or '-'}: score {t.get('score_kind') or '-'}"
        f" (minimum {float(t.get('min_score') or 0):g}), {t.get('candidates', 0)} candidates,"
        f" {t.get('below_min_score', 0)} below the minimum; dropped"
        f" {t.get('dropped_old_revision', 0)} old revision,"
        f" {t.get('dropped_other_organisation', 0)} other organisation,"
        f" {t.get('dropped_uncitable', 0)} uncitable"
    )


# What an agent should do with NO_EVIDENCE: it is an answer, not an outage.
_NO_EVIDENCE = (
    "{code}: the knowledge base has no published evidence for this question that passed the "
    "checks; say so instead of answering from memory"
)


def render_retrieve(d: dict[str, Any]) -> list[str]:
    if not d.get("answerable"):
        return [_NO_EVIDENCE.format(code=d.get("reason_code") or "NO_EVIDENCE"), _kb_trace(d)]
    sources = d.get("sources") or []
    return [
        f"answerable: {len(sources)} source(s); cite them by their citation",
        *_evidence(sources),
        _kb_trace(d),
    ]


def render_answer(d: dict[str, Any]) -> list[str]:
    if not d.get("answerable"):
        return [
            _NO_EVIDENCE.format(code=d.get("reason_code") or "NO_EVIDENCE")
            + " (the model was not called); the configured reply:",
            *_quoted(d.get("answer")),
            _kb_trace(d),
        ]
    check = d.get("citation_check") or {}
    cited = ", ".join(f"[{n}]" for n in check.get("cited") or [])
    removed = ", ".join(f"[{n}]" for n in check.get("removed") or [])
    sources = d.get("sources") or []
    return [
        f"answerable · template {d.get('template_code') or '-'} · citation check"
        f" {check.get('status') or '-'}"
        + (f" (cites {cited})" if cited else "")
        + (f" (removed {removed})" if removed else ""),
        "answer ([n] = source n below):",
        *_quoted(d.get("answer")),
        f"{len(sources)} source(s):",
        *_evidence(sources),
        _kb_trace(d),
    ]
