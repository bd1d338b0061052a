"""The invariant checker's checks on the shape of one task's event history.

Each reads the task's history (oldest first: its events and the transitions its attempt
records hold) and its stored steps, already loaded for a batch by
:func:`tasks_app.observability.invariants.check_tasks`, so none of them queries the database:

- ``enqueued``: the history starts with ``enqueued`` (a task without one, or whose first
  event is another, was written behind the services' back); and the task's first steps
  (revision 0), which record the enqueue with its row (``tasks_app.history.timeline``), are
  one per position from 0 (:func:`first_steps_findings`);
- ``fencing``: a step's ``claimed`` events name strictly increasing tokens, and no event
  of a step names a token above the step's stored ``fencing_token`` (DESIGN rule 2;
  ``stale_write_rejected`` names the token a worker presented, and is not counted);
- ``claim``: every claim of a step (token t) is followed by an event of that step carrying
  token t that ends the attempt (``succeeded``, ``retry_scheduled``, ``dead_lettered``,
  ``cancelled``, ``lease_expired`` or ``claim_released``), unless the step still runs on
  token t; and every token up to the step's stored one has its claim (an attempt record
  holds it: ``tasks_app.history.timeline``);
- ``terminal``: one end per run. An event whose ``task_status`` is ``succeeded``,
  ``cancelled`` or ``dead`` ends a run; another may follow only once an event made the
  task ``pending``, ``running`` or ``waiting_approval`` again, except a dead task that
  is then cancelled or resolved as done, the attempts of a graph's other branches that
  end while it is dead, and the ``cancelled`` or ``dead_lettered`` event written with the
  transition that ended the run (an expired lease or approval, a rejection).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasks_app.history import StepState
from tasks_app.models import EventKind, StepStatus, TaskStatus


@dataclass(frozen=True)
class Finding:
    check: str
    task_id: int | None
    detail: str

    def __str__(self) -> str:
        where = f"task {self.task_id}" if self.task_id is not None else "no task"
        return f"{self.check}: {where}: {self.detail}"


@dataclass(frozen=True)
class EventRow:
    # None for a transition read from an attempt's record (tasks_app.history.timeline).
    pk: int | None
    step_id: int | None
    kind: str
    data: dict[str, Any]

    @property
    def token(self) -> int | None:
        """The fencing token the event names (``data["token"]``), if any."""
        token = self.data.get("token")
        return token if isinstance(token, int) and not isinstance(token, bool) else None


# The events that end an attempt, each carrying the token of the claim it ends.
ATTEMPT_ENDINGS = frozenset(
    {
        EventKind.SUCCEEDED,
        EventKind.RETRY_SCHEDULED,
        EventKind.DEAD_LETTERED,
        EventKind.CANCELLED,
        EventKind.LEASE_EXPIRED,
        EventKind.CLAIM_RELEASED,
    }
)
RUN_ENDINGS = frozenset({TaskStatus.SUCCEEDED, TaskStatus.CANCELLED, TaskStatus.DEAD})
# Written in the same transaction as the event that ended the run, with the same status.
COMPANIONS = frozenset({EventKind.CANCELLED, EventKind.DEAD_LETTERED})


def history_findings(
    task_id: int, steps: dict[int, StepState], events: Sequence[EventRow]
) -> list[Finding]:
    """The ``enqueued``, ``fencing``, ``claim`` and ``terminal`` checks of one task."""
    return [
        *_enqueued_first(task_id, events),
        *_fencing(task_id, steps, events),
        *_unanswered_claims(task_id, steps, events),
        *_run_ends(task_id, events),
    ]


def _enqueued_first(task_id: int, events: Sequence[EventRow]) -> list[Finding]:
    if events and events[0].kind == EventKind.ENQUEUED:
        return []
    if not events:
        detail = "its history is empty: no enqueued event"
    elif all(event.kind != EventKind.ENQUEUED for event in events):
        detail = f"its history has no enqueued event (it starts with {_name(events[0])})"
    else:
        detail = f"its history starts with {_name(events[0])}, not enqueued"
    return [Finding("enqueued", task_id, detail)]


def first_steps_findings(task_id: int, positions: Sequence[int]) -> list[Finding]:
    """The ``enqueued`` check of the steps an enqueue made (revision 0, by their
    positions): at least one, each position from 0 once, none missing."""
    ordered = sorted(positions)
    if ordered == list(range(len(ordered))) and ordered:
        return []
    shown = ", ".join(map(str, ordered)) or "none"
    return [
        Finding(
            "enqueued",
            task_id,
            f"its first steps (revision 0) are at positions {shown}, not one each from 0",
        )
    ]


def _fencing(
    task_id: int, steps: dict[int, StepState], events: Sequence[EventRow]
) -> list[Finding]:
    findings: list[Finding] = []
    last_claim: dict[int, int] = {}
    highest: dict[int, tuple[int, EventRow]] = {}
    for event in events:
        token = event.token
        if event.step_id is None or token is None:
            continue
        if event.kind == EventKind.CLAIMED:
            before = last_claim.get(event.step_id)
            if before is not None and token <= before:
                findings.append(
                    Finding(
                        "fencing",
                        task_id,
                        f"claim of token {token} on step {event.step_id} ({_name(event)}) "
                        f"does not raise the token of its previous claim ({before})",
                    )
                )
            last_claim[event.step_id] = max(token, before or 0)
        # A refused write names the token its worker presented, which no claim may have
        # issued: only the tokens the system wrote count.
        if event.kind == EventKind.STALE_WRITE_REJECTED:
            continue
        if token > highest.get(event.step_id, (-1, event))[0]:
            highest[event.step_id] = (token, event)
    for step_id, (token, event) in sorted(highest.items()):
        stored = steps.get(step_id)
        if stored is not None and stored.fencing_token < token:
            findings.append(
                Finding(
                    "fencing",
                    task_id,
                    f"step {step_id} stores fencing token {stored.fencing_token}, below "
                    f"token {token} named by {_name(event)}",
                )
            )
    return findings


def _unanswered_claims(
    task_id: int, steps: dict[int, StepState], events: Sequence[EventRow]
) -> list[Finding]:
    # The last event ending each attempt (step, token): a claim is answered by a later one.
    ended: dict[tuple[int, int], int] = {}
    for index, event in enumerate(events):
        if event.kind in ATTEMPT_ENDINGS and event.step_id is not None and event.token is not None:
            ended[(event.step_id, event.token)] = index
    findings: list[Finding] = []
    for index, event in enumerate(events):
        token = event.token
        if event.kind != EventKind.CLAIMED or event.step_id is None or token is None:
            continue
        if ended.get((event.step_id, token), -1) > index:
            continue
        stored = steps.get(event.step_id)
        if stored is not None and (stored.status, stored.fencing_token) == (
            StepStatus.RUNNING,
            token,
        ):
            continue  # still running on that lease (the lease check looks at its expiry)
        findings.append(
            Finding(
                "claim", task_id, f"claim of token {token} on step {event.step_id} has no outcome"
            )
        )
    # Every token a step reached was a claim, recorded by its attempt record (or an event).
    claimed = {(event.step_id, event.token) for event in events if event.kind == EventKind.CLAIMED}
    for step_id, stored in sorted(steps.items()):
        missing = [t for t in range(1, stored.fencing_token + 1) if (step_id, t) not in claimed]
        if missing:
            findings.append(
                Finding(
                    "claim",
                    task_id,
                    f"step {step_id} reached token {stored.fencing_token} but its history has "
                    f"no claim of token {', '.join(map(str, missing))}",
                )
            )
    return findings


def _run_ends(task_id: int, events: Sequence[EventRow]) -> list[Finding]:
    findings: list[Finding] = []
    ended_by: EventRow | None = None  # the event that ended the current run, if it ended
    previous: EventRow | None = None
    for event in events:
        status = event.data.get("task_status")
        if isinstance(status, str):
            if status not in RUN_ENDINGS:
                ended_by = None
            elif ended_by is None:
                ended_by = event
            elif not _ends_again_legitimately(event, status, ended_by, previous):
                findings.append(
                    Finding(
                        "terminal",
                        task_id,
                        f"{_name(event)} ends as {status} a run that {_name(ended_by)} "
                        f"already ended as {ended_by.data['task_status']}",
                    )
                )
            else:
                ended_by = event
        previous = event
    return findings


def _ends_again_legitimately(
    event: EventRow, status: str, ended_by: EventRow, previous: EventRow | None
) -> bool:
    """Whether ``event`` may say the task ended when ``ended_by`` had already said so."""
    # A dead task waits for a person: cancelling it, or resolving it as done, ends it anew.
    if ended_by.data.get("task_status") == TaskStatus.DEAD and status != TaskStatus.DEAD:
        return True
    # In a graph, the branches running when another died end their attempts after it,
    # leaving the task dead.
    if (
        ended_by.data.get("task_status") == status == TaskStatus.DEAD
        and event.kind in ATTEMPT_ENDINGS
        and event.step_id not in (None, ended_by.step_id)
    ):
        return True
    # The cancelled or dead_lettered event written beside the transition that ended it.
    return (
        event.kind in COMPANIONS
        and previous is not None
        and previous.kind != event.kind
        and previous.data.get("task_status") == status
    )


def _name(event: EventRow) -> str:
    if event.pk is None:
        return f"the {event.kind} of token {event.token} (its Lease row)"
    return f"event {event.pk} ({event.kind})"
