"""Domain errors raised by the application layer.

The transport turns each into a gRPC status with ``google.rpc.Status`` details
(``ErrorInfo`` with the reason code and domain ``knowledge.v1``). Messages are
short, written for the caller, and never contain query text or internals.
"""

from __future__ import annotations

import errno

import apsw
import grpc

DOMAIN = "knowledge.v1"


class KnowledgeError(Exception):
    """Base class: a whole-request failure with a gRPC code and a reason code."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "KNOWLEDGE_INTERNAL"

    def __init__(self, message: str, *, metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = dict(metadata or {})


class InvalidRequest(KnowledgeError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "KNOWLEDGE_INVALID_REQUEST"


class SecretRefused(InvalidRequest):
    """A value to be stored looks like a secret (``redact.looks_like_secret``)."""

    reason = "KNOWLEDGE_SECRET_REFUSED"


class PathOutsideScope(InvalidRequest):
    """A value to be stored names a path outside the caller's workspaces."""

    reason = "KNOWLEDGE_PATH_OUTSIDE_SCOPE"


class NotFound(KnowledgeError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "KNOWLEDGE_NOT_FOUND"


class Unauthenticated(KnowledgeError):
    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "KNOWLEDGE_UNAUTHENTICATED"


class PermissionDenied(KnowledgeError):
    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "KNOWLEDGE_PERMISSION_DENIED"


class EditionRequired(PermissionDenied):
    """The server's edition lacks the feature the call needs (sent with an
    ``EditionRefusal`` detail)."""

    reason = "KNOWLEDGE_EDITION_REQUIRED"


class Unimplemented(KnowledgeError):
    code = grpc.StatusCode.UNIMPLEMENTED
    reason = "KNOWLEDGE_UNIMPLEMENTED"


class Unavailable(KnowledgeError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "KNOWLEDGE_SOURCE_UNAVAILABLE"


class DependencyUnavailable(Unavailable):
    """Retrieval or answering could not finish: a dependency (``dependency`` in the
    metadata: embedder, reranker, chat, index, metadata; server when no retrieval
    thread was free) was down, failing or slower
    than the end-to-end budget. Never turned into "no evidence"."""

    reason = "KNOWLEDGE_DEPENDENCY_UNAVAILABLE"

    def __init__(self, dependency: str, cause: str, *, trace_id: str = "") -> None:
        super().__init__(
            f"the {dependency} is unavailable ({cause}); retry within your own budget",
            metadata={"dependency": dependency, "cause": cause, "trace_id": trace_id},
        )
        self.dependency = dependency
        self.cause = cause


class FailedPrecondition(KnowledgeError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "KNOWLEDGE_INDEX_NOT_READY"


class StaleVersion(FailedPrecondition):
    """A write named a version of its target that is no longer the current one (another
    write came first); nothing was changed. Read the target again and retry."""

    reason = "KNOWLEDGE_STALE_VERSION"


class IllegalTransition(FailedPrecondition):
    """The knowledge-base revision (or task) is not in a state the operation applies to."""

    reason = "KNOWLEDGE_ILLEGAL_TRANSITION"


class DuplicateKey(FailedPrecondition):
    """A key that must be unique in the organisation (``knowledge_key``, ``tag_code``,
    ``template_code``) is taken already."""

    reason = "KNOWLEDGE_DUPLICATE_KEY"


class UnknownTag(InvalidRequest):
    """A tag code that the organisation's dictionary does not hold, or holds inactive."""

    reason = "KNOWLEDGE_UNKNOWN_TAG"


class UnsupportedSource(InvalidRequest):
    """An uploaded file of a type the knowledge base cannot convert."""

    reason = "KNOWLEDGE_UNSUPPORTED_SOURCE"


class ResourceExhausted(KnowledgeError):
    """A quota or a storage limit was reached; ``metadata`` names the limit."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "KNOWLEDGE_QUOTA_EXCEEDED"


class SourceTooLarge(ResourceExhausted):
    """An uploaded file over the size limit (``metadata['limit']`` in bytes)."""

    reason = "KNOWLEDGE_SOURCE_TOO_LARGE"


class StorageFull(ResourceExhausted):
    """The data directory's filesystem is full (SQLITE_FULL, ENOSPC)."""

    reason = "KNOWLEDGE_STORAGE_FULL"


class DeadlineExceeded(KnowledgeError):
    """The caller's deadline passed before the answer was ready (``deadline.py``)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    reason = "KNOWLEDGE_DEADLINE_EXCEEDED"


class InternalError(KnowledgeError):
    code = grpc.StatusCode.INTERNAL
    reason = "KNOWLEDGE_INTERNAL"


STORAGE_FULL_MESSAGE = "the data directory's filesystem is full; free space and retry"


def as_storage_full(exc: BaseException) -> StorageFull | None:
    """``exc`` as a StorageFull when it (or what caused it) is a full disk: SQLite's
    SQLITE_FULL (``apsw.FullError``) or an OSError ENOSPC / EDQUOT; None otherwise."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, StorageFull):
            return seen
        if isinstance(seen, apsw.FullError) or (
            isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)
        ):
            return StorageFull(STORAGE_FULL_MESSAGE, metadata={"resource": "storage"})
        seen = seen.__cause__ or seen.__context__
    return None
