"""Tool arguments -> a checked request message.

``json_format.ParseDict`` reads the arguments into the request message (proto field names;
an unknown field, a wrong type or a malformed timestamp is refused), then the field rules the
proto declares (``required``, accepted values, bounds, lengths) are checked for every value
the caller gave. The bridge fills the plumbing fields last.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from knowledge_mcp._descriptors import message_class, rules
from knowledge_mcp.schema import PLUMBING, is_map, is_repeated, message_type

INVALID = "KNOWLEDGE_INVALID_REQUEST"


class BridgeError(Exception):
    """A refusal by the bridge itself (bad arguments), reported like a service refusal."""

    def __init__(self, message: str, field: str = "", code: str = INVALID) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def _refuse(where: str, why: str) -> BridgeError:
    return BridgeError(f"{where}: {why}", where)


def _check_names(desc: Descriptor, args: dict[str, Any], prefix: str, top: bool) -> None:
    """Unknown and plumbing fields, with the path in the message (json_format reports
    neither the path nor the plumbing rule)."""
    for key, value in args.items():
        where = prefix + key
        field = desc.fields_by_name.get(key)
        if field is None or (top and key in PLUMBING):
            why = "set by the bridge, not an argument" if field else "unknown field"
            raise _refuse(where, why)
        if is_repeated(field) and not is_map(field) and not isinstance(value, list):
            raise _refuse(where, "must be an array")
        if field.type != FieldDescriptor.TYPE_MESSAGE or is_map(field):
            continue
        if message_type(field).full_name.startswith("google.protobuf."):
            continue
        for item in value if is_repeated(field) and isinstance(value, list) else [value]:
            if isinstance(item, dict):
                _check_names(message_type(field), item, where + ".", False)


_PARSE_AT = re.compile(r" at (?P<path>[\w.]+?)\.*$")


def _parse_error(
    exc: json_format.ParseError, desc: Descriptor, args: dict[str, Any]
) -> BridgeError:
    """A json_format error as "field.path: why". Its text nests "Failed to parse X field:"
    and ends with the path when it knows one; otherwise the field is found by parsing the
    arguments one at a time."""
    text = str(exc).splitlines()[0]
    path = ""
    if m := _PARSE_AT.search(text):
        path = m["path"].partition(".")[2]  # drop the message name
        text = text[: m.start()]
    text = re.sub(r"^(Failed to parse \w+ field: )+", "", text)
    if not path:
        path = next((key for key in args if not _parses(desc, {key: args[key]})), "")
    return _refuse(path, text) if path else BridgeError(f"arguments do not match: {text}")


def _parses(desc: Descriptor, args: dict[str, Any]) -> bool:
    try:
        json_format.ParseDict(args, message_class(desc)())
    except json_format.ParseError:
        return False
    return True


def _empty(value: Any) -> bool:
    if isinstance(value, Message):
        return False
    return not value


def _check_value(field: FieldDescriptor, value: Any, where: str) -> None:
    r = rules(field)
    if r is None:
        return
    if r.values and value not in r.values:
        raise _refuse(where, f"expected one of {', '.join(r.values)}")
    if isinstance(value, int) and not isinstance(value, bool):
        low = r.minimum if r.HasField("minimum") else None
        high = r.maximum if r.HasField("maximum") else None
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"{'' if low is None else low}..{'' if high is None else high}"
            raise _refuse(where, f"must be within {span}")
    if isinstance(value, str) and r.max_length and len(value) > r.max_length:
        raise _refuse(where, f"is longer than {r.max_length} characters")


def _check_rules(desc: Descriptor, args: dict[str, Any], msg: Message, prefix: str) -> None:
    for field in desc.fields:
        where = prefix + field.name
        r = rules(field)
        given = field.name in args
        value = getattr(msg, field.name)
        required = r is not None and r.required and field.name not in PLUMBING
        if required and (not given or _empty(value)):
            raise _refuse(where, "is required")
        if not given or is_map(field):
            continue
        if is_repeated(field):
            if r is not None and r.max_items and len(value) > r.max_items:
                raise _refuse(where, f"has more than {r.max_items} entries")
            for i, item in enumerate(value):
                _check_one(field, args[field.name][i], item, f"{where}[{i}]")
        else:
            _check_one(field, args[field.name], value, where)


def _check_one(field: FieldDescriptor, raw: Any, value: Any, where: str) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        nested = message_type(field)
        if isinstance(raw, dict) and not nested.full_name.startswith("google."):
            _check_rules(nested, raw, value, where + ".")
        return
    _check_value(field, value, where)


def _fill_plumbing(desc: Descriptor, msg: Message) -> None:
    for name in PLUMBING & set(desc.fields_by_name):
        field = desc.fields_by_name[name]
        r = rules(field)
        if name == "request_id":
            setattr(msg, name, f"mcp-{uuid.uuid4().hex}")
        elif r is not None and len(r.values) == 1:
            setattr(msg, name, r.values[0])


def build_request(desc: Descriptor, arguments: dict[str, Any] | None) -> Message:
    """Checked request message of type ``desc`` from tool arguments (proto field names;
    a None value counts as absent)."""
    args = {k: v for k, v in (arguments or {}).items() if v is not None}
    _check_names(desc, args, "", True)
    msg = message_class(desc)()
    try:
        json_format.ParseDict(args, msg)
    except json_format.ParseError as exc:
        raise _parse_error(exc, desc, args) from None
    _check_rules(desc, args, msg, "")
    _fill_plumbing(desc, msg)
    return msg
