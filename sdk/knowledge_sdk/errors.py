"""Typed errors. Every failure of a call surfaces as a subclass of KnowledgeError;
no raw transport exception escapes the client.

Each gRPC status code has its own ``RPCError`` subclass; the rich details the server
sends (``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer) are read with
the generated ``google.rpc`` types: ``ErrorInfo`` gives ``reason`` and ``metadata``,
``knowledge.v1.EditionRefusal`` turns a PERMISSION_DENIED into ``EditionRefused``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import betterproto2
import grpc

from knowledge_sdk._gen.google import protobuf as protobuf_types
from knowledge_sdk._gen.google import rpc as rpc_types
from knowledge_sdk._gen.knowledge import v1

_DETAILS_KEY = "grpc-status-details-bin"
# What betterproto2's parser raises on malformed bytes (TypeError: Any.unpack of a type
# this SDK does not know).
_UNDECODABLE = (ValueError, TypeError, KeyError, IndexError, EOFError, OverflowError)


class KnowledgeError(Exception):
    """Root of every error the SDK raises."""


@dataclass
class RPCError(KnowledgeError):
    """A call failed with a gRPC status. ``reason`` is the ErrorInfo reason code
    (e.g. ``KNOWLEDGE_INVALID_REQUEST``), ``metadata`` its metadata."""

    status: ClassVar[grpc.StatusCode | None] = None

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


class Cancelled(RPCError):
    """The call was cancelled (CANCELLED)."""

    status = grpc.StatusCode.CANCELLED


class Unknown(RPCError):
    """The call failed with an unknown error (UNKNOWN)."""

    status = grpc.StatusCode.UNKNOWN


class InvalidRequest(RPCError):
    """The request was refused as invalid (INVALID_ARGUMENT)."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(RPCError):
    """The call did not finish within its deadline (DEADLINE_EXCEEDED; reason
    ``KNOWLEDGE_DEADLINE_EXCEEDED`` when the server noticed it before the client did)."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(RPCError):
    """The addressed item does not exist or is not visible (NOT_FOUND)."""

    status = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RPCError):
    """The item to create exists already (ALREADY_EXISTS)."""

    status = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(RPCError):
    """The caller's role or workspaces do not allow the call (PERMISSION_DENIED)."""

    status = grpc.StatusCode.PERMISSION_DENIED


@dataclass
class EditionRefused(PermissionDenied):
    """The server's edition lacks the feature the RPC needs (PERMISSION_DENIED with an
    ``EditionRefusal`` detail; reason ``KNOWLEDGE_EDITION_REQUIRED``)."""

    feature: str = ""
    required_edition: str = ""
    current_edition: str = ""
    licence_state: str = ""

    def __str__(self) -> str:
        return self.message


class ResourceExhausted(RPCError):
    """A quota or size limit was reached (RESOURCE_EXHAUSTED)."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(RPCError):
    """The service is not in a state to answer, e.g. an index not built yet
    (FAILED_PRECONDITION)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(RPCError):
    """The operation was aborted, e.g. by a concurrent change (ABORTED)."""

    status = grpc.StatusCode.ABORTED


class OutOfRange(RPCError):
    """A value was past the valid range (OUT_OF_RANGE)."""

    status = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(RPCError):
    """The server does not implement the operation (UNIMPLEMENTED)."""

    status = grpc.StatusCode.UNIMPLEMENTED


class InternalError(RPCError):
    """The server failed unexpectedly (INTERNAL)."""

    status = grpc.StatusCode.INTERNAL


class Unavailable(RPCError):
    """The server could not be reached, or a source it needs is down (UNAVAILABLE)."""

    status = grpc.StatusCode.UNAVAILABLE


class DataLoss(RPCError):
    """Unrecoverable data loss or corruption (DATA_LOSS)."""

    status = grpc.StatusCode.DATA_LOSS


class Unauthenticated(RPCError):
    """Missing or invalid bearer token (UNAUTHENTICATED)."""

    status = grpc.StatusCode.UNAUTHENTICATED


class ConnectionConfigError(KnowledgeError):
    """The client was configured wrongly (address, TLS files)."""


class ClientClosed(KnowledgeError):
    """A call on a client that was closed (``close()``, or its ``with`` block ended)."""


BY_CODE: dict[grpc.StatusCode, type[RPCError]] = {
    cls.status: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidRequest,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        InternalError,
        Unavailable,
        DataLoss,
        Unauthenticated,
    )
    if cls.status is not None
}


def _unpack(detail: protobuf_types.Any) -> betterproto2.Message | None:
    """The message inside a detail; None for a type this SDK does not know or bytes it
    cannot decode (the status code stays)."""
    try:
        return detail.unpack()
    except _UNDECODABLE:
        return None


def status_details(trailing: Iterable[tuple[str, str | bytes]] | None) -> rpc_types.Status | None:
    """The ``google.rpc.Status`` the server put in the trailer, if any."""
    for key, value in trailing or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                return rpc_types.Status.parse(value)
            except _UNDECODABLE:
                return None
    return None


def from_status(
    code: grpc.StatusCode,
    message: str,
    trailing: Iterable[tuple[str, str | bytes]] | None = None,
    *,
    address: str = "",
) -> RPCError:
    """The typed error for a status code, its message and the call's trailing metadata.

    An UNAVAILABLE without details did not come from the service (it was not reached):
    its message names ``address``, the address the client tried."""
    request_id = ""
    for key, value in trailing or ():
        if key == "x-request-id" and isinstance(value, str):
            request_id = value
    reason = ""
    metadata: dict[str, str] = {}
    refusal: v1.EditionRefusal | None = None
    status = status_details(trailing)
    for detail in status.details if status else ():
        message_in = _unpack(detail)
        if isinstance(message_in, rpc_types.ErrorInfo):
            reason, metadata = message_in.reason, dict(message_in.metadata)
        elif isinstance(message_in, v1.EditionRefusal):
            refusal = message_in
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
    if code == grpc.StatusCode.UNAVAILABLE and status is None and address:
        message = f"cannot reach the service at {address}: {message}"
    cls = BY_CODE.get(code, RPCError)
    return cls(code=code, message=message, reason=reason, metadata=metadata, request_id=request_id)


def from_rpc_error(exc: grpc.RpcError, *, address: str = "") -> RPCError:
    """Turn a grpc RpcError (sync or aio) into the typed error, reading rich details;
    ``address`` is the address the client tried."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return from_status(
            exc.code(), exc.details() or "", exc.trailing_metadata(), address=address
        )
    if isinstance(exc, grpc.Call):
        return from_status(
            exc.code(), exc.details() or "", exc.trailing_metadata(), address=address
        )
    return from_status(grpc.StatusCode.UNKNOWN, str(exc), address=address)
