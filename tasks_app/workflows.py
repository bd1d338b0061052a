"""Where a producer declares its workflows: the names of ``tasks_app.engine.workflows``
that code outside the core uses (``Workflow``, ``StepSpec``, ``register``, the handler's
``StepContext``, ``Limit``...)."""

from __future__ import annotations

from tasks_app.engine.limits import Limit
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
    "PayloadValidator",
    "Registry",
    "StepContext",
    "StepSpec",
    "Workflow",
    "register",
    "registry",
    "unknown_workflow",
]
