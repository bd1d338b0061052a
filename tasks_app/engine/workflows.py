"""The workflow registry: workflows are declared in code with a name and a version.

Only registered workflows and step kinds run. A task keeps the version it was enqueued
under; a worker that does not have that workflow, version or step kind registered never
runs it under other rules: it hands the step back to wait for a worker that has it (a
rolling deploy), and after ``TASKS_VERSION_WAIT_SECONDS`` dead-letters it as
``incompatible_version`` (``unknown_step_kind`` for a missing kind;
``tasks_app.engine.runner``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tasks_app.exceptions import InvalidInput, InvalidPayload, UnknownWorkflow
from tasks_app.models.graphs import Graph, graph_of

if TYPE_CHECKING:
    from tasks_app.engine.effects import Effects
    from tasks_app.engine.limits import Limit
    from tasks_app.models import Step, Task

Handler = Callable[["StepContext"], Any]
# The most rows one fan-out may make (a step row's item is a small integer).
MAX_FAN_OUT = 10_000
PayloadValidator = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class StepSpec:
    """One step kind of a workflow, with its options.

    ``timeout`` bounds one attempt: past it the heartbeat stops renewing the lease, so a
    hung handler loses its lease, is reaped and retried, and its late writes are fenced.
    It is also handed to the handler (``ctx.timeout``) for its own remote calls.

    ``approval`` marks a step a person decides. No worker claims it: its handler is
    called in the transaction that makes the task reach it and returns
    :class:`AwaitDecision`; a dead one is never resolved as done by hand (only a new
    decision lets the task past it).
    """

    kind: str
    handler: Handler
    max_attempts: int = 3
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    timeout: float | None = None
    approval: bool = False
    # Flow control for this step kind (tasks_app.engine.limits), beside its workflow's.
    limits: tuple[Limit, ...] = ()
    # The kinds of the steps it waits for (each declared before it); ``None``, the step
    # declared just before it (a line); ``()``, none: it starts when the task does.
    after: tuple[str, ...] | None = None
    # A fan-out (tasks_app.engine.fan_outs): once the steps it waits for succeeded, it runs
    # once per item of the list ``fan_out(results)`` gives (their results by kind), at most
    # ``max_items``; each run gets its item as ``ctx.item``, and a step after it gets their
    # results as one list.
    fan_out: Callable[[Mapping[str, Any]], Sequence[Any]] | None = None
    max_items: int = 100

    def __post_init__(self) -> None:
        if isinstance(self.after, str):
            raise ValueError(f"step {self.kind}: after takes a tuple of step kinds")
        if not self.kind or ":" in self.kind:
            raise ValueError(f"step kind {self.kind!r}: a non-empty name without ':'")
        if self.max_attempts < 1:
            raise ValueError(f"step {self.kind}: max_attempts must be at least 1")
        if self.backoff_base < 0 or self.backoff_cap < self.backoff_base:
            raise ValueError(f"step {self.kind}: need 0 <= backoff_base <= backoff_cap")
        if self.approval and self.limits:
            raise ValueError(f"step {self.kind}: an approval step runs under no limit")
        if self.fan_out is not None and self.approval:
            raise ValueError(f"step {self.kind}: an approval step cannot fan out")
        if not 1 <= self.max_items <= MAX_FAN_OUT:
            raise ValueError(f"step {self.kind}: max_items must be from 1 to {MAX_FAN_OUT}")

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Capped exponential backoff with full jitter, for the retry after ``attempt``."""
        # The exponent stops where a float would overflow; the cap is far below by then.
        exponent = min(max(attempt - 1, 0), 1023)
        ceiling = min(self.backoff_cap, self.backoff_base * 2.0**exponent)
        return (rng or random).uniform(0, ceiling)


@dataclass(frozen=True)
class Workflow:
    name: str
    version: int
    steps: tuple[StepSpec, ...]
    validate_payload: PayloadValidator | None = None
    description: str = ""
    # Enqueued by the system itself (an approval's mail, a django.tasks call), never by a
    # person: the admin does not offer it, and a refusal of a name does not list it.
    internal: bool = False
    # Flow control for every step of the workflow (tasks_app.engine.limits).
    limits: tuple[Limit, ...] = ()
    # The steps' dependencies by position (from each step's ``after``), set on creation.
    graph: Graph = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError(f"workflow {self.name}: needs at least one step")
        kinds = [step.kind for step in self.steps]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"workflow {self.name}: step kinds must be unique")
        for step in self.steps:
            names = [limit.name for limit in self.limits + step.limits]
            if len(set(names)) != len(names):
                raise ValueError(f"workflow {self.name}: step {step.kind} names a limit twice")
        object.__setattr__(self, "graph", graph_of(self.name, self.steps))

    @property
    def is_line(self) -> bool:
        """Whether each step waits for the one declared before it, and only for it, and
        none fans out."""
        return self.graph.is_line and not any(step.fan_out for step in self.steps)

    def stored_after(self, position: int) -> list[int] | None:
        """What a step row stores of the steps it waits for (``Step.after``): their
        positions in a graph; nothing in a line, where it is the position before."""
        return None if self.is_line else list(self.graph.after[position])

    @property
    def limited(self) -> bool:
        """Whether any of its steps runs under a limit."""
        return bool(self.limits) or any(step.limits for step in self.steps)

    def all_limits(self) -> tuple[Limit, ...]:
        return self.limits + tuple(limit for step in self.steps for limit in step.limits)

    def step(self, position: int) -> StepSpec | None:
        return self.steps[position] if 0 <= position < len(self.steps) else None

    def check_payload(self, payload: dict[str, Any]) -> None:
        """Apply the workflow's own payload rules. They answer :class:`InvalidPayload`
        for any JSON value; a rule that trips over a value it did not expect (a list
        where it wanted text) is still a refusal of that payload, not a crash."""
        if self.validate_payload is None:
            return
        try:
            self.validate_payload(payload)
        except InvalidInput:
            raise
        except Exception as exc:
            raise InvalidPayload(
                "payload",
                "workflow_rules",
                f"payload: refused by the rules of workflow {self.name} "
                f"({type(exc).__name__}: {exc})",
            ) from exc


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workflows: dict[tuple[str, int], Workflow] = {}

    def register(self, workflow: Workflow) -> Workflow:
        with self._lock:
            known = self._workflows.get((workflow.name, workflow.version))
            if known is not None and known != workflow:
                raise ValueError(
                    f"workflow {workflow.name} v{workflow.version} is already registered"
                )
            limits = self.limits()
            for limit in workflow.all_limits():
                if limits.setdefault(limit.name, limit) != limit:
                    raise ValueError(
                        f"workflow {workflow.name}: limit {limit.name} is declared otherwise "
                        "by another workflow; share one Limit object"
                    )
            self._workflows[(workflow.name, workflow.version)] = workflow
        return workflow

    def unregister(self, name: str, version: int) -> None:
        with self._lock:
            self._workflows.pop((name, version), None)

    def get(self, name: str, version: int) -> Workflow | None:
        return self._workflows.get((name, version))

    def latest(self, name: str) -> Workflow:
        versions = [wf for (n, _), wf in self._workflows.items() if n == name]
        if not versions:
            raise unknown_workflow(name, self)
        return max(versions, key=lambda wf: wf.version)

    def names(self) -> list[str]:
        return sorted({name for name, _ in self._workflows})

    def public_names(self) -> list[str]:
        """The workflows a person may choose: not the ones the system enqueues itself."""
        return [name for name in self.names() if not self.latest(name).internal]

    def limits(self) -> dict[str, Limit]:
        """Every limit the registered workflows declare, by name."""
        return {
            limit.name: limit
            for workflow in self._workflows.values()
            for limit in workflow.all_limits()
        }

    def versions(self, name: str) -> list[int]:
        """The versions of ``name`` registered in this process, oldest first."""
        return sorted(version for n, version in self._workflows if n == name)


registry = Registry()
register = registry.register


def unknown_workflow(name: str, known_in: Registry | None = None) -> UnknownWorkflow:
    """The refusal of a workflow name nobody registered: it names the field, the rule and
    the workflows a person may choose (not the internal ones)."""
    known = ", ".join((known_in or registry).public_names()) or "(none)"
    return UnknownWorkflow(
        "workflow", "registered", f"workflow: {name!r} is not a registered workflow; known: {known}"
    )


@dataclass(frozen=True)
class AwaitDecision:
    """Returned by an approval step's handler: the step waits until a person decides.

    ``open_request(task, step)`` runs inside the transaction that reached the step (the
    task row locked), so whatever it records commits together with the step's
    ``waiting_approval`` status and the ``approval_requested`` event; it returns the
    event's data.
    """

    open_request: Callable[[Task, Step], dict[str, Any]]


@dataclass
class StepContext:
    """What a handler gets: its input, earlier results, and its place in the retry story."""

    task_id: int
    step_id: int
    payload: dict[str, Any]
    results: Mapping[str, Any]
    attempt: int
    fencing_token: int
    step_key: str
    effects: Effects
    timeout: float | None = None
    # 0 for the rows made at enqueue; n for rows a request for changes appended.
    revision: int = 0
    # On a revision's first row: what the reviewer asked for (``comment``, ``by``,
    # ``previous_draft``, ``revision``).
    change_request: Mapping[str, Any] | None = None
    # In a fan-out: this run's item, and its index among them (None, 0 elsewhere).
    item: Any = None
    item_index: int = 0
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _lease_lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the task was cancelled: stop at the next safe point."""
        return self._cancelled.is_set()

    @property
    def lease_lost(self) -> bool:
        """True once this attempt lost its lease: its writes will be refused."""
        return self._lease_lost.is_set()

    @property
    def should_stop(self) -> bool:
        return self.cancelled or self.lease_lost
