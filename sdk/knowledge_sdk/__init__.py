"""Typed Python SDK for the Knowledge Service.

``KnowledgeClient`` (sync) and ``AsyncKnowledgeClient`` (async) expose one method
per RPC; messages are the typed classes in ``knowledge_sdk.types``; failures raise
``knowledge_sdk.errors`` exceptions (root: ``KnowledgeError``).
"""

from knowledge_sdk import types
from knowledge_sdk.client import (
    AsyncKnowledgeClient,
    ConnectionSettings,
    KnowledgeClient,
    dispatch_request,
    search_request,
)
from knowledge_sdk.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    ClientClosed,
    ConnectionConfigError,
    DataLoss,
    DeadlineExceeded,
    EditionRefused,
    FailedPrecondition,
    InternalError,
    InvalidRequest,
    KnowledgeError,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    RPCError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from knowledge_sdk.kb import upload_file

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncKnowledgeClient",
    "Cancelled",
    "ClientClosed",
    "ConnectionConfigError",
    "ConnectionSettings",
    "DataLoss",
    "DeadlineExceeded",
    "EditionRefused",
    "FailedPrecondition",
    "InternalError",
    "InvalidRequest",
    "KnowledgeClient",
    "KnowledgeError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "RPCError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "dispatch_request",
    "search_request",
    "types",
    "upload_file",
]
