"""The Overview's "Waiting": how many steps wait on each reason (``312 steps wait on the
rate limit llm``, ``40 steps wait in the paused queue x``), the counts of what
``tasks_app.operations.why`` names for one task.

Counted with a bounded number of queries whatever the backlog: the limits from their use
(``limit_use.uses``: each key's waiting steps and whether it is at its limit), the rest by
aggregates over the pending, running and waiting steps (active work, which the partial
indexes serve), never by asking ``why`` step by step. A step counts under each reason that
holds it (a due step in a paused queue under a paused limit counts twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from tasks_app.db.clock import db_now
from tasks_app.engine import presence
from tasks_app.exceptions import AWAITING_VERSION
from tasks_app.models import QueueState, Step, StepStatus
from tasks_app.operations import limit_use
from tasks_app.operations.why_blockers import (
    APPROVAL,
    AWAITING_VERSION_KIND,
    LEASE_EXPIRED,
    LIMIT_CONCURRENCY,
    LIMIT_HELD,
    LIMIT_PAUSED,
    LIMIT_RATE,
    LIMIT_UNKNOWN,
    NO_WORKER,
    QUEUE_PAUSED,
    RETRY,
    RUN_AFTER,
)
from tasks_app.operations.why_words import limit_link, link, plural


@dataclass(frozen=True)
class WaitingCount:
    """``steps`` steps wait on one reason: ``{steps} wait {phrase} {subject}``."""

    kind: str
    steps: int
    phrase: str
    subject: str = ""
    link: str = ""
    # When the reason lets them in, where one time says it (a remote's hold).
    until: datetime | None = None

    @property
    def lead(self) -> str:
        """``1 step waits``, ``312 steps wait``."""
        return f"{plural(self.steps, 'step')} {'waits' if self.steps == 1 else 'wait'}"

    @property
    def words(self) -> str:
        return f"{self.lead} {self.phrase}" + (f" {self.subject}" if self.subject else "")


def waiting(now: datetime | None = None) -> list[WaitingCount]:
    """Every reason steps wait on now, the most steps first."""
    now = now or db_now()
    found = [*_queues(now), *_limits(now), *_steps(now)]
    return sorted(found, key=lambda count: (-count.steps, count.kind, count.subject))


def _queues(now: datetime) -> list[WaitingCount]:
    """Pending steps in a paused queue, and due ones in a queue no live worker consumes."""
    pending = Step.objects.filter(status=StepStatus.PENDING)
    by_queue = {
        row["queue"]: row
        for row in pending.values("queue")
        .annotate(all=Count("pk"), due=Count("pk", filter=Q(available_at__lte=now)))
        .order_by()
    }
    paused = QueueState.objects.filter(paused=True, name__in=list(by_queue)).order_by("name")
    found = [
        WaitingCount(QUEUE_PAUSED, by_queue[q.name]["all"], "in the paused queue", q.name, _q())
        for q in paused
    ]
    live = {queue for row in presence.workers() if row.state == "live" for queue in row.queues}
    found.extend(
        WaitingCount(NO_WORKER, row["due"], "in a queue no live worker consumes:", queue, _w())
        for queue, row in sorted(by_queue.items())
        if row["due"] and queue not in live
    )
    return found


def _q() -> str:
    return link("console:queues")


def _w() -> str:
    return link("console:queues", anchor="workers")


def _limits(now: datetime) -> list[WaitingCount]:
    """Due steps under a limit key that holds them: paused, held by a remote, at its
    concurrency or its rate; and under a limit nothing here declares."""
    found = []
    for use in limit_use.uses(now):
        here = limit_link(use.name)
        if use.numbers is None:
            if use.waiting:
                found.append(WaitingCount(LIMIT_UNKNOWN, use.waiting, _UNKNOWN, use.name, here))
            continue
        counts = {LIMIT_PAUSED: 0, LIMIT_HELD: 0, LIMIT_CONCURRENCY: 0, LIMIT_RATE: 0}
        held_until: datetime | None = None
        for key in use.keys:
            if not key.waiting:
                continue
            # One reason per key, in the order the claim refuses by (limit_standing).
            if key.paused_at is not None:
                counts[LIMIT_PAUSED] += key.waiting
            elif key.at_concurrency:
                counts[LIMIT_CONCURRENCY] += key.waiting
            elif key.held_until is not None:
                counts[LIMIT_HELD] += key.waiting
                held_until = max(held_until or key.held_until, key.held_until)
            elif key.waiting_on_rate:
                counts[LIMIT_RATE] += key.waiting_on_rate
        for kind, steps in counts.items():
            if steps:
                until = held_until if kind == LIMIT_HELD else None
                found.append(WaitingCount(kind, steps, LIMIT_PHRASES[kind], use.name, here, until))
    return found


_UNKNOWN = "on a limit no workflow here declares:"
LIMIT_PHRASES = {
    LIMIT_PAUSED: "on paused keys of the limit",
    LIMIT_HELD: "on a remote's retry-after, holding the limit",
    LIMIT_CONCURRENCY: "on the concurrency limit",
    LIMIT_RATE: "on the rate limit",
}


def _steps(now: datetime) -> list[WaitingCount]:
    """Steps waiting on their own time or on a person or worker, in one aggregate."""
    claimed_before = Q(attempts__gt=0) | (Q(fencing_token__gt=0) & ~Q(error_class=AWAITING_VERSION))
    pending = Q(status=StepStatus.PENDING)
    later = pending & Q(available_at__gt=now)
    counts = Step.objects.filter(
        status__in=[StepStatus.PENDING, StepStatus.RUNNING, StepStatus.WAITING_APPROVAL]
    ).aggregate(
        # selectors.scheduled_retries, restated as a filter (its twin).
        retry=Count("pk", filter=later & claimed_before),
        run_after=Count("pk", filter=later & ~claimed_before & ~Q(error_class=AWAITING_VERSION)),
        awaiting_version=Count("pk", filter=Q(error_class=AWAITING_VERSION) & pending),
        approval=Count("pk", filter=Q(status=StepStatus.WAITING_APPROVAL)),
        lease_expired=Count("pk", filter=Q(status=StepStatus.RUNNING, lease_expires_at__lte=now)),
    )
    table = [
        (RETRY, "retry", "to be retried after a failure", ""),
        (RUN_AFTER, "run_after", "for the start time they were enqueued with", ""),
        (AWAITING_VERSION_KIND, "awaiting_version", "for a worker with their workflow version", ""),
        (APPROVAL, "approval", "for a person's approval", link("console:approvals")),
        (LEASE_EXPIRED, "lease_expired", "on a lease that ran out (worker gone?)", _w()),
    ]
    return [
        WaitingCount(kind, counts[name], phrase, link=url)
        for kind, name, phrase, url in table
        if counts[name]
    ]
