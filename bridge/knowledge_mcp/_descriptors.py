"""The API's protobuf descriptors, read from the descriptor set that ``scripts/gen_protos.py``
writes next to this module (``_gen/knowledge_v1.binpb``).

The bridge needs what the SDK's betterproto2 classes do not carry: field comments, the
``(knowledge.v1.rules)`` field option, method options, and ``json_format``. The files go into a
private descriptor pool, so a process that also loads the server's generated modules (which
register the same files in the default pool) sees no conflict.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

DESCRIPTOR_SET = "knowledge_v1.binpb"
PACKAGE = "knowledge.v1"
SERVICES = (
    "KnowledgeService",
    "DocGraphService",
    "IndexService",
    "KnowledgeBaseAdminService",
    "KnowledgeBaseService",
    "MemoryService",
)

# FileDescriptorProto / DescriptorProto / ServiceDescriptorProto field numbers, as used in
# SourceCodeInfo.Location.path.
_FILE_MESSAGE, _FILE_SERVICE = 4, 6
_MESSAGE_FIELD, _MESSAGE_NESTED = 2, 3
_SERVICE_METHOD = 2


@cache
def _files() -> tuple[descriptor_pb2.FileDescriptorProto, ...]:
    data = (resources.files("knowledge_mcp") / "_gen" / DESCRIPTOR_SET).read_bytes()
    return tuple(descriptor_pb2.FileDescriptorSet.FromString(data).file)


@cache
def pool() -> descriptor_pool.DescriptorPool:
    """The API's files and their imports (in dependency order, as protoc writes them)."""
    p = descriptor_pool.DescriptorPool()
    for f in _files():
        p.Add(f)
    return p


def _walk(
    msg: descriptor_pb2.DescriptorProto,
    path: tuple[int, ...],
    name: str,
    located: dict[tuple[int, ...], str],
    out: dict[str, str],
) -> None:
    if path in located:
        out[name] = located[path]
    for i, field in enumerate(msg.field):
        if text := located.get((*path, _MESSAGE_FIELD, i)):
            out[f"{name}.{field.name}"] = text
    for i, nested in enumerate(msg.nested_type):
        _walk(nested, (*path, _MESSAGE_NESTED, i), f"{name}.{nested.name}", located, out)


@cache
def comments() -> dict[str, str]:
    """Leading comment of every message, field and method of our files, by full name
    (``knowledge.v1.SearchRequest.query``), whitespace-normalised."""
    out: dict[str, str] = {}
    for f in _files():
        located = {
            tuple(loc.path): " ".join(loc.leading_comments.split())
            for loc in f.source_code_info.location
            if loc.leading_comments.strip()
        }
        for i, msg in enumerate(f.message_type):
            _walk(msg, (_FILE_MESSAGE, i), f"{f.package}.{msg.name}", located, out)
        for i, svc in enumerate(f.service):
            for j, method in enumerate(svc.method):
                if text := located.get((_FILE_SERVICE, i, _SERVICE_METHOD, j)):
                    out[f"{f.package}.{svc.name}.{method.name}"] = text
    return out


def proto_rpcs() -> dict[str, MethodDescriptor]:
    """Every RPC of the API, "package.Service/Method" -> its descriptor."""
    out: dict[str, MethodDescriptor] = {}
    for name in SERVICES:
        svc = pool().FindServiceByName(f"{PACKAGE}.{name}")
        out.update({f"{svc.full_name}/{m.name}": m for m in svc.methods})
    return out


def message_class(desc: Descriptor) -> type[Message]:
    """The protobuf runtime class of a message of the private pool."""
    return message_factory.GetMessageClass(desc)


@cache
def _field_options_class() -> type[Message]:
    return message_class(pool().FindMessageTypeByName("google.protobuf.FieldOptions"))


@cache
def rules(field: FieldDescriptor) -> Any | None:
    """The field's ``(knowledge.v1.rules)`` option (a ``FieldRules`` message), or None.

    ``GetOptions()`` parses options with the default pool's classes, which do not know an
    extension of the private pool; re-parsing them with the private pool's ``FieldOptions``
    makes the extension readable."""
    raw = field.GetOptions().SerializeToString()
    if not raw:
        return None
    options = _field_options_class().FromString(raw)
    # The stubs type extension handles by the generated classes only; this one comes from the
    # private pool at run time.
    ext: Any = pool().FindExtensionByName(f"{PACKAGE}.rules")
    return options.Extensions[ext] if options.HasExtension(ext) else None
