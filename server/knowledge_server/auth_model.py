"""Principals and roles (the data model; token storage lives in knowledge_server.auth)."""

from __future__ import annotations

from dataclasses import dataclass

ROLE_RIGHTS = {"agent": frozenset({"read"}), "operator": frozenset({"read", "manage"})}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. Its organisation and workspaces come from the token,
    never from a request body. ``workspaces=None`` means every configured workspace."""

    id: str
    organisation: str
    workspaces: tuple[str, ...] | None
    role: str

    def allows(self, right: str) -> bool:
        return right in ROLE_RIGHTS.get(self.role, frozenset())


LOCAL_PRINCIPAL = Principal(id="local", organisation="local", workspaces=None, role="operator")
