"""Deterministic themes: co-occurrence clusters of entities (no Leiden, no randomness).

1. Graph: an edge joins two entities mentioned in the same chunk; its weight is the number of
   chunks where both appear.
2. Edges with ``weight < min_weight`` are dropped.
3. Connected components. Left out of the graph: entities of classifier kinds such as ``status``
   (a value like "Final" would otherwise join every document into one component) and hubs,
   entities mentioned in more than ``max(hub_min_documents, hub_share * documents)``
   documents (headings such as "Specification" or "Rationale", a type every page uses): they
   say what kind of text a chunk is, not what it is about.
4. A component larger than ``max_size`` is cut greedily: take the strongest remaining seed
   (most mentions, then lexicographically first ``norm_name``, then id), grow it by repeatedly
   adding the neighbour with the largest total edge weight to the cluster (ties: ``norm_name``,
   then id) until ``max_size``; remove the cluster and repeat on what is left. Clusters of one
   entity are not themes.
5. ``seed_entity_id`` = member with most mentions (ties: first ``norm_name``, then id);
   ``theme_id = sha1(seed_entity_id + '|' + ','.join(sorted(member_ids)))``;
   title = the seed's ``norm_name``.

The same members always give the same id, so a theme is recognisable across revisions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import theme_id_for

__all__ = ["Theme", "ThemeEntity", "ThemeSettings", "build_themes", "choose_seed"]


@dataclass(frozen=True, slots=True)
class ThemeSettings:
    min_weight: int = 2
    max_size: int = 12
    excluded_kinds: tuple[str, ...] = ("status", "doc_type", "category")
    max_summaries: int = 50  # summaries are LLM calls: the largest themes first, at most this many
    max_citable_chunks: int = 8
    max_quote_chars: int = 600  # per citable chunk, in the summary prompt
    hub_share: float = 0.15  # entities in more documents than this share (and the minimum) ...
    hub_min_documents: int = 4  # ... are hubs, left out of themes


@dataclass(frozen=True, slots=True)
class ThemeEntity:
    entity_id: str
    norm_name: str
    kind: str
    mentions: int
    documents: int = 0  # distinct documents mentioning it (0 = unknown: never a hub)


@dataclass(slots=True)
class Theme:
    theme_id: str
    title: str
    seed_entity_id: str
    members: list[tuple[str, int]] = field(default_factory=list)  # (entity_id, weight), sorted

    @property
    def size(self) -> int:
        return len(self.members)


def _rank(e: ThemeEntity) -> tuple[int, str, str]:
    return (-e.mentions, e.norm_name, e.entity_id)


def choose_seed(members: Iterable[ThemeEntity]) -> ThemeEntity:
    return min(members, key=_rank)


def build_themes(
    entities: Mapping[str, ThemeEntity],
    chunk_entities: Mapping[str, Iterable[str]],
    settings: ThemeSettings = ThemeSettings(),
    documents: int = 0,
) -> list[Theme]:
    """Themes from ``chunk_id -> entity ids mentioned there``; ordered by size desc, then id.

    ``documents`` is the number of documents of the corpus (0 = no hub rule)."""
    excluded = set(settings.excluded_kinds)
    hub_limit = max(settings.hub_min_documents, settings.hub_share * documents)
    hubs = {e for e, m in entities.items() if documents and m.documents > hub_limit}
    weights: dict[tuple[str, str], int] = defaultdict(int)
    for chunk_id in sorted(chunk_entities):
        ids = sorted(
            {
                e
                for e in chunk_entities[chunk_id]
                if e in entities and entities[e].kind not in excluded and e not in hubs
            }
        )
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                weights[(a, b)] += 1
    adj: dict[str, dict[str, int]] = defaultdict(dict)
    for (a, b), w in weights.items():
        if w >= settings.min_weight:
            adj[a][b] = w
            adj[b][a] = w

    themes: list[Theme] = []
    seen: set[str] = set()
    for start in sorted(adj, key=lambda e: _rank(entities[e])):
        if start in seen:
            continue
        component: set[str] = set()
        stack = [start]
        while stack:
            node = stack.pop()
            if node in component:
                continue
            component.add(node)
            stack.extend(n for n in adj[node] if n not in component)
        seen |= component
        for cluster in _cut(component, adj, entities, settings.max_size):
            themes.append(_make_theme(cluster, adj, entities))
    themes.sort(key=lambda t: (-t.size, t.theme_id))
    return themes


def _cut(
    component: set[str],
    adj: Mapping[str, Mapping[str, int]],
    entities: Mapping[str, ThemeEntity],
    max_size: int,
) -> list[set[str]]:
    if len(component) <= max_size:
        return [component]
    remaining = set(component)
    order = sorted(component, key=lambda e: _rank(entities[e]))
    clusters: list[set[str]] = []
    for seed in order:
        if seed not in remaining:
            continue
        cluster = {seed}
        remaining.discard(seed)
        score: dict[str, int] = {}
        for nb, w in adj[seed].items():
            if nb in remaining:
                score[nb] = score.get(nb, 0) + w
        while score and len(cluster) < max_size:
            best = min(score, key=lambda e: (-score[e], entities[e].norm_name, e))
            del score[best]
            cluster.add(best)
            remaining.discard(best)
            for nb, w in adj[best].items():
                if nb in remaining:
                    score[nb] = score.get(nb, 0) + w
        if len(cluster) > 1:
            clusters.append(cluster)
    return clusters


def _make_theme(
    cluster: set[str], adj: Mapping[str, Mapping[str, int]], entities: Mapping[str, ThemeEntity]
) -> Theme:
    seed = choose_seed(entities[e] for e in cluster)
    members = sorted(
        ((e, sum(w for nb, w in adj[e].items() if nb in cluster)) for e in cluster),
        key=lambda m: (-m[1], entities[m[0]].norm_name, m[0]),
    )
    return Theme(
        theme_id=theme_id_for(seed.entity_id, cluster),
        title=seed.norm_name,
        seed_entity_id=seed.entity_id,
        members=members,
    )
