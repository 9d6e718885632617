"""The edition a server runs in, as the application and the edition gate see it.

Kept apart from the transport so the application layer can report it (GetStatus)
without importing anything gRPC-specific; the licence watcher (``runtime.py``)
provides the real view, the gate (``transport/interceptors.py``) enforces it."""

from __future__ import annotations

from dataclasses import dataclass

from knowledge_server._gen.knowledge.v1 import index_service_pb2


@dataclass(frozen=True)
class EditionState:
    edition: str
    features: frozenset[str]
    licence_state: str


class LicenceView:
    """Edition state for the gate and GetStatus: Community with no licence. The real
    server uses the licence watcher (``runtime.WatchedLicence``)."""

    def edition(self) -> EditionState:
        return EditionState("community", frozenset(), "missing")

    def status(self) -> index_service_pb2.EditionStatus:
        e = self.edition()
        return index_service_pb2.EditionStatus(
            edition=e.edition,
            licence_state=e.licence_state,
            reason="no licence file",
            features=sorted(e.features),
        )

    def reload(self) -> None:
        """Re-read the licence (SIGHUP). Nothing to re-read without a licence file."""
