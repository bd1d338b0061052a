"""Helpers for tests of the approval workflows: fake remotes on loopback, and running a
task's due steps in this process until it waits for a person or settles."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models.functions import Now

from approvals.models import ApprovalRequest, ApprovalStatus
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Step, StepStatus, Task
from tests.conftest import backdate

ARTICLE = {"article_id": "article-001", "title": "Launch day", "brief": "What ships and why."}
TICKET = {"ticket_id": "T-42", "customer_id": "acme-corp", "message": "My invoice is wrong."}


def article(actor: Any = "cli:producer", key: str = "publish:article-001:v1") -> Task:
    return services.enqueue("publish_article", ARTICLE, idempotency_key=key, actor=actor).task


def ticket(actor: Any = "cli:producer", key: str = "reply:T-42") -> Task:
    return services.enqueue("ticket_reply", TICKET, idempotency_key=key, actor=actor).task


def press_release(actor: Any = "cli:producer", key: str = "press:article-001") -> Task:
    """Two editors must approve it (quorum 2); senior editors may decide after 8 hours."""
    return services.enqueue("press_release", ARTICLE, idempotency_key=key, actor=actor).task


def notice_task(request: ApprovalRequest, kind: str) -> Task | None:
    """The ``approvals.notify`` task of ``request``'s notice of ``kind``, if enqueued."""
    return services.get_task(idempotency_key=f"approvals:notify:{request.pk}:{kind}")


def mailable(user: User) -> User:
    """``user``, given an address, so that notices reach them."""
    user.email = f"{user.username}@newsroom.example"
    user.save(update_fields=["email"])
    return user


def advance(task: Task, *, skip_backoff: bool = False, rounds: int = 10) -> Task:
    """Run the task's due steps in this process until none is due; return it fresh.

    With ``skip_backoff`` a retry's wait is skipped by back-dating the step.
    """
    for _ in range(rounds):
        if skip_backoff:
            for step in task.steps.filter(status=StepStatus.PENDING, available_at__gt=Now()):
                backdate(step)
        if not runner.run_task_steps(task):
            break
    task.refresh_from_db()
    return task


def pending_request(task: Task) -> ApprovalRequest:
    return ApprovalRequest.objects.get(task=task, status=ApprovalStatus.PENDING)


def current(task: Task, kind: str) -> Step:
    return task.steps.exclude(status=StepStatus.SUPERSEDED).get(kind=kind)


def result_of(task: Task, kind: str) -> Any:
    step = current(task, kind)
    assert step.result is not None, f"step {kind} has no result"
    return step.result
