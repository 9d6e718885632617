"""Typed errors. Every failure of a call surfaces as a subclass of KnowledgeError;
no raw transport exception escapes the client."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc


class KnowledgeError(Exception):
    """Root of every error the SDK raises."""


@dataclass
class RPCError(KnowledgeError):
    """A call failed with a gRPC status. ``reason`` is the ErrorInfo reason code
    (e.g. ``KNOWLEDGE_INVALID_REQUEST``), ``metadata`` its metadata."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    request_id: str = ""

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}"


class InvalidRequest(RPCError):
    """The request was refused as invalid (INVALID_ARGUMENT)."""


class Unauthenticated(RPCError):
    """Missing or invalid bearer token."""


class PermissionDenied(RPCError):
    """The caller's role or workspaces do not allow the call."""


@dataclass
class EditionRefused(PermissionDenied):
    """The server's edition lacks the feature the RPC needs."""

    feature: str = ""
    required_edition: str = ""
    current_edition: str = ""
    licence_state: str = ""

    def __str__(self) -> str:
        return self.message


class NotFound(RPCError):
    """The addressed item does not exist or is not visible."""


class Unavailable(RPCError):
    """The server could not be reached within the deadline."""


class DeadlineExceeded(RPCError):
    """The call did not finish within its deadline."""


class Unimplemented(RPCError):
    """The server does not implement the operation."""


class InternalError(RPCError):
    """The server failed unexpectedly."""


class ConnectionConfigError(KnowledgeError):
    """The client was configured wrongly (address, TLS files)."""


_BY_CODE: dict[grpc.StatusCode, type[RPCError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: InternalError,
}


def from_rpc_error(exc: grpc.RpcError) -> RPCError:
    """Turn a grpc RpcError (sync or aio) into the typed error, reading rich details."""
    from knowledge_sdk._gen.google import rpc as rpc_types
    from knowledge_sdk._gen.knowledge import v1

    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    message = (exc.details() if callable(getattr(exc, "details", None)) else "") or ""
    trailing = (
        exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else None
    )
    reason = ""
    metadata: dict[str, str] = {}
    refusal = None
    request_id = ""
    for key, value in trailing or ():
        if key == "x-request-id" and isinstance(value, str):
            request_id = value
        if key != "grpc-status-details-bin" or not isinstance(value, (bytes, bytearray)):
            continue
        try:
            status = rpc_types.Status.parse(bytes(value))
        except Exception:  # noqa: BLE001, S112 - undecodable details are ignored, the code stays
            continue
        for detail in status.details:
            name = detail.type_url.rsplit("/", 1)[-1]
            try:
                if name == "google.rpc.ErrorInfo":
                    info = rpc_types.ErrorInfo.parse(detail.value)
                    reason, metadata = info.reason, dict(info.metadata)
                elif name == "knowledge.v1.EditionRefusal":
                    refusal = v1.EditionRefusal.parse(detail.value)
            except Exception:  # noqa: BLE001, S112 - an undecodable detail is skipped, the others stay
                continue
    if refusal is not None:
        return EditionRefused(
            code=code,
            message=refusal.message or message,
            reason=reason or "KNOWLEDGE_EDITION_REQUIRED",
            metadata=metadata,
            request_id=request_id,
            feature=refusal.feature,
            required_edition=refusal.required_edition,
            current_edition=refusal.current_edition,
            licence_state=refusal.licence_state,
        )
    cls = _BY_CODE.get(code, RPCError)
    return cls(code=code, message=message, reason=reason, metadata=metadata, request_id=request_id)
