"""`knowledge.dispatch/v1` and the `knowledge.handoff/v1` outbox (seed 000 §14, §14.1)."""

from __future__ import annotations

from pathlib import Path

from knowledge_server._gen.knowledge.v1 import search_pb2
from knowledge_server.dispatch.outbox import Committer
from knowledge_server.dispatch.planner import (
    DEFAULT_OUTBOX_QUOTA,
    EXECUTION,
    HANDOFF_SCHEMA,
    REQUIRES,
    SCHEMA,
    Dispatcher,
    ValidDispatch,
    build_package,
    named_skills,
    task_hash,
    validate_dispatch,
)
from knowledge_server.lanes.contract import Lanes
from knowledge_server.search.coordinator import Coordinator


def dispatcher_for(
    coordinator: Coordinator,
    lanes: Lanes,
    data_dir: Path,
    outbox_quota: int = DEFAULT_OUTBOX_QUOTA,
) -> Dispatcher:
    """A dispatcher over the app's coordinator and lanes (cheap; holds no connections)."""
    skills = lanes.skills

    def reach(kind: str, harness: str, _outbox: Path) -> search_pb2.DispatchInfo:
        if skills is None:
            return search_pb2.DispatchInfo(
                mode="none", available=False, reason="no derived layer on this server"
            )
        return skills.dispatch_info(kind, harness)

    return Dispatcher(
        coordinator=coordinator,
        derived_lane=skills,
        episodes_lane=lanes.episodes,
        data_dir=data_dir,
        dispatch_info=reach,
        outbox_quota=outbox_quota,
    )


__all__ = [
    "EXECUTION",
    "HANDOFF_SCHEMA",
    "REQUIRES",
    "SCHEMA",
    "Committer",
    "Dispatcher",
    "ValidDispatch",
    "build_package",
    "dispatcher_for",
    "named_skills",
    "task_hash",
    "validate_dispatch",
]
