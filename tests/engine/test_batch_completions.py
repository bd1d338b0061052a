"""Completing in batches (``fastpath.complete_many``): each success is recorded, its result
stored exactly, the next step made due and rung for after commit; a stale, repeated or
forged completion is refused while the rest of its batch is accepted; a task cancelled
while its step ran ends cancelled; and the batch path leaves the same states and history
as the one-step path. Batches keep every guarantee of the one-step path (DESIGN rules 1,
2, 3, 8 and 10), on PostgreSQL.

Time moves by back-dating rows (``backdate``), never by sleeping. The doorbell rung after
commit needs a real commit, so its test is transactional.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from tasks_app import services
from tasks_app.engine import fastpath
from tasks_app.history import timeline
from tasks_app.models import EventKind, Lease, Step, StepStatus, Task, TaskStatus
from tasks_app.services import Claim
from tests.batch_support import claim_due, noops
from tests.conftest import BrokerView, backdate, event_kinds, only_step
from tests.lease_support import LEASE, WORKER, attempts_of, events, fresh, step_at
from tests.parity_support import BATCHED, ONE_BY_ONE, Path

# --- completing a batch -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_batch_of_completions_is_accepted_and_each_step_succeeds() -> None:
    steps = noops(5)
    claims = claim_due()

    accepted = fastpath.complete_many([(claims[s.pk], {"n": i}) for i, s in enumerate(steps)])

    assert accepted == {s.pk for s in steps}
    for i, step in enumerate(map(fresh, steps)):
        assert (step.status, step.attempts, step.fencing_token) == (StepStatus.SUCCEEDED, 1, 1)
        assert step.result == {"n": i}
        assert step.finished_at is not None
        assert step.lease_expires_at is None
        lease = Lease.objects.get(step=step)
        assert lease.outcome == Lease.Outcome.SUCCEEDED
        assert lease.released_at is not None
        task = Task.objects.get(pk=step.task_id)
        assert task.status == TaskStatus.SUCCEEDED
        assert task.finished_at is not None
        assert event_kinds(task) == ["enqueued", "claimed", "succeeded"]
        [succeeded] = events(task, EventKind.SUCCEEDED)
        assert (succeeded.step_id, succeeded.actor) == (step.pk, f"worker:{WORKER}")
        assert succeeded.data == {
            "steps": {str(step.pk): [StepStatus.SUCCEEDED, 1, 1]},
            "token": 1,
            "task_status": TaskStatus.SUCCEEDED,
        }


RESULTS: list[Any] = [
    {},
    {"nested": {"list": [1, 2.5, None, True, False], "empty": {}, "deep": [[["x"]]]}},
    {"text": 'naïve café ☕ 名前 "quoted" \\ back\nslash', "emoji": "🙂"},
    {"sql": "'); DROP TABLE tasks_app_step; --", "cast": "'{}'::jsonb"},
    {"big": 2**62, "negative": -(2**40), "float": 0.1, "exp": 1e-300},
    [1, "two", {"three": 3}],
    "just a string",
    42,
    None,
]


@pytest.mark.django_db
def test_results_are_stored_exactly_as_the_handlers_returned_them() -> None:
    steps = noops(len(RESULTS))
    claims = claim_due()

    accepted = fastpath.complete_many(
        [(claims[s.pk], r) for s, r in zip(steps, RESULTS, strict=True)]
    )

    assert accepted == {s.pk for s in steps}
    assert [fresh(s).result for s in steps] == RESULTS


@pytest.mark.django_db
def test_a_completion_whose_lease_was_reaped_and_reclaimed_is_refused_and_the_rest_accepted() -> (
    None
):
    steps = noops(3)
    claims = claim_due(worker_id="slow")
    lost = steps[1]
    backdate(lost, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    # Claimed by name, as the doorbell the sweeper rings for it does.
    [current] = claim_due(worker_id="fast", step_id=lost.pk).values()
    assert (current.step_id, current.token) == (lost.pk, 2)
    lease_before = fresh(lost).lease_expires_at

    accepted = fastpath.complete_many([(claims[s.pk], {"by": "slow"}) for s in steps])

    assert accepted == {steps[0].pk, steps[2].pk}
    for step in (steps[0], steps[2]):
        assert (fresh(step).status, fresh(step).result) == (StepStatus.SUCCEEDED, {"by": "slow"})
        assert Task.objects.get(pk=step.task_id).status == TaskStatus.SUCCEEDED
    after = fresh(lost)
    assert (after.status, after.attempts, after.fencing_token) == (StepStatus.RUNNING, 2, 2)
    assert after.result is None
    assert after.lease_expires_at == lease_before
    leases = attempts_of(lost)
    assert leases[1].outcome == Lease.Outcome.EXPIRED
    assert (leases[2].worker_id, leases[2].released_at, leases[2].outcome) == ("fast", None, "")
    task = Task.objects.get(pk=lost.task_id)
    assert task.live_status == TaskStatus.RUNNING
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "lease_expired",
        "claimed",
        "stale_write_rejected",
    ]
    [rejected] = events(task, EventKind.STALE_WRITE_REJECTED)
    assert (rejected.step_id, rejected.actor) == (lost.pk, "worker:slow")
    assert rejected.data == {
        "operation": "complete",
        "token": 1,
        "current_token": 2,
        "current_status": StepStatus.RUNNING,
    }

    # The current holder finishes; the stale claim stays refused afterwards too.
    assert fastpath.complete_many([(current, {"by": "fast"})]) == {lost.pk}
    assert fastpath.complete_many([(claims[lost.pk], {"by": "slow"})]) == set()
    assert fresh(lost).result == {"by": "fast"}
    assert event_kinds(task)[-2:] == ["succeeded", "stale_write_rejected"]


@pytest.mark.django_db
def test_a_batch_completion_delivered_twice_or_forged_changes_nothing_the_second_time() -> None:
    steps = noops(2)
    claims = claim_due()
    done = [(claims[s.pk], {"first": True}) for s in steps]
    assert fastpath.complete_many(done) == {s.pk for s in steps}
    never_claimed = noops(1)[0]
    forged = Claim(
        step_id=never_claimed.pk,
        task_id=never_claimed.task_id,
        token=0,
        attempt=1,
        worker_id="impostor",
        lease_seconds=LEASE,
    )

    again = [(claim, {"second": True}) for claim, _ in done] + [(forged, {"forged": True})]
    assert fastpath.complete_many(again) == set()

    for step in map(fresh, steps):
        assert (step.status, step.result, step.fencing_token) == (
            StepStatus.SUCCEEDED,
            {"first": True},
            1,
        )
        task = Task.objects.get(pk=step.task_id)
        assert event_kinds(task) == ["enqueued", "claimed", "succeeded", "stale_write_rejected"]
        [rejected] = events(task, EventKind.STALE_WRITE_REJECTED)
        assert rejected.data["current_status"] == StepStatus.SUCCEEDED
    never_claimed = fresh(never_claimed)
    assert (never_claimed.status, never_claimed.result) == (StepStatus.PENDING, None)
    assert event_kinds(never_claimed.task) == ["enqueued", "stale_write_rejected"]
    assert events(never_claimed.task, EventKind.STALE_WRITE_REJECTED)[0].actor == "worker:impostor"


@pytest.mark.django_db(transaction=True)
def test_completing_a_draft_makes_the_next_step_due_and_rings_for_it_only_after_commit(
    pair: str, broker: BrokerView
) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    [held] = claim_due().values()
    broker.purge()

    # A completion whose transaction rolls back changes nothing and rings nothing.
    with pytest.raises(RuntimeError), transaction.atomic():
        assert fastpath.complete_many([(held, {"draft": "v0"})]) == {draft.pk}
        raise RuntimeError("the surrounding work failed")
    assert fresh(draft).status == StepStatus.RUNNING
    assert fresh(publish).status == StepStatus.BLOCKED
    assert broker.step_ids() == []

    with transaction.atomic():
        assert fastpath.complete_many([(held, {"draft": "v1"})]) == {draft.pk}
        assert broker.step_ids() == []  # not before commit
    assert broker.step_ids() == [publish.pk]

    draft, publish = fresh(draft), fresh(publish)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert (publish.status, publish.attempts, publish.fencing_token) == (StepStatus.PENDING, 0, 0)
    assert publish.available_at is not None
    assert publish.dispatched_at is not None
    assert publish.available_at <= services.db_now()
    task.refresh_from_db()
    assert (task.status, task.finished_at) == (TaskStatus.PENDING, None)
    [succeeded] = events(task, EventKind.SUCCEEDED)
    assert succeeded.data["steps"] == {
        str(draft.pk): [StepStatus.SUCCEEDED, 1, 1],
        str(publish.pk): [StepStatus.PENDING, 0, 0],
    }
    assert succeeded.data["task_status"] == TaskStatus.PENDING

    # The last step's success finishes the task.
    [last] = claim_due().values()
    assert last.step_id == publish.pk
    assert fastpath.complete_many([(last, {"published": True})]) == {publish.pk}
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert task.finished_at is not None
    assert fresh(publish).result == {"published": True}
    assert events(task, EventKind.SUCCEEDED)[-1].data == {
        "steps": {str(publish.pk): [StepStatus.SUCCEEDED, 1, 1]},
        "token": 1,
        "task_status": TaskStatus.SUCCEEDED,
    }
    assert event_kinds(task) == ["enqueued", "claimed", "succeeded", "claimed", "succeeded"]


@pytest.mark.django_db
def test_a_task_cancelled_while_its_step_ran_ends_cancelled_after_a_batch_completion(
    pair: str,
) -> None:
    task = services.enqueue(pair, {}).task
    draft, publish = step_at(task, 0), step_at(task, 1)
    [held] = claim_due().values()
    services.cancel(task, actor="cli:t", reason="withdrawn")
    task.refresh_from_db()
    assert task.live_status == TaskStatus.RUNNING

    assert fastpath.complete_many([(held, {"draft": "v1"})]) == {draft.pk}

    draft, publish = fresh(draft), fresh(publish)
    assert (draft.status, draft.result) == (StepStatus.SUCCEEDED, {"draft": "v1"})
    assert (publish.status, publish.fencing_token, publish.available_at) == (
        StepStatus.CANCELLED,
        0,
        None,
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert task.finished_at is not None
    assert event_kinds(task) == [
        "enqueued",
        "claimed",
        "cancel_requested",
        "succeeded",
        "cancelled",
    ]
    succeeded, cancelled = events(task, EventKind.SUCCEEDED)[0], events(task, "cancelled")[0]
    assert succeeded.data["steps"] == {str(draft.pk): [StepStatus.SUCCEEDED, 1, 1]}
    assert succeeded.data["task_status"] == TaskStatus.CANCELLED
    assert (cancelled.actor, cancelled.step_id) == ("system", None)
    assert claim_due() == {}
    assert fastpath.claim_batch(worker_id=WORKER, limit=5, step_id=publish.pk) == []


@pytest.mark.django_db
def test_one_batch_completion_settles_each_task_by_its_own_story(pair: str) -> None:
    drafting = services.enqueue(pair, {}).task
    single, withdrawn, overtaken = (step.task for step in noops(3))
    claims = claim_due()
    services.cancel(withdrawn, actor="cli:t", reason="withdrawn")
    lost = only_step(overtaken)
    backdate(lost, seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    [current] = claim_due(worker_id="w2", step_id=lost.pk).values()

    accepted = fastpath.complete_many([(claim, {"step": pk}) for pk, claim in claims.items()])

    assert accepted == set(claims) - {lost.pk}
    drafting.refresh_from_db()
    assert drafting.status == TaskStatus.PENDING
    assert fresh(step_at(drafting, 1)).status == StepStatus.PENDING
    single.refresh_from_db()
    assert single.status == TaskStatus.SUCCEEDED
    withdrawn.refresh_from_db()
    assert withdrawn.status == TaskStatus.CANCELLED
    assert event_kinds(withdrawn)[-2:] == ["succeeded", "cancelled"]
    overtaken.refresh_from_db()
    assert overtaken.live_status == TaskStatus.RUNNING
    assert event_kinds(overtaken)[-1] == "stale_write_rejected"
    assert fresh(lost).fencing_token == current.token == 2
    # Only the drafting task gained a next step; no other task's rows moved.
    assert Step.objects.filter(status=StepStatus.PENDING).count() == 1


@pytest.mark.django_db
def test_a_batch_completion_names_each_claims_own_worker_as_the_actor() -> None:
    noops(2)
    [first] = claim_due(limit=1, worker_id="wa").values()
    [second] = claim_due(limit=1, worker_id="wb").values()

    assert fastpath.complete_many([(first, {}), (second, {})]) == {first.step_id, second.step_id}

    succeeded = [
        entry
        for entries in timeline.histories(Task.objects.values_list("pk", flat=True)).values()
        for entry in entries
        if entry.kind == EventKind.SUCCEEDED
    ]
    actors = {entry.step_id: entry.actor for entry in succeeded}
    assert actors == {first.step_id: "worker:wa", second.step_id: "worker:wb"}


# --- the same story told by the one-step path and the batch path --------------------------


def _story(path: Path, workflow: str) -> dict[str, Any]:
    """A draft and publish, a cancel while running, a stale worker and a retry; the
    transcript of what the database holds afterwards, with ids replaced by names."""
    tasks = {
        "pair": services.enqueue(workflow, {}).task,
        "cancelled": services.enqueue("demo.noop", {"c": 1}).task,
        "stale": services.enqueue("demo.noop", {"s": 1}).task,
        "retried": services.enqueue("demo.noop", {"r": 1}).task,
    }
    first = {name: step_at(task, 0) for name, task in tasks.items()}

    held = path.claim_all(list(first.values()), "w1")
    services.cancel(tasks["cancelled"], actor="cli:t", reason="withdrawn")
    backdate(first["stale"], seconds=LEASE + 60)
    assert services.reap_expired_leases() == 1
    current = path.claim_all([first["stale"]], "w2")[first["stale"].pk]
    failed = held[first["retried"].pk]
    services.fail_step(failed, error_class="Boom", message="boom", retry_in=0, reason="")
    accepted = path.complete(
        [
            (held[first["pair"].pk], {"draft": "v1"}),
            (held[first["cancelled"].pk], {"c": "kept"}),
            (held[first["stale"].pk], {"s": "late"}),
        ]
    )
    assert accepted == {first["pair"].pk, first["cancelled"].pk}
    assert path.complete([(current, {"s": "fresh"})]) == {first["stale"].pk}
    last = path.claim_all([step_at(tasks["pair"], 1), first["retried"]], "w1")
    assert path.complete([(claim, {"last": claim.attempt}) for claim in last.values()]) == set(last)

    names = {
        step.pk: f"{name}.{step.position}"
        for name, task in tasks.items()
        for step in task.steps.all()
    }

    def named(data: dict[str, Any]) -> dict[str, Any]:
        if "steps" in data:
            data = {**data, "steps": {names[int(pk)]: v for pk, v in data["steps"].items()}}
        return data

    transcript = {}
    for name, task in tasks.items():
        task.refresh_from_db()
        transcript[name] = {
            "task": (task.status, task.finished_at is None, task.cancel_requested_at is None),
            "steps": [
                (
                    names[s.pk],
                    s.status,
                    s.attempts,
                    s.fencing_token,
                    s.result,
                    s.error_class,
                    s.last_error,
                    s.available_at is None,
                    s.lease_expires_at is None,
                    s.finished_at is None,
                )
                for s in task.steps.order_by("position")
            ],
            "leases": [
                (
                    names[lease.step_id],
                    lease.token,
                    lease.worker_id,
                    lease.outcome,
                    lease.released_at is None,
                )
                for lease in Lease.objects.filter(step__task=task).order_by("step_id", "token")
            ],
            "events": [
                (e.kind, e.actor, e.reason, names.get(e.step_id or 0), named(e.data))
                for e in timeline.history(task.pk)
            ],
        }
    return transcript


@pytest.mark.django_db
def test_the_batch_path_leaves_the_same_states_and_history_as_the_one_step_path(
    pair: str,
) -> None:
    one_step = _story(ONE_BY_ONE, pair)
    batched = _story(BATCHED, pair)

    assert batched == one_step
    # ... and it is the story the design tells, not two identical mistakes.
    assert {name: [e[0] for e in story["events"]] for name, story in one_step.items()} == {
        "pair": ["enqueued", "claimed", "succeeded", "claimed", "succeeded"],
        "cancelled": ["enqueued", "claimed", "cancel_requested", "succeeded", "cancelled"],
        "stale": [
            "enqueued",
            "claimed",
            "lease_expired",
            "claimed",
            "stale_write_rejected",
            "succeeded",
        ],
        "retried": ["enqueued", "claimed", "retry_scheduled", "claimed", "succeeded"],
    }
    assert {name: story["task"][0] for name, story in one_step.items()} == {
        "pair": TaskStatus.SUCCEEDED,
        "cancelled": TaskStatus.CANCELLED,
        "stale": TaskStatus.SUCCEEDED,
        "retried": TaskStatus.SUCCEEDED,
    }
    succeeded_by = [e[1] for e in one_step["stale"]["events"] if e[0] == "succeeded"]
    assert succeeded_by == ["worker:w2"]
