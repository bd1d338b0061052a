"""The two paths a step's claim and success can take, for the tests that play one story
through each and compare what they leave (test_parity, test_batch_completions): one by one
through the services, or as a batch through the SQL fast path (``tasks_app.engine.fastpath``).

One by one is ``services.claim_step`` (the ORM claim) and ``services.complete_step`` (the
ORM completion); a batch is ``fastpath.claim_batch`` (``claim_sql``) and
``fastpath.complete_many`` (``COMPLETE_SQL``). ``run`` hands the claim to the runner, which
records a failure with ``services.fail_step`` on either path.

What a task leaves behind is compared as :func:`snapshot` normalises it (ids and times),
by :func:`assert_same`, which shows the difference as a diff.
"""

from __future__ import annotations

import difflib
import pprint
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models.functions import Now

from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import fastpath, runner
from tasks_app.history import timeline
from tasks_app.models import Effect, Lease, Step, Task
from tasks_app.services import Claim
from tests.batch_support import claim_due


@dataclass(frozen=True)
class Path:
    name: str
    # Claim this step, which must be claimable, for ``worker``.
    claim: Callable[[Step, str], Claim]
    # Claim these steps, which must be claimable and the only ones due in their queue, for
    # ``worker``; the claims by step id.
    claim_all: Callable[[list[Step], str], dict[int, Claim]]
    # Record successes; the ids of the steps whose success was accepted.
    complete: Callable[[list[tuple[Claim, Any]]], set[int]]
    # Claim this step and run its handler, recording whatever comes of it.
    run: Callable[[Step], None]


def succeed(path: Path, claim: Claim, result: Any) -> bool:
    """Record one success; True if it was accepted."""
    return path.complete([(claim, result)]) == {claim.step_id}


# --- one by one ---------------------------------------------------------------------------


def _claim_one_by_one(step: Step, worker: str) -> Claim:
    claim = services.claim_step(step.pk, worker_id=worker)
    assert claim is not None, f"step {step.pk} could not be claimed"
    return claim


def _claim_all_one_by_one(steps: list[Step], worker: str) -> dict[int, Claim]:
    return {step.pk: _claim_one_by_one(step, worker) for step in steps}


def _complete_one_by_one(done: list[tuple[Claim, Any]]) -> set[int]:
    return {claim.step_id for claim, result in done if services.complete_step(claim, result)}


def _run_one_by_one(step: Step) -> None:
    assert runner.run_claimed(step.pk), f"step {step.pk} could not be claimed"


# --- as a batch ---------------------------------------------------------------------------


def _claim_as_a_batch(step: Step, worker: str) -> Claim:
    # Named and alone: the batch takes this step and no other task's.
    claims = fastpath.claim_batch(worker_id=worker, limit=1, step_id=step.pk)
    assert [claim.step_id for claim in claims] == [step.pk]
    return claims[0]


def _claim_all_as_a_batch(steps: list[Step], worker: str) -> dict[int, Claim]:
    # The first by name: a step whose lease ran out is claimed only so.
    claims = claim_due(limit=len(steps), worker_id=worker, step_id=steps[0].pk)
    assert set(claims) == {step.pk for step in steps}
    return claims


def _run_as_a_batch(step: Step) -> None:
    runner.run_batch([_claim_as_a_batch(step, runner.worker_id())])


ONE_BY_ONE = Path(
    "one by one", _claim_one_by_one, _claim_all_one_by_one, _complete_one_by_one, _run_one_by_one
)
BATCHED = Path(
    "batch", _claim_as_a_batch, _claim_all_as_a_batch, fastpath.complete_many, _run_as_a_batch
)


# --- what a task leaves behind, with ids and times normalised ------------------------------


def _set(value: object) -> bool:
    return value is not None


def snapshot(task: Task) -> dict[str, Any]:
    """The task's rows and events, comparable with another task's."""
    task.refresh_from_db()
    steps = list(task.steps.order_by("position", "revision", "item"))
    # By the database's clock (rule 3).
    due = set(task.steps.filter(available_at__lte=Now()).values_list("pk", flat=True))
    # A JSON ``null`` and SQL ``NULL`` both read as None; queries tell them apart.
    null_results = set(task.steps.filter(result__isnull=True).values_list("pk", flat=True))
    place = {
        step.pk: f"{step.position}.{step.revision}" + (f"#{step.item}" if step.item else "")
        for step in steps
    }
    requests = list(ApprovalRequest.objects.filter(task=task).order_by("pk"))
    request_place = {request.pk: f"request of {place[request.step_id]}" for request in requests}

    def step_key(key: str) -> str:
        # "<task key or task-<id>>:<position>:<kind>[:r<n>]": the task's part differs.
        assert key.startswith(task.key + ":"), key
        return "<task>" + key.removeprefix(task.key)

    def data(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        normal: dict[str, Any] = {}
        for name, item in value.items():
            if name == "steps":
                normal[name] = {place[int(pk)]: state for pk, state in item.items()}
            elif name == "request":
                normal[name] = request_place[item]
            elif name == "retry_in":
                # Full jitter: a random delay, compared as present or not.
                normal[name] = "<jittered delay>" if item is not None else None
            elif name.endswith("_at"):
                normal[name] = "<time>" if item is not None else None
            else:
                normal[name] = data(item)
        return normal

    return {
        "task": {
            "workflow": task.workflow,
            "status": task.status,
            "payload_hash": task.payload_hash,
            "created_by": task.created_by,
            "finished_at": _set(task.finished_at),
            "cancel_requested_at": _set(task.cancel_requested_at),
        },
        "steps": [
            {
                "step": place[step.pk],
                "kind": step.kind,
                "status": step.status,
                "attempts": step.attempts,
                "max_attempts": step.max_attempts,
                "fencing_token": step.fencing_token,
                "result": step.result,
                "result_is_sql_null": step.pk in null_results,
                "error_class": step.error_class,
                "last_error": step.last_error,
                "idempotency_key": step_key(step.idempotency_key),
                "change_request": step.change_request,
                "after": step.after,
                "item": step.item,
                "queue": step.queue,
                "available_at": None
                if step.available_at is None
                else ("due" if step.pk in due else "later"),
                "dispatched_at": _set(step.dispatched_at),
                "lease_expires_at": _set(step.lease_expires_at),
                "started_at": _set(step.started_at),
                "finished_at": _set(step.finished_at),
            }
            for step in steps
        ],
        "leases": [
            {
                "step": place[lease.step_id],
                "token": lease.token,
                "attempt": lease.attempt,
                "worker_id": lease.worker_id,
                "outcome": lease.outcome,
                "released_at": _set(lease.released_at),
                "length": (lease.expires_at - lease.acquired_at).total_seconds(),
            }
            for lease in Lease.objects.filter(step__task=task).order_by("step_id", "token")
        ],
        "events": [
            {
                "kind": event.kind,
                "step": place[event.step_id] if event.step_id is not None else None,
                "actor": event.actor,
                "actor_user_id": event.actor_user_id,
                "reason": event.reason,
                "data": data(event.data),
            }
            for event in timeline.history(task.pk)
        ],
        "approval_requests": [
            {
                "request": request_place[request.pk],
                "status": request.status,
                "revision": request.revision,
                "action": request.action,
                "summary": request.summary,
                "draft": request.draft,
                "draft_hash": request.draft_hash,
                "draft_step": request.draft_step,
                "approver_group": request.approver_group,
                "on_expiry": request.on_expiry,
                "requested_by": request.requested_by,
                "decided_by": request.decided_by,
                "expires_at": _set(request.expires_at),
                "decided_at": _set(request.decided_at),
            }
            for request in requests
        ],
        "effects": [
            {
                "step": place[effect.step_id],
                "key": step_key(effect.key),
                "token": effect.token,
                "status": effect.status,
                "result": effect.result,
            }
            for effect in Effect.objects.filter(step__task=task).order_by("pk")
        ],
    }


class PathsDiffer(AssertionError):
    """The two paths left different rows or events (a known one is marked xfail with it)."""


def assert_same(
    one: dict[str, Any],
    batched: dict[str, Any],
    names: tuple[str, str] = (ONE_BY_ONE.name, BATCHED.name),
) -> None:
    if batched == one:
        return
    lines = difflib.unified_diff(
        pprint.pformat(one, width=100).splitlines(),
        pprint.pformat(batched, width=100).splitlines(),
        fromfile=names[0],
        tofile=names[1],
        lineterm="",
    )
    raise PathsDiffer("the paths differ:\n" + "\n".join(lines))
