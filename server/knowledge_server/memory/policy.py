"""The memory policy (seed 004, ``knowledge.policy/v1``): capacities, retrieval budgets and
lifecycle parameters, read from the ``[memory.knowledge]`` and ``[memory.lifecycle]`` tables
of the server's configuration file, then ``KNOWLEDGE_MEMORY_<KEY>`` environment variables,
each validated against its range.

``reclaim_target`` is the one formula for the size a full store is brought down to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = [
    "KNOWLEDGE_KEYS",
    "LIFECYCLE_KEYS",
    "SCHEMA_VERSION",
    "STORES",
    "MemoryPolicy",
    "PolicyError",
    "PolicyOutOfRange",
    "load_policy",
    "reclaim_target",
]

SCHEMA_VERSION = 1

# The stores of one workspace's memory; each is bounded by its own ``max_*``.
STORES: tuple[str, ...] = ("facts", "patterns", "history", "procedures", "relations")


class PolicyError(ValueError):
    """A policy value is invalid; the message names the key and where it came from."""


@dataclass(frozen=True)
class MemoryPolicy:
    # [memory.knowledge]
    max_facts: int = 200
    max_patterns: int = 50
    max_history: int = 100
    max_procedures: int = 50
    max_relations: int = 200
    contradiction_threshold: float = 0.5
    recall_facts_limit: int = 10
    rooms_limit: int = 25
    timeline_limit: int = 25
    relations_limit: int = 40
    # [memory.lifecycle]
    decay_rate: float = 0.01
    low_confidence_threshold: float = 0.3
    stale_days: int = 30
    similarity_threshold: float = 0.85
    reclaim_headroom_pct: float = 0.25
    reclaim_enabled: bool = True

    def capacity(self, store: str) -> int:
        return int(getattr(self, f"max_{store}"))

    def as_tables(self) -> dict[str, dict[str, Any]]:
        """The policy as the TOML tables it is read from."""
        values = asdict(self)
        return {
            "knowledge": {k: values[k] for k in KNOWLEDGE_KEYS},
            "lifecycle": {k: values[k] for k in LIFECYCLE_KEYS},
        }


KNOWLEDGE_KEYS: tuple[str, ...] = (
    "max_facts",
    "max_patterns",
    "max_history",
    "max_procedures",
    "max_relations",
    "contradiction_threshold",
    "recall_facts_limit",
    "rooms_limit",
    "timeline_limit",
    "relations_limit",
)
LIFECYCLE_KEYS: tuple[str, ...] = (
    "decay_rate",
    "low_confidence_threshold",
    "stale_days",
    "similarity_threshold",
    "reclaim_headroom_pct",
    "reclaim_enabled",
)

# Inclusive ranges of every numeric key.
RANGES: dict[str, tuple[float, float]] = {
    "max_facts": (1, 100_000),
    "max_patterns": (1, 100_000),
    "max_history": (1, 100_000),
    "max_procedures": (1, 100_000),
    "max_relations": (1, 100_000),
    "contradiction_threshold": (0.0, 1.0),
    "recall_facts_limit": (1, 200),
    "rooms_limit": (1, 500),
    "timeline_limit": (1, 500),
    "relations_limit": (1, 1000),
    "decay_rate": (0.0, 1.0),
    "low_confidence_threshold": (0.0, 1.0),
    "stale_days": (0, 3650),
    "similarity_threshold": (0.0, 1.0),
    # 0 would reclaim nothing (a reclaim at every write), 1 would empty the store.
    "reclaim_headroom_pct": (0.01, 0.9),
}

ENV_PREFIX = "KNOWLEDGE_MEMORY_"


def reclaim_target(maximum: int, headroom_pct: float) -> int:
    """The size a store that reached ``maximum`` is brought down to: ``maximum`` less the
    headroom, rounded down, and at least one below ``maximum`` so that a reclaim always
    makes room (the next reclaim then waits for that many writes)."""
    target = math.floor(maximum * (1.0 - headroom_pct))
    return max(0, min(target, maximum - 1))


def _described(value: Any) -> str:
    """A value as the error names it, with its TOML type where the type is the fault."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _typed(name: str, kind: type, value: Any, source: str) -> Any:
    """A value from the configuration file, where TOML has already typed it: it must have
    the key's own type (an integer key an integer, a fraction key a number, a switch true
    or false). A string is refused, not converted: ``max_facts = "200"`` is a mistake the
    file's author should hear of, as the documentation promises."""
    if kind is bool:
        ok, expected = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        expected = "a number"
        if ok and math.isnan(value):
            ok = False
    if not ok:
        raise PolicyError(
            f"memory.{name} (from {source}): expected {expected}, got {_described(value)}"
        )
    return float(value) if kind is float else value


def _parsed(name: str, kind: type, text: str, source: str) -> Any:
    """A value from an environment variable, which is text: read as the key's type."""
    try:
        if kind is bool:
            word = text.strip().lower()
            if word in ("1", "true", "yes", "on"):
                return True
            if word in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {text!r}")
        if kind is int:
            return int(text)
        number = float(text)
        if math.isnan(number):
            raise ValueError("expected a number, got NaN")
        return number
    except ValueError as exc:
        raise PolicyError(f"memory.{name} (from {source}): {exc}") from None


class PolicyOutOfRange(PolicyError):
    """A value of the right type outside its key's range."""


def validate(policy: MemoryPolicy, source: str = "policy") -> MemoryPolicy:
    for name, (low, high) in RANGES.items():
        value = getattr(policy, name)
        if not low <= value <= high:
            raise PolicyOutOfRange(
                f"memory.{name} (from {source}): {value} is out of range {low:g}..{high:g}"
            )
    return policy


def load_policy(
    tables: Mapping[str, Any] | None, env: Mapping[str, str], source: str = "config file"
) -> MemoryPolicy:
    """The policy from a ``[memory]`` table (``knowledge`` and ``lifecycle`` sub-tables) and
    the environment (``KNOWLEDGE_MEMORY_MAX_FACTS=...``: env wins). Unknown keys, wrong
    types and values out of range are refused with a message naming the key (a value out
    of range as ``PolicyOutOfRange``)."""
    types = {f.name: f.type for f in fields(MemoryPolicy)}
    kinds = {name: {"int": int, "float": float, "bool": bool}[str(t)] for name, t in types.items()}
    values: dict[str, Any] = {}
    if tables is not None and not isinstance(tables, Mapping):
        raise PolicyError(
            f"memory (from {source}): expected a table ([memory.knowledge],"
            f" [memory.lifecycle]), got {_described(tables)}"
        )
    for table, keys in (("knowledge", KNOWLEDGE_KEYS), ("lifecycle", LIFECYCLE_KEYS)):
        raw = (tables or {}).get(table, {})
        if not isinstance(raw, Mapping):
            raise PolicyError(
                f"memory.{table} (from {source}): expected a table, got {_described(raw)}"
            )
        for key, value in raw.items():
            if key not in keys:
                raise PolicyError(f"memory.{table} (from {source}): unknown key {key!r}")
            values[key] = _typed(key, kinds[key], value, source)
    for extra in set(tables or {}) - {"knowledge", "lifecycle"}:
        raise PolicyError(f"memory (from {source}): unknown table {extra!r}")
    policy = validate(replace(MemoryPolicy(), **values), source)
    for name in kinds:
        env_name = ENV_PREFIX + name.upper()
        if env.get(env_name, "") != "":
            value = _parsed(name, kinds[name], env[env_name], f"environment {env_name}")
            policy = validate(replace(policy, **{name: value}), f"environment {env_name}")
    return policy
