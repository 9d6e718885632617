"""The tools: one per public read operation of the API, each bound to its RPC.

Everything a tool publishes besides its name, title and description comes from the proto: the
input schema (request message, comments, ``(knowledge.v1.rules)``), the output schema (response
message) and the read-only / idempotent hints (the RPC's ``idempotency_level``). The
operator's streaming RPCs are listed in ``EXCLUDED_RPCS`` with the reason, so every RPC of the
proto is accounted for (a test checks it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.descriptor_pb2 import MethodOptions

from knowledge_mcp._descriptors import proto_rpcs
from knowledge_mcp.render import (
    render_answer,
    render_chunk,
    render_dispatch,
    render_episode,
    render_levels,
    render_neighbors,
    render_overview,
    render_relations,
    render_retrieve,
    render_search,
    render_status,
    render_themes,
)
from knowledge_mcp.schema import input_schema, output_schema

Renderer = Callable[[dict[str, Any]], list[str]]

# RPCs deliberately without a tool, with the reason.
EXCLUDED_RPCS: dict[str, str] = {
    "knowledge.v1.IndexService/IndexWorkspace": (
        "operator operation (role operator, RIGHT_MANAGE) that streams progress for minutes and "
        "writes the code index; run `knowledge index` instead of letting a model trigger it"
    ),
    "knowledge.v1.IndexService/IngestSessions": (
        "operator operation (RIGHT_MANAGE) that streams progress and writes the episodes index; "
        "run `knowledge ingest`"
    ),
    "knowledge.v1.IndexService/RebuildDerived": (
        "operator operation (RIGHT_MANAGE) that streams progress and rewrites the derived layer; "
        "run `knowledge rebuild`"
    ),
    "knowledge.v1.IndexService/BuildDocGraph": (
        "operator operation (RIGHT_MANAGE, Enterprise) that streams progress and may spend LLM "
        "budget; run `knowledge docgraph build`"
    ),
    # Every knowledge-base management RPC: people decide what is published (review,
    # four-eyes, releases), and an agent's token holds none of the kb.edit / kb.review /
    # kb.publish / kb.admin capabilities they need.
    **{
        rpc: (
            "knowledge-base management (kb.edit / kb.review / kb.publish / kb.admin), for people, "
            "never a model; an agent token is refused; run `knowledge kb ...`"
        )
        for rpc in proto_rpcs()
        if rpc.startswith("knowledge.v1.KnowledgeBaseAdminService/")
    },
}


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool: which RPC it calls and how its result is shown."""

    name: str
    rpc: str
    title: str
    description: str
    untrusted_fields: tuple[str, ...]
    render: Renderer
    # The SDK method when it is not the RPC's name in snake_case (the knowledge base's
    # RPCs are kb_retrieve / kb_answer in the SDK).
    sdk_name: str = ""

    @property
    def method(self) -> MethodDescriptor:
        return proto_rpcs()[self.rpc]

    @property
    def request(self) -> Descriptor:
        return self.method.input_type

    @property
    def response(self) -> Descriptor:
        return self.method.output_type

    @property
    def sdk_method(self) -> str:
        """The SDK client's method for the RPC: ``sdk_name``, else its name in snake_case
        (GetEpisode -> get_episode), the SDK's own naming rule."""
        return self.sdk_name or re.sub(r"(?<!^)(?=[A-Z])", "_", self.method.name).lower()

    @property
    def read_only(self) -> bool:
        return self._idempotency == MethodOptions.NO_SIDE_EFFECTS

    @property
    def idempotent(self) -> bool:
        return self._idempotency in (MethodOptions.NO_SIDE_EFFECTS, MethodOptions.IDEMPOTENT)

    @property
    def _idempotency(self) -> int:
        return int(self.method.GetOptions().idempotency_level)

    def input_schema(self) -> dict[str, Any]:
        return input_schema(self.request)

    def output_schema(self) -> dict[str, Any]:
        return output_schema(self.response)


_K = "knowledge.v1.KnowledgeService/"
_KB = "knowledge.v1.KnowledgeBaseService/"
# Text of the organisation's published documents (and the chat model's answer): data.
_KB_TEXT = ("sources[].content", "sources[].title", "sources[].section", "sources[].citation")
_KB_NOTE = (
    " Only published, citable evidence of your organisation comes back. answerable=false with "
    "reason_code NO_EVIDENCE means the knowledge base has nothing on it: say so, do not guess. "
    "A failing dependency is an error (KNOWLEDGE_DEPENDENCY_UNAVAILABLE with trace_id), never "
    "NO_EVIDENCE. Tag codes (all_tag_codes, any_tag_codes) must be active tags of the "
    "organisation."
)
_D = "knowledge.v1.DocGraphService/"
_I = "knowledge.v1.IndexService/"
_DOCGRAPH_NOTE = (
    " Enterprise edition (feature doc-graph); other editions answer KNOWLEDGE_EDITION_REQUIRED."
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "knowledge_search",
        _K + "Search",
        "Search past sessions, code and skills",
        "Ask one question; get separate lanes of evidence: episodes (what past agent sessions did, "
        "as session_id#seq), code (path:start_line-end_line) and skills, plus the actors who did "
        "this kind of work. Each lane reports its own index_rev and whether it is degraded; an "
        "empty lane says why in empty_reason (no_match, index_empty, not_indexed, not_requested, "
        "unavailable, budget), and errors[] names the cause of a lane that failed. "
        "Fetch full texts with knowledge_get_episode / knowledge_get_chunk.",
        (
            "lanes.episodes.items[].snippet",
            "lanes.episodes.items[].session_id",
            "lanes.code.items[].snippet",
            "lanes.code.items[].path",
            "lanes.code.items[].symbol",
            "lanes.code.items[].matched_entities[].name",
            "lanes.skills.items[].name",
            "lanes.skills.items[].path",
            "lanes.skills.items[].description",
            "lanes.skills.items[].when_to_use",
            "actors[].actor_id",
        ),
        render_search,
    ),
    ToolSpec(
        "knowledge_dispatch",
        _K + "Dispatch",
        "Choose an actor for a task",
        "Choose the best actor (agent, subagent, team member) for a task and prepare a hand-off "
        "package with references. Never executes anything. dry_run=true (default) writes nothing; "
        "dry_run=false records the plan (idempotent: the same task and actor give the same "
        "assignment).",
        (
            # Text from session logs (titles, snippets, event types) and what is built of it.
            # Ids and names a log gave (an actor id holds a session id or an agent type),
            # as the search tool marks them.
            "target.actor_id",
            "target.name",
            "target.why[]",
            "context_pack.prior_episodes[].session_id",
            "context_pack.prior_episodes[].snippet",
            "context_pack.code_refs[].path",
            "context_pack.skills[].name",
            "context_pack.risks[]",
            "handoff.target.actor_id",
            "handoff.target.name",
            "handoff.context_pack.prior_episodes[].session_id",
            "handoff.context_pack.prior_episodes[].snippet",
            "handoff.context_pack.code_refs[].path",
            "handoff.context_pack.skills[].name",
            "handoff.context_pack.risks[]",
            "handoff.tool_calls[].arguments",
        ),
        render_dispatch,
    ),
    ToolSpec(
        "knowledge_get_episode",
        _K + "GetEpisode",
        "Read one episode",
        "The full (redacted) text of one session event by id (ep:<session_id>:<seq>), optionally "
        "with neighbouring events.",
        ("episode.text", "before[].text", "after[].text"),
        render_episode,
    ),
    ToolSpec(
        "knowledge_get_chunk",
        _K + "GetChunk",
        "Read one code or document chunk",
        "The full (redacted) text of one code or document chunk by id, with its path and lines.",
        ("chunk.text",),
        render_chunk,
    ),
    ToolSpec(
        "knowledge_status",
        _I + "GetStatus",
        "Service status",
        "Edition, licence state, and per-lane status: index_rev, counts, capability, freshness.",
        (),
        render_status,
    ),
    ToolSpec(
        "knowledge_themes",
        _D + "Themes",
        "Document themes",
        "Themes (clusters of co-mentioned entities) with top entities and citations as "
        "path:start_line-end_line." + _DOCGRAPH_NOTE,
        ("themes[].title", "themes[].summary", "themes[].top_entities[].name"),
        render_themes,
    ),
    ToolSpec(
        "knowledge_entity_neighbors",
        _D + "EntityNeighbors",
        "Entity neighbours",
        "Neighbours of an entity or theme (up to depth 3), each with the address of a quote that "
        "shows the connection." + _DOCGRAPH_NOTE,
        ("entity.name", "neighbors[].name"),
        render_neighbors,
    ),
    ToolSpec(
        "knowledge_doc_relations",
        _D + "DocRelations",
        "Document relations",
        "Relations between documents through shared entities, with citations. Give doc or "
        "entity." + _DOCGRAPH_NOTE,
        ("relations[].via_entities[].name",),
        render_relations,
    ),
    ToolSpec(
        "knowledge_global_overview",
        _D + "GlobalOverview",
        "Corpus overview",
        "A map of the document corpus: counts and top themes with addresses." + _DOCGRAPH_NOTE,
        ("top_themes[].title", "top_themes[].summary", "top_themes[].top_entities[].name"),
        render_overview,
    ),
    ToolSpec(
        "knowledge_search_levels",
        _D + "SearchLevels",
        "Dual-level document search",
        "Dual-level search over documents: high-level (theme) and low-level (entity) keywords, "
        "matching themes and chunks with addresses." + _DOCGRAPH_NOTE,
        (
            "items[].snippet",
            "themes[].title",
            "themes[].summary",
            "items[].matched_entities[].name",
        ),
        render_levels,
    ),
    ToolSpec(
        "knowledge_retrieve",
        _KB + "Retrieve",
        "Retrieve published knowledge",
        "The best published evidence of the organisation's knowledge base for a question: each "
        "source with its text, title, section, page, version, a ready citation and a score; "
        "cite the citation." + _KB_NOTE,
        _KB_TEXT,
        render_retrieve,
        "kb_retrieve",
    ),
    ToolSpec(
        "knowledge_answer",
        _KB + "Answer",
        "Answer from published knowledge",
        "An answer written by the service's chat model from the published evidence only, with "
        "[n] markers citing sources[n-1] and a citation_check (grounded, repaired, ungrounded, "
        "no_evidence); template_code picks the organisation's answer template. Without evidence "
        "the model is not called and the configured no-evidence reply comes back." + _KB_NOTE,
        ("answer", *_KB_TEXT),
        render_answer,
        "kb_answer",
    ),
)

TOOLS_BY_NAME: dict[str, ToolSpec] = {t.name: t for t in TOOLS}
