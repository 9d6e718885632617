"""Principals and roles (the data model; token storage lives in knowledge_server.auth)."""

from __future__ import annotations

from dataclasses import dataclass

# Capabilities a principal can hold. "read" and "manage" are the search and index paths;
# the knowledge base and the fact memory have their own, so an operator can give a person
# editing rights without publishing rights, or keep an agent from writing memory.
CAPABILITIES: tuple[str, ...] = (
    "read",  # Search, Dispatch, GetEpisode, GetChunk, doc-graph reads
    "manage",  # index, ingest, rebuild, detailed status
    "kb.read",  # retrieve and answer over published knowledge
    "kb.edit",  # topics, drafts, sources, FAQ entries
    "kb.review",  # approve or return a submitted revision
    "kb.publish",  # process, publish, roll back, take offline
    "kb.admin",  # tags, answer templates, the organisation's policy
    "memory.read",  # recall, timeline, rooms, relations, policy show
    "memory.write",  # remember, consolidate, restore
)

# What each role may hold: a token carries all of its role's capabilities, or the subset
# named when it was created. An agent's runtime token never holds a management capability.
ROLE_RIGHTS = {
    "agent": frozenset({"read", "kb.read", "memory.read", "memory.write"}),
    "operator": frozenset(CAPABILITIES),
}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. Its organisation and workspaces come from the token,
    never from a request body. ``workspaces=None`` means every configured workspace."""

    id: str
    organisation: str
    workspaces: tuple[str, ...] | None
    role: str
    # None: every capability of the role; otherwise the subset the token was given.
    capabilities: frozenset[str] | None = None

    def allows(self, right: str) -> bool:
        if right not in ROLE_RIGHTS.get(self.role, frozenset()):
            return False
        return self.capabilities is None or right in self.capabilities

    def held(self) -> tuple[str, ...]:
        """The capabilities this principal holds, in ``CAPABILITIES`` order."""
        return tuple(c for c in CAPABILITIES if self.allows(c))


LOCAL_PRINCIPAL = Principal(id="local", organisation="local", workspaces=None, role="operator")
