"""Tasks with a history worth reading point by point, for the tests of a task as of any of
its events (the reader, its page, the browser): a graph whose branch died and was redriven
with an edited payload, and a step whose external write was left in doubt and then marked
done by hand. Their steps run in this process (``tests.graph_support``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.history.timeline import history
from tasks_app.models import Task, TaskStatus
from tasks_app.workflows import StepContext, StepSpec, Workflow
from tests.graph_support import Remote, diamond, registered, run

OLD = {"title": "Old", "n": 1}
NEW = {"title": "New", "n": 1}
ONCALL = "cli:olivia"


@contextmanager
def redriven_diamond(name: str = "test.as_of.diamond", key: str = "k") -> Iterator[Task]:
    """``start`` -> ``a``, ``b``, ``c`` -> ``join`` -> ``finish``, each writing through the
    ledger (``<key>:<position>:<kind>:write_<kind>``). ``b``'s remote refused, so it died;
    on-call redrove the task with the title changed from ``Old`` to ``New``, and it ran to
    the end."""
    remote = Remote(failing={"b"})
    flow = diamond(name, remote)
    with registered(flow):
        task = services.enqueue(flow.name, OLD, idempotency_key=key, actor="cli:producer").task
        for kind in ("start", "a", "c", "b"):
            run(task, kind)
        remote.failing.clear()
        services.redrive(task, actor=ONCALL, reason="the remote is back", payload=NEW)
        for kind in ("b", "join", "finish"):
            run(task, kind)
        task.refresh_from_db()
        assert task.status == TaskStatus.SUCCEEDED, task.status
        yield task


def in_doubt_flow(name: str) -> Workflow:
    """One step whose remote call times out after sending: its write is started with no
    result, and the step dies not knowing whether it happened."""

    def send(ctx: StepContext) -> Any:
        def call(key: str) -> Any:
            raise TimeoutError("no answer from the mail server")

        return ctx.effects.run("send", call, idempotent_remote=False)

    return Workflow(name, 1, steps=(StepSpec("send", send, max_attempts=1),))


@contextmanager
def resolved_in_doubt(name: str = "test.as_of.in_doubt", key: str = "mail:1") -> Iterator[Task]:
    """A task whose write was left in doubt, then marked done by on-call (it happened)."""
    flow = in_doubt_flow(name)
    with registered(flow):
        task = services.enqueue(flow.name, {}, idempotency_key=key).task
        runner.run_task_steps(task)
        task.refresh_from_db()
        assert task.status == TaskStatus.DEAD, task.status
        services.resolve(task, actor=ONCALL, reason="the mail went out", outcome="done")
        task.refresh_from_db()
        yield task


def point_of(task: Task, kind: str, *, nth: int = 0, step: int | None = None) -> int:
    """The index in ``task``'s history of its ``nth`` entry of ``kind`` (of step ``step``)."""
    found = [
        index
        for index, entry in enumerate(history(task.pk))
        if entry.kind == kind and (step is None or entry.step_id == step)
    ]
    return found[nth]
