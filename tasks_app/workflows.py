"""Where a producer declares its workflows: the names of ``tasks_app.engine.workflows``
that code outside the core uses (``Workflow``, ``StepSpec``, ``register``, the handler's
``StepContext``, ``Limit``...), and its schedules (``Schedule``, ``register_schedule``)."""

from __future__ import annotations

from tasks_app.engine.limits import Limit
from tasks_app.engine.schedules import Missed, Schedule, register_schedule, schedules
from tasks_app.engine.workflows import (
    AwaitDecision,
    Handler,
    PayloadValidator,
    Registry,
    StepContext,
    StepSpec,
    Workflow,
    register,
    registry,
    unknown_workflow,
)

__all__ = [
    "AwaitDecision",
    "Handler",
    "Limit",
    "Missed",
    "PayloadValidator",
    "Registry",
    "Schedule",
    "StepContext",
    "StepSpec",
    "Workflow",
    "register",
    "register_schedule",
    "registry",
    "schedules",
    "unknown_workflow",
]
