"""`knowledge.dispatch/v1` and the `knowledge.handoff/v1` outbox (seed 000 §14, §14.1)."""

from __future__ import annotations

import asyncio
from typing import Any

from knowledge_server._gen.knowledge.v1 import dispatch_pb2
from knowledge_server.dispatch.planner import (
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


def dispatcher_for(app: Any) -> Dispatcher:
    """A dispatcher over the app's coordinator and lanes (cheap; holds no connections)."""
    from knowledge_server.lanes.derived import dispatch_info

    return Dispatcher(
        coordinator=app.coordinator,
        derived_lane=app.lanes.get("skills"),
        episodes_lane=app.lanes.get("episodes"),
        data_dir=app.config.data_dir,
        dispatch_info=dispatch_info,
    )


async def run_dispatch(
    app: Any, valid: ValidDispatch, scope: tuple[str, ...] | None
) -> dispatch_pb2.DispatchResponse:
    """Plan; on commit also record the assignment and write the outbox package."""
    dispatcher = dispatcher_for(app)
    plan = await dispatcher.plan(valid, scope)
    if valid.dry_run:
        return plan.response
    return await asyncio.to_thread(dispatcher.commit, plan, valid)


__all__ = [
    "EXECUTION",
    "HANDOFF_SCHEMA",
    "REQUIRES",
    "SCHEMA",
    "Dispatcher",
    "ValidDispatch",
    "build_package",
    "dispatcher_for",
    "named_skills",
    "run_dispatch",
    "task_hash",
    "validate_dispatch",
]
