"""Size limits of every request, read from the proto's ``(knowledge.v1.rules)`` option.

``max_items`` (elements of a repeated field) and ``max_length`` (characters of a string,
of each element of a repeated one) are declared once in the proto and checked here for
every RPC's request, in the transport, before the application sees it: a new field with a
declared limit cannot be forgotten, and an oversized request is refused in time
proportional to the number of declared fields, not to its size. The other rules
(``required``, ``values``, bounds) stay with the application's own checks, which give
each its specific message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from knowledge_server._gen.knowledge.v1 import options_pb2
from knowledge_server.errors import InvalidRequest


@dataclass(frozen=True)
class _Limit:
    name: str
    repeated: bool
    max_items: int
    max_length: int  # 0 = none, or not a string field
    nested: Descriptor | None  # message type holding limits of its own


_plans: dict[str, tuple[_Limit, ...]] = {}


def _plan(desc: Descriptor, seen: frozenset[str] = frozenset()) -> tuple[_Limit, ...]:
    """The limits to check in a message of this type (cached per type)."""
    cached = _plans.get(desc.full_name)
    if cached is not None:
        return cached
    out = []
    for field in desc.fields:
        rules = field.GetOptions().Extensions[options_pb2.rules]
        repeated = field.is_repeated
        is_string = field.type == FieldDescriptor.TYPE_STRING
        max_length = rules.max_length if is_string else 0
        nested = None
        sub = field.message_type
        if sub is not None and sub.full_name not in seen and not sub.GetOptions().map_entry:
            if _plan(sub, seen | {desc.full_name}):
                nested = sub
        if rules.max_items or max_length or nested is not None:
            out.append(_Limit(field.name, repeated, rules.max_items, max_length, nested))
    plan = tuple(out)
    _plans[desc.full_name] = plan
    return plan


def _bad(path: str, why: str, limit: int) -> InvalidRequest:
    return InvalidRequest(f"{path}: {why}", metadata={"field": path, "limit": str(limit)})


def check_limits(message: Message, prefix: str = "") -> None:
    """Raise ``InvalidRequest`` naming the field and the limit when a declared
    ``max_items`` or ``max_length`` is exceeded anywhere in ``message``."""
    for limit in _plan(cast(Descriptor, message.DESCRIPTOR)):
        path = prefix + limit.name
        if limit.repeated:
            values = getattr(message, limit.name)
            if limit.max_items and len(values) > limit.max_items:
                raise _bad(path, f"has more than {limit.max_items} entries", limit.max_items)
            if limit.max_length:
                for value in values:
                    if len(value) > limit.max_length:
                        raise _bad(
                            path,
                            f"has an entry longer than {limit.max_length} characters",
                            limit.max_length,
                        )
            if limit.nested is not None:
                for i, item in enumerate(values):
                    check_limits(item, f"{path}[{i}].")
        elif limit.max_length:
            if len(getattr(message, limit.name)) > limit.max_length:
                raise _bad(path, f"is longer than {limit.max_length} characters", limit.max_length)
        elif limit.nested is not None and message.HasField(limit.name):
            check_limits(getattr(message, limit.name), path + ".")


def unlimited_repeated_fields(desc: Descriptor) -> list[str]:
    """Repeated fields of ``desc`` and the message types under it without a declared
    ``max_items`` (for the test that every request field is capped)."""
    found: list[str] = []

    def walk(d: Descriptor, prefix: str, seen: frozenset[str]) -> None:
        for field in d.fields:
            rules = field.GetOptions().Extensions[options_pb2.rules]
            if field.is_repeated and not rules.max_items:
                found.append(prefix + field.name)
            sub = field.message_type
            if sub is not None and sub.full_name not in seen:
                walk(sub, f"{prefix}{field.name}.", seen | {sub.full_name})

    walk(desc, "", frozenset({desc.full_name}))
    return found
