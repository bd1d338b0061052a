"""The invariant checker finds each kind of corruption made on purpose (rows edited behind
the services' back with raw SQL) and nothing on a healthy database; ``check_invariants``
prints one line per finding and exits 1 when there is any, 0 otherwise."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from approvals import deadlines
from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks_app import services
from tasks_app.engine import fastpath, leases, runner, sweeper
from tasks_app.history import timeline
from tasks_app.models import Effect, EventKind, Step, Task, TaskStatus
from tasks_app.observability import invariants
from tests.approval_support import advance, article, pending_request, press_release, ticket
from tests.conftest import backdate, only_step
from tests.factories import dead_task, noop, succeeded
from tests.invariant_support import ago, assert_clean, check, findings, running, sql
from tests.remotes import LoopbackRemote


def reap(step: Step) -> None:
    """Let the step's lease run out and have the sweeper reap it."""
    ago("tasks_app_step", "lease_expires_at", "1 hour", step.pk)
    assert sweeper.reap_expired_leases() == 1


def expire(request: ApprovalRequest) -> None:
    ago("approvals_approvalrequest", "expires_at", "1 hour", request.pk)
    assert deadlines.expire_due() == 1


def batched() -> list[Task]:
    """Tasks claimed and completed together, by the batch claim and completion."""
    tasks = [noop(), noop(), noop()]
    for task in tasks:
        backdate(only_step(task))
    claims = fastpath.claim_batch(worker_id="w-batch", limit=10, queue="default")
    assert sorted(claim.task_id for claim in claims) == [task.pk for task in tasks]
    runner.run_batch(claims)
    return tasks


def cancelled_while_running() -> list[Task]:
    """Cancels that reach a running step: its late success, its failure, its lost lease."""
    late, failed, lost = noop(), services.enqueue("demo.flaky", {"fail_first": 1}).task, noop()
    claims = []
    for task in (late, failed, lost):
        step = only_step(task)
        backdate(step)
        claim = services.claim_step(step.pk, worker_id="w-cancel")
        assert claim is not None
        services.cancel(task, actor="cli:ann", reason="stop")
        claims.append(claim)
    assert services.complete_step(claims[0], {})
    assert services.fail_step(
        claims[1], error_class="RetryableError", message="no", retry_in=0, reason=""
    )
    reap(only_step(lost))
    return [late, failed, lost]


def leases_lost() -> list[Task]:
    """A lease reaped back to pending and its stale worker refused, then one reaped until
    its attempts ran out (dead-lettered), redriven and run to success, and a claim whose
    process died handed back uncharged, then run."""
    stale = noop()
    step = only_step(stale)
    backdate(step)
    old = services.claim_step(step.pk, worker_id="w-old")
    assert old is not None
    reap(step)
    backdate(step)
    assert runner.run_claimed(step.pk)
    assert not services.complete_step(old, {})
    exhausted = noop()
    step = only_step(exhausted)
    for _ in range(step.max_attempts):
        backdate(step)
        assert services.claim_step(step.pk, worker_id="w-lost") is not None
        reap(step)
    exhausted.refresh_from_db()
    assert exhausted.status == TaskStatus.DEAD
    services.redrive(exhausted, actor="cli:ann", reason="again")
    backdate(step)
    assert runner.run_claimed(step.pk)
    handed_back = noop()
    step = only_step(handed_back)
    backdate(step)
    held = services.claim_step(step.pk, worker_id="w-died")
    assert held is not None
    assert leases.release_claim(held, actor="worker:host:1", reason="worker_lost")
    assert runner.run_claimed(step.pk)
    return [stale, exhausted, handed_back]


def decided() -> list[Task]:
    """Approval requests rejected, and expired under both policies (the dead-lettered one
    then cancelled by on-call)."""
    rejected = advance(article(key="publish:rejected"))
    approvals.reject(pending_request(rejected), actor="cli:editor", comment="no")
    expired_dead = advance(article(key="publish:expired"))
    expire(pending_request(expired_dead))
    services.cancel(expired_dead, actor="cli:ann", reason="too late")
    expired_cancelled = advance(ticket(key="reply:expired"))
    expire(pending_request(expired_cancelled))
    waiting_cancelled = advance(ticket(key="reply:cancelled"))
    services.cancel(waiting_cancelled, actor="cli:ann", reason="not needed")
    return [rejected, expired_dead, expired_cancelled, waiting_cancelled]


def editors_at_work() -> list[Task]:
    """A draft an editor edited and another approved and published; a press release approved by
    two editors, escalated before the second approval."""
    edited = advance(article(key="publish:edited"))
    successor = approvals.edit_draft(
        pending_request(edited), actor="cli:editor", changes={"title": "Launch day, edited"}
    )
    assert successor is not None
    approvals.approve(successor, actor="cli:mara")
    advance(edited)
    release = advance(press_release(key="press:two-editors"))
    request = pending_request(release)
    approvals.approve(request, actor="cli:editor")
    ApprovalRequest.objects.filter(pk=request.pk).update(escalates_at=Now())
    assert deadlines.escalate_due() == 1
    approvals.approve(request, actor="cli:mara")
    advance(release)
    assert release.status == TaskStatus.SUCCEEDED
    return [edited, release]


def a_bit_of_everything(remotes: tuple[LoopbackRemote, LoopbackRemote]) -> list[Task]:
    """Tasks in every state the services reach, each by the services alone."""
    together = batched()  # first: the batch claims whatever is due in the queue
    done = succeeded()
    dead = dead_task()
    redriven = dead_task()
    services.redrive(redriven, actor="cli:ann", reason="again")
    resolved = dead_task({"error": "outcome_unknown", "fail_first": 1})
    services.resolve(resolved, actor="cli:ann", reason="it happened", outcome="done")
    cancelled = noop()
    services.cancel(cancelled, actor="cli:ann", reason="not needed")
    retrying = services.enqueue("demo.flaky", {"fail_first": 2}).task
    step = only_step(retrying)
    backdate(step)
    assert runner.run_claimed(step.pk)
    claimed = noop()
    running(claimed)
    waiting = advance(article(key="publish:waiting"))
    revised = advance(article(key="publish:revised"))
    approvals.request_changes(pending_request(revised), actor="cli:editor", comment="shorter")
    advance(revised)
    published = advance(article(key="publish:published"))
    approvals.approve(pending_request(published), actor="cli:editor")
    advance(published)
    assert Effect.objects.filter(status=Effect.Status.DONE).exists()
    redriven_twice = dead_task({"error": "permanent", "fail_first": 2})
    services.redrive(redriven_twice, actor="cli:ann", reason="again")
    advance(redriven_twice)
    services.redrive(redriven_twice, actor="cli:ann", reason="once more")
    advance(redriven_twice)
    resolved_retry = dead_task({"error": "outcome_unknown", "fail_first": 1})
    services.resolve(resolved_retry, actor="cli:ann", reason="it did not", outcome="retry")
    advance(resolved_retry)
    rewound = succeeded()
    plan = services.plan_rewind(rewound, only_step(rewound).pk)
    services.rewind(
        rewound, step_id=plan.step_id, actor="cli:ann", reason="again", fingerprint=plan.fingerprint
    )
    advance(rewound)
    assert rewound.status == TaskStatus.SUCCEEDED
    more = [*cancelled_while_running(), *leases_lost(), *decided(), *editors_at_work()]
    every = timeline.histories(Task.objects.values_list("pk", flat=True)).values()
    kinds = {entry.kind for entries in every for entry in entries}
    # Every kind but the operator actions on a queue, a limit, a schedule, a token or a
    # program's plan, which belong to no task.
    assert kinds >= set(EventKind.values) - {
        EventKind.QUEUE_PAUSED,
        EventKind.QUEUE_RESUMED,
        EventKind.LIMIT_CHANGED,
        EventKind.LIMIT_KEY_PAUSED,
        EventKind.LIMIT_KEY_RESUMED,
        EventKind.SCHEDULE_SYNCED,
        EventKind.SCHEDULE_PAUSED,
        EventKind.SCHEDULE_RESUMED,
        EventKind.SCHEDULE_BACKFILLED,
        EventKind.SCHEDULE_RUN_NOW,
        EventKind.TOKEN_CREATED,
        EventKind.TOKEN_REVOKED,
        EventKind.PLAN_PROPOSED,
        EventKind.PLAN_APPLIED,
        EventKind.PLAN_DECLINED,
    }
    return [
        *together, done, dead, redriven, resolved, cancelled, retrying, claimed, waiting,
        revised, published, redriven_twice, resolved_retry, rewound, *more,
    ]  # fmt: skip


# --- a healthy database ---------------------------------------------------------------------------


def test_a_healthy_database_has_no_findings(
    db: None, remotes: tuple[LoopbackRemote, LoopbackRemote]
) -> None:
    tasks = a_bit_of_everything(remotes)

    assert_clean(tasks=len(tasks))
    assert_clean("--all", tasks=len(tasks), scope="all tasks")


@pytest.mark.django_db(transaction=True)
def test_a_healthy_database_has_no_findings_read_in_snapshots() -> None:
    # Outside a test transaction each batch is read in a snapshot of its own.
    succeeded(), dead_task(), noop()

    assert_clean(tasks=3)
    report = invariants.check(batch_size=2)
    assert (report.ok, report.tasks_checked) == (True, 3)


# --- corruption, each kind ------------------------------------------------------------------------


@pytest.mark.no_fold_check
def test_it_finds_a_task_status_edited_without_an_event(db: None) -> None:
    task = noop()
    sql("UPDATE tasks_app_task SET status = 'succeeded' WHERE id = %s", task.pk)

    differs = f"history: task {task.pk}: stored state differs from its events: "
    assert findings() == [differs + "status succeeded (events say pending)"]


@pytest.mark.no_fold_check
def test_it_finds_a_step_edited_without_an_event(db: None) -> None:
    task = succeeded()
    step = only_step(task)
    sql("UPDATE tasks_app_step SET attempts = 7 WHERE id = %s", step.pk)

    assert findings() == [
        f"history: task {task.pk}: stored state differs from its events: "
        f"step {step.pk} succeeded/7/1 (events say succeeded/1/1)"
    ]


@pytest.mark.no_fold_check
def test_it_finds_a_dead_step_without_its_dead_lettered_event(db: None) -> None:
    task = noop()
    step = only_step(task)
    sql("UPDATE tasks_app_step SET status = 'dead' WHERE id = %s", step.pk)
    sql("UPDATE tasks_app_task SET status = 'dead' WHERE id = %s", task.pk)

    lines = findings()

    assert (
        f"dead_letter: task {task.pk}: step {step.pk} is dead without its dead_lettered event"
        in lines
    )
    assert any(line.startswith(f"history: task {task.pk}:") for line in lines)


@pytest.mark.no_fold_check
def test_a_step_dead_again_after_a_redrive_needs_a_new_dead_lettered_event(db: None) -> None:
    task = dead_task()
    services.redrive(task, actor="cli:ann", reason="again")
    step = only_step(task)
    sql("UPDATE tasks_app_step SET status = 'dead', attempts = 0 WHERE id = %s", step.pk)
    sql("UPDATE tasks_app_task SET status = 'dead' WHERE id = %s", task.pk)

    assert (
        f"dead_letter: task {task.pk}: step {step.pk} is dead without its dead_lettered event"
        in (findings())
    )


def test_it_finds_a_step_running_past_its_lease(db: None, settings: Any) -> None:
    settings.TASKS_SWEEP_SECONDS = 5
    late, in_grace, healthy = noop(), noop(), noop()
    step = running(late)
    ago("tasks_app_step", "lease_expires_at", "1 hour", step.pk)
    # Within the sweeper's grace (twice its interval): not a finding yet.
    ago("tasks_app_step", "lease_expires_at", "5 seconds", running(in_grace).pk)
    running(healthy)

    [line] = findings()

    assert line.startswith(
        f"lease: task {late.pk}: step {step.pk} is running on a lease that expired at "
    )
    assert line.endswith("(token 1); the sweeper reaps those within 0:00:10")


def test_it_finds_a_step_running_without_a_lease(db: None) -> None:
    task = noop()
    step = running(task)
    sql("UPDATE tasks_app_step SET lease_expires_at = NULL WHERE id = %s", step.pk)

    lease = f"lease: task {task.pk}: step {step.pk} is running without a lease (token 1)"
    assert findings() == [lease]


def _effect(step: Step, name: str, age: str) -> None:
    sql(
        "INSERT INTO tasks_app_effect (key, step_id, token, status, created_at) "
        f"VALUES (%s, %s, %s, 'started', statement_timestamp() - interval '{age}')",
        f"{step.idempotency_key}:{name}",
        step.pk,
        step.fencing_token,
    )


def test_it_finds_an_effect_started_long_ago_that_nothing_will_settle(
    db: None, settings: Any
) -> None:
    settings.TASKS_LEASE_SECONDS = 30
    task = succeeded("cmd:effect")
    step = only_step(task)
    _effect(step, "orphan", "1 hour")
    _effect(step, "recent", "5 seconds")
    # A dead step's unknown outcome waits for a person: that is what dead letters are for.
    _effect(only_step(dead_task()), "unknown", "1 hour")
    # The next attempt of a pending step calls again with the same key, or dead-letters.
    _effect(only_step(noop()), "next-attempt", "1 hour")

    [line] = findings()

    assert line.startswith(f"effect: task {task.pk}: effect cmd:effect:0:noop:orphan started at ")
    assert line.endswith(
        f"and its step {step.pk} is succeeded: nothing will decide whether it happened"
    )


def test_it_finds_a_pending_approval_past_its_expiry(db: None, settings: Any) -> None:
    settings.TASKS_SWEEP_SECONDS = 5
    overdue = pending_request(advance(article(key="publish:overdue")))
    in_grace = pending_request(advance(article(key="publish:in-grace")))
    pending_request(advance(article(key="publish:fresh")))
    ago("approvals_approvalrequest", "expires_at", "1 hour", overdue.pk)
    ago("approvals_approvalrequest", "expires_at", "5 seconds", in_grace.pk)

    [line] = findings()

    assert line.startswith(
        f"approval: task {overdue.task_id}: approval request {overdue.pk} (step {overdue.step_id})"
        " is pending past its expiry at "
    )
    assert ApprovalRequest.objects.get(pk=overdue.pk).status == "pending"


# --- scope ----------------------------------------------------------------------------------------


@pytest.mark.no_fold_check
def test_finished_history_is_checked_within_the_window_or_all(db: None) -> None:
    old = succeeded()
    sql(
        "UPDATE tasks_app_task SET created_at = statement_timestamp() - interval '3 days', "
        "finished_at = statement_timestamp() - interval '3 days' WHERE id = %s",
        old.pk,
    )
    sql("UPDATE tasks_app_step SET attempts = 5 WHERE task_id = %s", old.pk)
    recent = succeeded()

    assert check()[0] == 0
    assert check("--since", "2d")[0] == 0
    for scope in (["--all"], ["--since", "4d"], ["--since", "2000-01-01T00:00:00+00:00"]):
        [line] = findings(*scope)
        assert line.startswith(f"history: task {old.pk}:")
    report = invariants.check(since=None, batch_size=1)
    assert report.tasks_checked == 2
    assert [finding.task_id for finding in report.findings] == [old.pk]
    assert recent.pk not in {finding.task_id for finding in report.findings}


@pytest.mark.no_fold_check
def test_active_tasks_are_checked_however_old(db: None) -> None:
    task = dead_task()
    ago("tasks_app_task", "created_at", "30 days", task.pk)
    sql("UPDATE tasks_app_step SET attempts = 2 WHERE task_id = %s", task.pk)

    [line] = findings()

    assert line.startswith(f"history: task {task.pk}:")


@pytest.mark.no_fold_check
def test_findings_come_one_line_each_in_task_order_in_batches(db: None) -> None:
    tasks = [noop() for _ in range(5)]
    for task in (tasks[4], tasks[1]):
        sql("UPDATE tasks_app_step SET attempts = 3 WHERE task_id = %s", task.pk)

    report = invariants.check(batch_size=2)

    assert report.tasks_checked == 5
    assert [(f.check, f.task_id) for f in report.findings] == [
        ("history", tasks[1].pk),
        ("history", tasks[4].pk),
    ]
    assert findings() == [str(finding) for finding in report.findings]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--since", "yesterday"], "since: a duration"),
        (["--since", "2030-01-01T00:00:00"], "since: a time needs a time zone"),
        (["--since", "1d", "--all"], "not allowed with argument"),
    ],
)
def test_check_invariants_refuses_bad_input(db: None, args: list[str], field: str) -> None:
    status, _ = check(*args)
    assert status == 2
    with pytest.raises(CommandError, match=field):
        call_command("check_invariants", *args, stdout=StringIO(), stderr=StringIO())


def test_the_grace_is_twice_the_sweep_interval(settings: Any) -> None:
    settings.TASKS_SWEEP_SECONDS = 7
    assert invariants.sweep_grace() == timedelta(seconds=14)
