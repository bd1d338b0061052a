"""Graph workflows for the tests: branches that record what they saw and call a remote that
counts its writes, a join, and the helpers that run one step at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from approvals.steps import approval_step, check_workflow
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.exceptions import PermanentError
from tasks_app.models import Step, Task
from tasks_app.workflows import StepContext, StepSpec, Workflow, register, registry
from tests.conftest import backdate


@dataclass
class Remote:
    """An external service that does not honour keys: every call is a write. ``failing``
    names the branches whose calls fail before writing."""

    writes: list[str] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    broken: bool = False

    def branch(self, name: str) -> Callable[[StepContext], dict[str, Any]]:
        def run(ctx: StepContext) -> dict[str, Any]:
            self.seen[name] = dict(ctx.results)
            if name in self.failing:
                raise PermanentError(f"{name}: the remote refused")

            def call(key: str) -> dict[str, Any]:
                self.writes.append(name)
                return {"remote": f"{name}-{len(self.writes)}"}

            written = ctx.effects.run(f"write_{name}", call, idempotent_remote=False)
            return {"branch": name, "written": written}

        return run

    def writes_of(self, name: str) -> int:
        return self.writes.count(name)


def diamond(name: str, remote: Remote, branches: tuple[str, ...] = ("a", "b", "c")) -> Workflow:
    """``start`` -> each branch in parallel -> ``join`` (receives them by name) -> ``finish``."""
    steps = [StepSpec("start", remote.branch("start"))]
    steps += [StepSpec(b, remote.branch(b), after=("start",), max_attempts=1) for b in branches]
    steps.append(StepSpec("join", remote.branch("join"), after=branches))
    steps.append(StepSpec("finish", remote.branch("finish")))
    return Workflow(name, 1, steps=tuple(steps))


@contextmanager
def registered(*flows: Workflow) -> Iterator[None]:
    for flow in flows:
        register(flow)
    try:
        yield
    finally:
        for flow in flows:
            registry.unregister(flow.name, flow.version)


def step_of(task: Task, kind: str) -> Step:
    return Step.objects.current().get(task=task, kind=kind)


def statuses(task: Task) -> dict[str, str]:
    return dict(Step.objects.current().filter(task=task).values_list("kind", "status"))


def run(task: Task, kind: str) -> None:
    """Claim and run the task's step ``kind`` now."""
    step = step_of(task, kind)
    backdate(step)
    assert runner.run_claimed(step.pk), f"step {kind} could not be claimed ({step.status})"


def enqueue(flow: Workflow, key: str | None = None) -> Task:
    return services.enqueue(flow.name, {"n": 1}, idempotency_key=key).task


def translations(name: str, remote: Remote, *, max_items: int = 5) -> Workflow:
    """``plan`` (the languages of the payload) -> ``translate``, fanned out once per
    language -> ``publish``, which joins them. ``remote.failing`` names languages whose
    translation fails; ``remote.broken`` makes the fan-out itself fail."""

    def plan(ctx: StepContext) -> dict[str, Any]:
        return {"languages": ctx.payload["languages"]}

    def languages(results: Any) -> list[str]:
        if remote.broken:
            raise RuntimeError("the language list is unreadable")
        return list(results["plan"]["languages"])

    def translate(ctx: StepContext) -> dict[str, Any]:
        remote.seen[f"translate:{ctx.item}"] = {"index": ctx.item_index, **ctx.results}
        if ctx.item in remote.failing:
            raise PermanentError(f"{ctx.item}: no translator")

        def call(key: str) -> dict[str, Any]:
            remote.writes.append(f"translate:{ctx.item}")
            return {"key": key}

        written = ctx.effects.run("send", call, idempotent_remote=False)
        return {"language": ctx.item, "key": written["key"]}

    return Workflow(
        name,
        1,
        steps=(
            StepSpec("plan", plan),
            StepSpec(
                "translate",
                translate,
                after=("plan",),
                fan_out=languages,
                max_items=max_items,
                max_attempts=1,
            ),
            StepSpec("publish", remote.branch("publish"), after=("translate",)),
        ),
    )


def reviewed_translations(name: str, remote: Remote) -> Workflow:
    """``start`` -> ``draft_en`` and ``draft_fr`` in parallel; an editor reviews the French
    draft (``review_fr``); ``publish`` joins the English draft and the review."""
    return check_workflow(
        Workflow(
            name,
            1,
            steps=(
                StepSpec("start", remote.branch("start")),
                StepSpec("draft_en", remote.branch("draft_en"), after=("start",)),
                StepSpec("draft_fr", remote.branch("draft_fr"), after=("start",)),
                approval_step(
                    "review_fr",
                    draft_from="draft_fr",
                    action="publish",
                    summary="Publish the French draft",
                    group="editors",
                    expires_after=timedelta(hours=4),
                    on_expiry="cancel",
                    after=("draft_fr",),
                ),
                StepSpec("publish", remote.branch("publish"), after=("draft_en", "review_fr")),
            ),
        )
    )
