"""Method policies read from the proto's ``(knowledge.v1.policy)`` option.

The table is built from the compiled descriptors, so the proto stays the single
source of truth for the edition gate, the role check and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass

from knowledge_server._gen.knowledge.v1 import (
    docgraph_pb2,
    index_service_pb2,
    kb_admin_pb2,
    kb_retrieve_pb2,
    knowledge_service_pb2,
    memory_pb2,
    options_pb2,
)
from knowledge_server.auth_model import Principal
from knowledge_server.errors import PermissionDenied

# Every file that declares a service: a method missing here would get the default policy
# (right "read") instead of the capabilities its proto declares.
FILES = (
    knowledge_service_pb2,
    docgraph_pb2,
    index_service_pb2,
    kb_admin_pb2,
    kb_retrieve_pb2,
    memory_pb2,
)

EDITION_NAMES = {
    options_pb2.EDITION_UNSPECIFIED: "community",
    options_pb2.EDITION_COMMUNITY: "community",
    options_pb2.EDITION_PRO: "pro",
    options_pb2.EDITION_ENTERPRISE: "enterprise",
}

READ = "read"
MANAGE = "manage"

# The capability each declared right needs (``auth_model.CAPABILITIES``).
RIGHTS: dict[int, str] = {
    options_pb2.RIGHT_UNSPECIFIED: READ,
    options_pb2.RIGHT_READ: READ,
    options_pb2.RIGHT_MANAGE: MANAGE,
    options_pb2.RIGHT_MEMORY_READ: "memory.read",
    options_pb2.RIGHT_MEMORY_WRITE: "memory.write",
}


@dataclass(frozen=True)
class Policy:
    feature: str = ""
    edition: options_pb2.Edition.ValueType = options_pb2.EDITION_COMMUNITY
    right: str = READ
    # When set: the caller must hold one of these capabilities (instead of ``right``).
    capabilities: tuple[str, ...] = ()

    def allows(self, principal: Principal) -> bool:
        if self.capabilities:
            return any(principal.allows(c) for c in self.capabilities)
        return principal.allows(self.right)

    def needs(self) -> str:
        """What the caller lacks when refused, for the message."""
        if self.capabilities:
            return " or ".join(repr(c) for c in self.capabilities)
        return repr(self.right)

    def refusal(self, principal: Principal, method: str) -> PermissionDenied:
        """The error for ``principal`` calling ``method`` (``/package.Service/Method``)
        without the right; the same on every face (gRPC, HTTP)."""
        return PermissionDenied(
            f"role {principal.role!r} may not call {method.rsplit('/', 1)[-1]}:"
            f" it needs the {self.needs()} capability, which this token does not hold"
        )


def _load() -> dict[str, Policy]:
    table: dict[str, Policy] = {}
    for module in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                opt = method.GetOptions().Extensions[options_pb2.policy]
                right = RIGHTS[opt.right]
                table[f"/{service.full_name}/{method.name}"] = Policy(
                    opt.feature, opt.edition, right, tuple(opt.capabilities)
                )
    return table


POLICIES: dict[str, Policy] = _load()


def service_methods() -> dict[str, list[str]]:
    """Service full name -> method names, for the surface-parity checks."""
    out: dict[str, list[str]] = {}
    for module in FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            out[service.full_name] = [m.name for m in service.methods]
    return out
