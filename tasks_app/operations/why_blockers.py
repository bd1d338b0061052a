"""The blockers "Why isn't this running?" names (``tasks_app.operations.why`` decides which
hold a step; here is what each is and how it is said): their kinds, the value each is, the
facts read once for a batch of steps, and the sentence of each kind that has more to say
than one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tasks_app.engine import limit_standing
from tasks_app.engine.limit_standing import Refusal, Standing
from tasks_app.exceptions import error_summary
from tasks_app.models import QueueState, Step
from tasks_app.operations.why_words import (
    Pair,
    at,
    because,
    limit_link,
    link,
    one_line,
    plural,
    quoted,
    sentence,
    when,
)

# The kinds of blocker. One word per concept: a kind names what holds the step, not where.
QUEUE_PAUSED = "queue_paused"
LIMIT_PAUSED = "limit_paused"
LIMIT_HELD = "limit_held"
LIMIT_CONCURRENCY = "limit_concurrency"
LIMIT_RATE = "limit_rate"
LIMIT_UNKNOWN = "limit_unknown"
LEASE = "lease"
LEASE_EXPIRED = "lease_expired"
APPROVAL = "approval"
AWAITING_VERSION_KIND = "awaiting_version"
RUN_AFTER = "run_after"
RETRY = "retry"
EARLIER_STEP = "earlier_step"
NO_WORKER = "no_worker"
DEAD = "dead"
# Nothing holds it back: it is due, and the next worker of its queue takes it.
DUE = "due"

# The kinds whose ``until`` is when the step may start.
TIMED = frozenset({RETRY, RUN_AFTER, AWAITING_VERSION_KIND, LIMIT_RATE, LIMIT_HELD})

# A limit's refusal (``limit_standing``) as the kind of blocker it is.
LIMIT_KINDS = {
    limit_standing.PAUSED: LIMIT_PAUSED,
    limit_standing.HELD: LIMIT_HELD,
    limit_standing.AT_CONCURRENCY: LIMIT_CONCURRENCY,
    limit_standing.AT_RATE: LIMIT_RATE,
    limit_standing.UNKNOWN_LIMIT: LIMIT_UNKNOWN,
}


@dataclass(frozen=True)
class Blocker:
    """One thing holding a step back: its ``kind``, a sentence for a person (``words``), a
    few words for a list's column (``short``), where to see or act on it (``link``, with
    what the link says; "" where there is none), and the facts the sentence names."""

    kind: str
    words: str
    short: str
    step_id: int | None = None
    link: str = ""
    link_text: str = ""
    # What it names: the queue, limit, worker, group or step ("" none).
    subject: str = ""
    # Who paused it, holds its lease, or may decide it; and the reason they gave.
    who: str = ""
    reason: str = ""
    since: datetime | None = None
    until: datetime | None = None
    # Tasks it waits on: those holding a limit's slots, or none.
    tasks: tuple[int, ...] = ()

    @property
    def starts_at(self) -> datetime | None:
        """When it lets the step start, where one time says so (a retry, a start time, a
        rate or a remote's hold, a worker's next try); None for the others."""
        return self.until if self.kind in TIMED else None


@dataclass
class Facts:
    """What the rules read, once for a batch of steps."""

    now: datetime
    paused: dict[str, QueueState]
    # Queues some live worker consumes (``presence.workers``' live rows).
    consumed: set[str]
    standing: Standing | None
    holders: dict[Pair, list[int]]
    # The pending approval request of each step waiting for one (with ``approvals``).
    requests: dict[int, Any]


# --- the sentences ---------------------------------------------------------------------------


def limit_blocker(step: Step, name: str, refusal: Refusal, facts: Facts) -> Blocker:
    limit, key = refusal.limit, refusal.key
    what = f"limit {quoted(limit)}" + (f" (key {quoted(key)})" if key else "")
    standing = facts.standing
    row = standing.keys.get((limit, key)) if standing else None
    numbers = standing.effective.get(limit) if standing else None
    kind = LIMIT_KINDS.get(refusal.why, LIMIT_UNKNOWN)
    common: dict[str, Any] = {
        "step_id": step.pk,
        "link": limit_link(limit),
        "link_text": f"limit {limit}",
        "subject": f"{limit}:{key}" if key else limit,
        "until": refusal.until,
    }
    if kind == LIMIT_PAUSED:
        who = row.paused_by if row else ""
        reason = one_line(row.paused_reason) if row else ""
        since = row.paused_at if row else None
        words = (
            f"{sentence(what)} was paused by {who or 'someone'} {at(since, facts.now)}"
            f"{because(reason)}. {sentence(name)} starts once someone resumes it."
        )
        short = f"paused key {key} of {limit}" if key else f"paused limit {limit}"
        return Blocker(kind, words, short, who=who, reason=reason, since=since, **common)
    if kind == LIMIT_HELD:
        reason = one_line(row.held_reason) if row else ""
        said = f" (“{reason}”)" if reason else ""
        words = (
            f"A remote asked to be left alone{said}: {what} is held until "
            f"{when(refusal.until, facts.now)}."
        )
        return Blocker(kind, words, f"retry-after on {limit}", reason=reason, **common)
    if kind == LIMIT_CONCURRENCY:
        holders = tuple(facts.holders.get((limit, key), ()))
        cap = numbers.concurrency if numbers else None
        by = ", ".join(f"#{pk}" for pk in holders)
        held = f"task {by} holds it" if len(holders) == 1 else f"tasks {by or '(others)'} hold it"
        words = (
            f"{sentence(what)} is at its concurrency of {cap}: {held}; {name} starts when "
            f"{'it finishes' if len(holders) == 1 else 'one of them finishes'}."
        )
        return Blocker(kind, words, f"concurrency limit {limit}", tasks=holders, **common)
    if kind == LIMIT_RATE:
        rate = numbers.rate if numbers else None
        frees = (
            f"its next unit frees {at(refusal.until, facts.now)}"
            if refusal.until
            else f"{name}'s weight is more than the rate ever lets in"
        )
        words = f"{sentence(what)} is at its rate of {rate}: {frees}."
        return Blocker(kind, words, f"rate limit {limit}", **common)
    words = (
        f"No workflow on this console's side declares {what}, and no operator set its "
        f"numbers: {name} waits for a worker that declares it."
    )
    return Blocker(kind, words, f"unknown limit {limit}", **common)


def earlier_blocker(step: Step, before: Step | None, name: str) -> Blocker:
    if before is None:
        words = f"{sentence(name)} waits for an earlier step."
        return Blocker(EARLIER_STEP, words, "an earlier step", step.pk)
    earlier = f"step {before.position} ({before.kind})"
    state = str(before.status).replace("_", " ")
    return Blocker(
        EARLIER_STEP,
        f"{sentence(name)} waits for {earlier}, which is {state}.",
        earlier,
        step.pk,
        subject=earlier,
    )


def dead_blocker(step: Step, name: str, facts: Facts) -> Blocker:
    error = one_line(error_summary(step.last_error)) or step.error_class or "an error"
    return Blocker(
        DEAD,
        f"{sentence(name)} is dead after {step.attempts} attempt"
        f"{'s' if step.attempts != 1 else ''} ({error}): it waits for a person to redrive, "
        "resolve or cancel it.",
        "a person (dead letter)",
        step.pk,
        link("console:dead", query={"fingerprint": step.error_fingerprint}),
        "dead letters of this cause",
        subject=step.error_class,
        since=step.finished_at,
    )


def approval_blocker(step: Step, name: str, facts: Facts) -> Blocker:
    request = facts.requests.get(step.pk)
    if request is None:
        return Blocker(APPROVAL, f"{sentence(name)} waits for approval.", "approval", step.pk)
    deciders = [*request.groups, *request.approver_users]
    who = " or ".join(deciders) or "a superuser"
    then = "it is dead-lettered" if request.on_expiry == "dead_letter" else "the task is cancelled"
    words = (
        f"{sentence(name)} waits for a decision by {who} ({request.approvals} of "
        f"{plural(request.quorum, 'approval')} so far) since "
        f"{when(request.created_at, facts.now)}. Undecided {at(request.expires_at, facts.now)}, "
        f"{then}."
    )
    if request.escalates_at and not request.escalated_at and request.escalate_to:
        words += f" It opens to {request.escalate_to} too {at(request.escalates_at, facts.now)}."
    return Blocker(
        APPROVAL,
        words,
        f"approval by {who}",
        step.pk,
        link("console:review", request.pk),
        "the review",
        subject=who,
        who=who,
        since=request.created_at,
        until=request.expires_at,
    )


def lease_blocker(step: Step, name: str, facts: Facts) -> Blocker:
    worker, token, until = step.lease_worker, step.fencing_token, step.lease_expires_at
    cancel = (
        " A cancel was requested: its handler is asked to stop."
        if step.task.cancel_requested_at
        else ""
    )
    common: dict[str, Any] = {
        "step_id": step.pk,
        "link": link("console:queues", anchor="workers"),
        "link_text": "the workers",
        "subject": worker,
        "who": worker,
        "since": step.started_at,
        "until": until,
    }
    if until is not None and until <= facts.now:
        words = (
            f"{sentence(name)} was running on worker {worker} (token {token}), but its "
            f"lease ran out {at(until, facts.now)}: the worker is probably gone, and the "
            f"sweeper returns the step to pending at its next sweep.{cancel}"
        )
        return Blocker(LEASE_EXPIRED, words, f"lease expired ({worker})", **common)
    words = (
        f"{sentence(name)} is running on worker {worker} (token {token}) since "
        f"{when(step.started_at, facts.now)}; its lease holds until {when(until, facts.now)} "
        f"and is renewed while the handler runs.{cancel}"
    )
    return Blocker(LEASE, words, f"running on {worker}", **common)
