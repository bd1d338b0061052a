"""A state model of the task system: random sequences of the calls that producers,
workers, the sweeper, on-call and editors make, against the real database.

Each example runs in a savepoint of the test's transaction, rolled back at its end, so
examples do not see each other's tasks. After every call the invariant checker finds
nothing, over every task, and every task's history folds to its stored state. Where the
outcome of a call follows from the state before it (a stale claim's write is refused, a
dead step can be redriven, a paused queue claims nothing), the rule says so too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

from django.contrib.auth.models import User
from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.workflows import generate_draft
from tasks_app import services
from tasks_app.engine import leases, runner
from tasks_app.exceptions import InvalidTransition, NotPermitted
from tasks_app.models import TERMINAL_TASK_STATUSES, Step, StepStatus, Task, TaskStatus
from tasks_app.observability import invariants
from tests.approval_support import ARTICLE
from tests.conftest import backdate
from tests.remotes import LoopbackRemote

OPERATOR = "cli:model"
QUEUE = "default"
# Long enough that no lease runs out by itself while the test runs: only back-dating
# (the ``lose_lease`` action of the worker rule) lets one expire.
LEASE_SECONDS = 600
POOL_SIZE = 5

# What a producer may enqueue: (workflow, payload, enqueued by the author).
KINDS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "noop": ("demo.noop", {}, False),
    "flaky_never": ("demo.flaky", {}, False),
    "flaky_retryable": ("demo.flaky", {"fail_first": 1, "error": "retryable"}, False),
    "flaky_exhausted": ("demo.flaky", {"fail_first": 5, "error": "retryable"}, False),
    "flaky_permanent": ("demo.flaky", {"fail_first": 1, "error": "permanent"}, False),
    "flaky_unknown": ("demo.flaky", {"fail_first": 2, "error": "outcome_unknown"}, False),
    "article": ("publish_article", ARTICLE, True),
}

# Articles twice as often: their approvals are the longest road.
ENQUEUED = [*KINDS, "article", "article"]

# What a worker does with a claim it holds.
ACTIONS = [
    "complete",
    "retry",
    "retry_later",
    "dead",
    "run",
    "heartbeat",
    "lose_lease",
    "release",
]
# What it does right after claiming ("hold" keeps the claim for a later rule).
THEN = ["hold", "hold", *ACTIONS]

OPERATIONS = ["redrive", "resolve_done", "resolve_retry", "cancel", "pause_or_resume"]
VERDICTS = ["approve", "approve", "request_changes", "author_approves"]

SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass(frozen=True)
class People:
    author: User
    editor: User


def pick(items: list[Any], index: int) -> Any:
    return items[index % len(items)]


def current(claim: services.Claim) -> bool:
    """Whether ``claim`` still holds its step (running on its token)."""
    return Step.objects.filter(
        pk=claim.step_id, status=StepStatus.RUNNING, fencing_token=claim.token
    ).exists()


class StateModel(RuleBasedStateMachine):
    people: ClassVar[People]
    examples: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.savepoint = transaction.atomic()
        self.savepoint.__enter__()
        self.example = next(self.examples)
        self.keys = itertools.count()
        self.tasks: list[Task] = []
        self.claims: list[services.Claim] = []
        self.paused = False

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self.savepoint.__exit__(None, None, None)

    # --- what the rules act on ------------------------------------------------------------

    def task_ids(self) -> list[int]:
        return [task.pk for task in self.tasks]

    def steps(self, status: str) -> list[Step]:
        return list(Step.objects.filter(task_id__in=self.task_ids(), status=status).order_by("pk"))

    def has_steps(self, status: str) -> bool:
        return Step.objects.filter(task_id__in=self.task_ids(), status=status).exists()

    def pending_requests(self) -> list[ApprovalRequest]:
        return list(
            ApprovalRequest.objects.filter(
                task_id__in=self.task_ids(), status=ApprovalStatus.PENDING
            ).order_by("pk")
        )

    def fresh(self, index: int) -> Task:
        task: Task = pick(self.tasks, index)
        task.refresh_from_db()
        return task

    # --- producers --------------------------------------------------------------------------

    @initialize()
    def start_running(self) -> None:
        assert services.paused_queues() == []

    @precondition(lambda self: len(self.tasks) < POOL_SIZE)
    @rule(kind=st.sampled_from(ENQUEUED))
    def enqueue(self, kind: str) -> None:
        workflow, payload, by_author = KINDS[kind]
        key = f"model:{self.example}:{next(self.keys)}"
        actor = self.people.author if by_author else "cli:producer"
        result = services.enqueue(workflow, payload, idempotency_key=key, actor=actor)
        assert result.created
        assert result.task.status == TaskStatus.PENDING
        self.tasks.append(result.task)

    @precondition(lambda self: self.tasks)
    @rule(index=st.integers(0, POOL_SIZE - 1))
    def enqueue_again(self, index: int) -> None:
        """The same business action enqueued again returns the task it made."""
        task = self.fresh(index)
        result = services.enqueue(
            task.workflow,
            task.payload,
            idempotency_key=task.idempotency_key,
            actor=task.created_by_user or task.created_by,
        )
        assert not result.created
        assert result.task.pk == task.pk

    # --- workers ----------------------------------------------------------------------------

    @precondition(lambda self: self.has_steps(StepStatus.PENDING))
    @rule(index=st.integers(0, 9), then=st.sampled_from(THEN))
    def claim(self, index: int, then: str) -> None:
        """Claim a pending step once its time has come (back-dated, as if it had), then
        hold the claim, or complete, fail or run the step at once."""
        step = pick(self.steps(StepStatus.PENDING), index)
        backdate(step)
        claim = self.claim_step(step)
        if self.paused:
            # Nothing starts in a paused queue; on-call resumes it and the claim goes ahead.
            assert claim is None
            self.resume_queue()
            claim = self.claim_step(step)
        assert claim is not None
        assert claim.step_id == step.pk
        assert claim.token == step.fencing_token + 1
        self.claims.append(claim)
        if then != "hold":
            self.act(claim, then)

    def claim_step(self, step: Step) -> services.Claim | None:
        return services.claim_step(step.pk, worker_id="w-model", lease_seconds=LEASE_SECONDS)

    def finish(self, claim: services.Claim) -> None:
        """Complete the step with the result its handler would return; a stale claim's
        write changes nothing."""
        holds = current(claim)
        step = Step.objects.select_related("task").get(pk=claim.step_id)
        if step.kind == "generate_draft":
            ctx = services.step_context(step.task, step, attempt=claim.attempt, token=claim.token)
            result: dict[str, Any] = generate_draft(ctx)
        else:
            result = {"done_by": "w-model"}
        assert services.complete_step(claim, result) == holds
        assert not current(claim)

    def fail_with(self, claim: services.Claim, retry_in: float | None) -> None:
        holds = current(claim)
        failed = services.fail_step(
            claim,
            error_class="RetryableError" if retry_in is not None else "PermanentError",
            message="failed in the model",
            retry_in=retry_in,
            reason="permanent_error",
        )
        assert failed == holds
        assert not current(claim)

    def run_with(self, claim: services.Claim) -> None:
        """Run the step's real handler under the claim and record its outcome."""
        if not current(claim):
            return
        runner.execute(claim)
        assert not current(claim)

    @precondition(lambda self: self.claims)
    @rule(index=st.integers(0, 9), action=st.sampled_from(ACTIONS), stale=st.booleans())
    def worker(self, index: int, action: str, stale: bool) -> None:
        """A worker acts on a claim it holds (or, with ``stale``, on any claim it ever
        made, which may have been reaped or run by another attempt meanwhile)."""
        held = [claim for claim in self.claims if current(claim)]
        self.act(pick(self.claims if stale or not held else held, index), action)

    def act(self, claim: services.Claim, action: str) -> None:
        if action == "complete":
            self.finish(claim)
        elif action == "retry":
            self.fail_with(claim, 0.0)
        elif action == "retry_later":
            self.fail_with(claim, 30.0)
        elif action == "dead":
            self.fail_with(claim, None)
        elif action == "run":
            self.run_with(claim)
        elif action == "heartbeat":
            self.heartbeat_with(claim)
        elif action == "release":
            self.release(claim)
        else:
            self.lose_lease(claim)

    def heartbeat_with(self, claim: services.Claim) -> None:
        holds = current(claim)
        beat = services.heartbeat(claim)
        assert beat.alive == holds
        if holds:
            task = Task.objects.get(pk=claim.task_id)
            assert beat.cancel_requested == (task.cancel_requested_at is not None)

    def lose_lease(self, claim: services.Claim) -> None:
        """The worker goes quiet: its lease runs out and the sweeper reaps the step."""
        holds = current(claim)
        if holds:
            backdate(Step.objects.get(pk=claim.step_id), seconds=2 * LEASE_SECONDS)
        assert services.reap_expired_leases() == int(holds)
        assert not current(claim)
        if holds:
            step = Step.objects.get(pk=claim.step_id)
            assert step.status in (StepStatus.PENDING, StepStatus.DEAD, StepStatus.CANCELLED)

    def release(self, claim: services.Claim) -> None:
        """The worker's process dies running another step of the batch: the claim is
        handed back, its attempt not charged."""
        holds = current(claim)
        attempts = Step.objects.get(pk=claim.step_id).attempts
        assert leases.release_claim(claim, actor="worker:model", reason="worker_lost") == holds
        assert not current(claim)
        step = Step.objects.get(pk=claim.step_id)
        if holds:
            assert step.status in (StepStatus.PENDING, StepStatus.CANCELLED)
            assert step.attempts == attempts - 1
        else:
            assert step.attempts == attempts

    @precondition(lambda self: self.has_steps(StepStatus.PENDING))
    @rule(index=st.integers(0, POOL_SIZE - 1))
    def drain(self, index: int) -> None:
        """A worker runs a task's next step once it is due: claim, real handler, outcome."""
        task = self.fresh(index)
        step = task.steps.filter(status=StepStatus.PENDING).order_by("position").first()
        if step is None:
            return
        backdate(step)
        assert runner.run_claimed(step.pk) != self.paused
        step.refresh_from_db()
        assert step.status != StepStatus.RUNNING

    # --- on-call ----------------------------------------------------------------------------

    @precondition(lambda self: self.tasks)
    @rule(
        index=st.integers(0, POOL_SIZE - 1),
        action=st.sampled_from(OPERATIONS),
        anyone=st.booleans(),
    )
    def operate(self, index: int, action: str, anyone: bool) -> None:
        """On-call redrives, resolves or cancels a task (a state that does not allow it
        refuses with ``InvalidTransition``, and only such a state), or pauses or resumes
        the queue. Unless ``anyone``, the task is one the action suits."""
        if action == "pause_or_resume":
            self.pause_or_resume()
            return
        task = self.fresh(index) if anyone else self.target(index, action)
        dead = task.steps.filter(status=StepStatus.DEAD).order_by("position").first()
        unknown = dead is not None and dead.error_class == "tasks_app.exceptions.OutcomeUnknown"
        if action == "cancel":
            refused = task.status in TERMINAL_TASK_STATUSES or task.cancel_requested_at is not None
        elif action == "resolve_done":
            # Only a person's decision lets a task past an approval step.
            refused = dead is None or dead.kind == "editor_review"
        elif action == "resolve_retry":
            # Calling again without the started call is for an unknown outcome only.
            refused = not unknown
        else:
            # A redrive of an unknown outcome would stop again without calling.
            refused = dead is None or unknown
        try:
            if action == "redrive":
                services.redrive(task, actor=OPERATOR, reason="run it again")
            elif action == "cancel":
                services.cancel(task, actor=OPERATOR, reason="not needed")
            else:
                outcome = action.removeprefix("resolve_")
                services.resolve(task, actor=OPERATOR, reason="looked at it", outcome=outcome)
        except InvalidTransition:
            assert refused, f"{action} refused"
        else:
            assert not refused, f"{action} allowed"
        if action == "cancel" and not refused:
            task.refresh_from_db()
            assert task.live_status in (TaskStatus.CANCELLED, TaskStatus.RUNNING)

    def target(self, index: int, action: str) -> Task:
        """A task the action suits (one with a dead step; for a cancel, one not ended),
        or any task when none does."""
        tasks = Task.objects.filter(pk__in=self.task_ids()).order_by("pk")
        if action == "cancel":
            suited = tasks.exclude(status__in=TERMINAL_TASK_STATUSES)
        else:
            suited = tasks.filter(steps__status=StepStatus.DEAD).distinct()
        return pick(list(suited), index) if suited.exists() else self.fresh(index)

    def pause_or_resume(self) -> None:
        """Pause the queue, or resume it when paused."""
        if self.paused:
            self.resume_queue()
        else:
            services.pause_queue(QUEUE, actor=OPERATOR, reason="maintenance")
            self.paused = True

    def resume_queue(self) -> None:
        services.resume_queue(QUEUE, actor=OPERATOR, reason="maintenance over")
        self.paused = False

    # --- editors ----------------------------------------------------------------------------

    @precondition(lambda self: self.pending_requests())
    @rule(index=st.integers(0, 3), verdict=st.sampled_from(VERDICTS))
    def decide(self, index: int, verdict: str) -> None:
        """An editor approves or asks for changes; the author may not decide at all."""
        request: ApprovalRequest = pick(self.pending_requests(), index)
        if verdict == "author_approves":
            try:
                approvals.approve(request, actor=self.people.author, comment="mine")
            except NotPermitted:
                return
            raise AssertionError("the author approved their own task")
        if verdict == "approve":
            decided = approvals.approve(request, actor=self.people.editor, comment="fine")
        else:
            decided = approvals.request_changes(
                request, actor=self.people.editor, comment="shorter, please"
            )
        assert decided.status != ApprovalStatus.PENDING

    # --- after every rule -------------------------------------------------------------------

    @invariant()
    def checker_finds_nothing(self) -> None:
        """Every check of the invariant checker holds for every task, among them its
        ``history`` check: each task's history folds to its stored state (``fold``,
        ``TaskState.stored``, as ``tests.conftest.history_mismatches`` compares them after
        every test)."""
        report = invariants.check(since=None)
        assert report.findings == [], report.findings
        assert report.tasks_checked == len(self.tasks)

    @invariant()
    def queue_state_as_modelled(self) -> None:
        assert services.paused_queues() == ([QUEUE] if self.paused else [])


def test_state_model(
    db: None, author: User, editor: User, remotes: tuple[LoopbackRemote, LoopbackRemote]
) -> None:
    StateModel.people = People(author=author, editor=editor)
    run_state_machine_as_test(StateModel, settings=SETTINGS)
