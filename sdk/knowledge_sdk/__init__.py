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
    ConnectionConfigError,
    DeadlineExceeded,
    EditionRefused,
    InternalError,
    InvalidRequest,
    KnowledgeError,
    NotFound,
    PermissionDenied,
    RPCError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncKnowledgeClient",
    "ConnectionConfigError",
    "ConnectionSettings",
    "DeadlineExceeded",
    "EditionRefused",
    "InternalError",
    "InvalidRequest",
    "KnowledgeClient",
    "KnowledgeError",
    "NotFound",
    "PermissionDenied",
    "RPCError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "dispatch_request",
    "search_request",
    "types",
]
