"""The console cells' data: a database per size, migrated, then filled with COPY.

Finished history spread over the 30 days before the build (ids follow creation time),
plus the same few hundred tasks of active work at every size from 10,000 up. The rows are
the ones the product writes (DESIGN rule 11): the task row and its step record the enqueue,
an attempt's Lease row (with its ``attempt``) its claim and a success, and events only the
rest (``tasks_app.history.timeline`` derives the history from them):

- 2% cancelled before a claim: a ``cancelled`` event by a person (on the audit chain);
- 1% dead: three failed attempts, a Lease row each, events ``retry_scheduled`` twice and
  ``dead_lettered``, the traceback on the step;
- 150 pending (due) and 50 running created in the last three minutes: a running step holds
  its live lease (holder, token, expiry) and has no Lease row yet, and its task's row
  stays ``pending``; 100 waiting for approval (a pending request, an
  ``approval_requested`` event) created in the last day (3% of the tasks in all below
  10,000);
- the rest (~97%) succeeded: one attempt, its Lease row and no event; a tenth of
  ``demo.flaky``'s two, the first failed (its Lease row, ``retry_scheduled``, its error
  kept on the step).

One step per task (position 0, revision 0), its id the task's. Workflows ``demo.noop``,
``demo.flaky``, ``publish_article``, ``ticket_reply`` (version 1), queue ``default``.

The metrics counters hold what that history counted (per workflow: enqueues, the run-time histogram,
retries and dead letters), and the workflow figures' samples what the sweeper would have taken of
them over the last fifteen days (``tasks_app.observability.workflow_samples``: one per workflow each
minute its totals changed and the first of each hour over the last two days, the hourly ones
before), so their size follows the days sampled, not the tasks. The tables are truncated and filled
in one transaction with ``COPY … FREEZE`` (rows visible to all, as old history is after vacuum), the
identity sequences set past the rows, then ``VACUUM (ANALYZE)``. Nothing here imports Django.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

SPAN = 30 * 24 * 3600.0  # the history's spread, seconds
LEASE_SECONDS = 300
CHUNK = 5_000  # rows per write to the COPY stream
WORKER = "celery@bench-{}:{}"
NULL = "\\N"

# (workflow, kind of its one step); a task's workflow is WORKFLOWS[id % 10].
WORKFLOWS = (
    *[("demo.noop", "noop")] * 4,
    *[("demo.flaky", "flaky")] * 2,
    *[("publish_article", "generate_draft")] * 2,
    *[("ticket_reply", "lookup_customer")] * 2,
)
# Waiting tasks sit at their approval step: (workflow, step kind, action, draft step,
# send back to, expiry hours, on expiry).
GATES = (
    ("publish_article", "editor_review", "publish", "generate_draft", "generate_draft", 48,
     "dead_letter"),
    ("ticket_reply", "review", "send", "draft_reply", "draft_reply", 24, "cancel"),
)  # fmt: skip
RESULTS = {
    "noop": "{}",
    "generate_draft": '{"title": "Article", "body": "Draft text.", "revision": 0}',
    "lookup_customer": '{"name": "Customer", "email": "customer@customers.example"}',
}
FLAKY_RESULT = '{{"token": {n}, "attempt": {n}}}'  # of the claim that succeeded

ERROR_CLASS = "tasks_app.exceptions.RetryableError"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/tasks_app/engine/runner.py", line 212, in run_claim\n'
    "    result = spec.handler(ctx)\n"
    '  File "/app/tasks_app/demo/workflows.py", line 52, in flaky\n'
    '    raise error(f"failing on claim {ctx.fencing_token} (fail_rate {rate})")\n'
    "tasks_app.exceptions.RetryableError: failing on claim {token} (fail_rate 0.5)\n"
)

PENDING, RUNNING, WAITING = "pending", "running", "waiting_approval"
SUCCEEDED, CANCELLED, DEAD = "succeeded", "cancelled", "dead"


def copy_text(value: str) -> str:
    """A field in COPY's text format."""
    return (
        value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )


def ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(sep=" ")


def jtext(value: Any) -> str:
    return copy_text(json.dumps(value))


# Each claim's traceback, as its step and its failure's event keep it (short: no event cuts it).
ERRORS = {token: TRACEBACK.replace("{token}", str(token)) for token in (1, 2, 3)}
# The cause a dead step of that traceback stores (tasks_app.models.fingerprints: the numbers are
# masked, so every dead step here has this one); tests/project/test_bench_console_data.py checks it.
CAUSE = "6d7e53647bc0eaee"
# The operator events written here (tasks_app.models.OPERATOR_EVENT_KINDS), chained as
# tasks_app.history.audit_chain chains them.
CHAINED = frozenset({CANCELLED})


@dataclass(frozen=True)
class Plan:
    """Which task ids get which status, and the counts to check the load against."""

    n: int
    now: float
    status: dict[int, str]  # every id not in here succeeded

    def of(self, task_id: int) -> str:
        return self.status.get(task_id, SUCCEEDED)

    def counts(self) -> dict[str, int]:
        counts = Counter(self.status.values())
        counts[SUCCEEDED] = self.n - len(self.status)
        return dict(counts)


def active_counts(n: int) -> dict[str, int]:
    active = min(300, n * 3 // 100)
    waiting, running = active // 3, active // 6
    return {PENDING: active - waiting - running, RUNNING: running, WAITING: waiting}


def plan(n: int, seed: int, now: float) -> Plan:
    rng = random.Random(seed)
    status: dict[int, str] = {}
    active = active_counts(n)

    def pick(count: int, low: int, value: str) -> None:
        low = max(1, low)
        while count:
            task_id = rng.randint(low, n)
            if task_id not in status:
                status[task_id] = value
                count -= 1

    # Pending and running among the newest ids (their times are set to the last minutes),
    # waiting among the last day's, dead and cancelled anywhere in the history.
    pick(active[PENDING], n - 3 * (active[PENDING] + active[RUNNING]), PENDING)
    pick(active[RUNNING], n - 3 * (active[PENDING] + active[RUNNING]), RUNNING)
    pick(active[WAITING], n - max(n // 30, 3 * active[WAITING]), WAITING)
    pick(n // 100, 1, DEAD)
    pick(n // 50, 1, CANCELLED)
    return Plan(n, now, status)


def _frac(task_id: int, salt: int) -> float:
    """A cheap deterministic number in [0, 1) per task."""
    return (((task_id * 2654435761) ^ (salt * 40503)) & 0xFFFF) / 65536


# The step run-time histogram's bounds (tasks_app.history.counting.STEP_SECONDS_BUCKETS),
# their counter labels, and how long the samples are kept
# (tasks_app.observability.workflow_samples).
RUN_BOUNDS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
RUN_LABELS = (*(f"{b:g}" for b in RUN_BOUNDS), "inf")
SAMPLED_SPAN = 15 * 24 * 3600.0
FINE_SPAN = 2 * 24 * 3600.0
# A slot's counts: enqueued, succeeded, retried, dead-lettered, the run time's sum in ms,
# then one per run-time bucket.
N_ENQ, N_DONE, N_RETRY, N_DEAD, N_SUM_MS, N_BUCKETS = 0, 1, 2, 3, 4, 5


class Tally:
    """What the history counted, per workflow and minute, for the counters and the samples:
    minutes before the sampled span are added up in one slot (-1)."""

    def __init__(self, now: float) -> None:
        self.since = now - SAMPLED_SPAN
        self.slots: dict[str, dict[int, list[int]]] = {}

    def add(self, workflow: str, at: float, what: int, n: int = 1) -> None:
        slot = max(int((at - self.since) // 60), -1)
        counts = self.slots.setdefault(workflow, {}).setdefault(slot, [0] * (N_BUCKETS + 11))
        counts[what] += n

    def run(self, workflow: str, at: float, seconds: float) -> None:
        bucket = next((i for i, b in enumerate(RUN_BOUNDS) if seconds <= b), len(RUN_BOUNDS))
        self.add(workflow, at, N_DONE)
        self.add(workflow, at, N_BUCKETS + bucket)
        self.add(workflow, at, N_SUM_MS, round(seconds * 1000))

    def totals(self, workflow: str) -> list[int]:
        out = [0] * (N_BUCKETS + 11)
        for counts in self.slots.get(workflow, {}).values():
            out = [a + b for a, b in zip(out, counts, strict=True)]
        return out

    def counter_lines(self) -> list[str]:
        """The counter rows (one shard) of every workflow's totals."""
        lines = []
        for workflow in sorted(self.slots):
            t = self.totals(workflow)
            named = {
                f"enqueued:{workflow}": t[N_ENQ],
                f"step_seconds@{workflow}:sum_ms": t[N_SUM_MS],
                f"event@{workflow}:retry_scheduled": t[N_RETRY],
                f"event@{workflow}:dead_lettered": t[N_DEAD],
                **{f"step_seconds@{workflow}:le={label}": t[N_BUCKETS + i]
                   for i, label in enumerate(RUN_LABELS)},
            }  # fmt: skip
            lines += [f"{copy_text(name)}#0\t{n}" for name, n in named.items() if n]
        return lines

    def sample_lines(self, now: float) -> list[str]:
        """The samples the sweeper would have taken: each minute of the last two days
        that changed a workflow's totals, and the first minute of every hour."""
        lines: list[str] = []
        sample_id = 0
        last_minute = int((now - self.since) // 60)
        for workflow in sorted(self.slots):
            slots = self.slots[workflow]
            running = slots.get(-1, [0] * (N_BUCKETS + 11))
            fine_from = int((now - FINE_SPAN - self.since) // 60)
            for minute in range(last_minute + 1):
                counts = slots.get(minute)
                if counts is not None:
                    running = [a + b for a, b in zip(running, counts, strict=True)]
                at = self.since + minute * 60 + 59  # at the minute's end: all of it counted
                hourly = int(at) % 3600 < 60
                if at > now:
                    break
                if not (hourly or (counts is not None and minute >= fine_from)):
                    continue
                sample_id += 1
                buckets = {
                    label: running[N_BUCKETS + i] for i, label in enumerate(RUN_LABELS)
                    if running[N_BUCKETS + i]
                }  # fmt: skip
                lines.append(
                    f"{sample_id}\t{copy_text(workflow)}\t{ts(at)}\t{'t' if hourly else 'f'}"
                    f"\t{running[N_ENQ]}\t{running[N_DONE]}\t{running[N_RETRY]}\t{running[N_DEAD]}"
                    f"\t{jtext(buckets)}\t{running[N_SUM_MS]}"
                )
        return lines


@dataclass
class Rows:
    tasks: list[str]
    steps: list[str]
    leases: list[str]
    events: list[str]
    approvals: list[str]


@dataclass
class StepRow:
    """A task's one step as the product leaves it, its columns as COPY text."""

    kind: str
    status: str
    # Its due time (the enqueue's, or its last retry's), which its doorbell was sent at too.
    available: str
    attempts: int = 0  # its fencing token too: no step here is redriven
    result: str = NULL
    error: str = ""
    error_class: str = ""
    started: str = NULL
    finished: str = NULL
    # The live lease of an attempt running (DESIGN rule 2): its expiry and holder.
    lease_expires: str = NULL
    lease_worker: str = ""
    cause: str = ""
    dead_workflow: str = ""

    def line(self, step_id: int) -> str:
        return (
            f"{step_id}\t{step_id}\t0\t0\t{self.kind}\t{self.status}\tdefault\t0\t{self.attempts}"
            f"\t3\t{self.available}\ttask-{step_id}:0:{self.kind}\t{self.attempts}"
            f"\t{self.lease_expires}\t{self.lease_worker}\t{self.available}\t{self.result}"
            f"\t{self.error}\t{self.error_class}\t{self.started}\t{self.finished}\t{NULL}"
            f"\t{self.cause}\t{self.dead_workflow}"
        )


def canonical(document: Any) -> str:
    """Canonical JSON (``tasks_app.validation.canonical_json``, the audit chain's form)."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def chain_hash(event: dict[str, Any], previous: str) -> str:
    """The hash ``tasks_app.history.audit_chain.event_hash`` gives an operator event: of its
    canonical form with the hash of the chained event before (``""`` for the first)."""
    return hashlib.sha256(canonical({**event, "previous": previous}).encode()).hexdigest()


class Generator:
    """The rows of every table, task by task, as lines of COPY text."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.lease_id = 0
        self.event_id = 0
        self.approval_id = 0
        self.chain_head = ""  # the audit chain's newest hash
        self.end = plan.now - 5
        self.start = self.end - SPAN
        self.totals: Counter[str] = Counter()
        self.tally = Tally(plan.now)

    def chunks(self) -> Iterator[Rows]:
        rows = Rows([], [], [], [], [])
        for task_id in range(1, self.plan.n + 1):
            self.task(task_id, rows)
            if len(rows.tasks) >= CHUNK:
                yield rows
                rows = Rows([], [], [], [], [])
        if rows.tasks:
            yield rows

    def event(
        self, rows: Rows, task_id: int, kind: str, actor: str, at: float, data: dict[str, Any],
        *, reason: str = "", step: bool = True,
    ) -> None:  # fmt: skip
        """An Event row; an operator event is appended to the audit chain."""
        self.event_id += 1
        created = datetime.fromtimestamp(at, UTC)
        chain = f"{NULL}\t{NULL}"
        if kind in CHAINED:
            event = {
                "id": self.event_id, "task_id": task_id, "step_id": task_id if step else None,
                "kind": kind, "actor": actor, "actor_user_id": None, "reason": reason,
                "data": data, "created_at": created.isoformat(timespec="microseconds"),
            }  # fmt: skip
            previous, self.chain_head = self.chain_head, chain_hash(event, self.chain_head)
            chain = f"{previous}\t{self.chain_head}"
        rows.events.append(
            f"{self.event_id}\t{task_id}\t{task_id if step else NULL}\t{kind}\t{actor}\t{NULL}"
            f"\t{copy_text(reason)}\t{jtext(data)}\t{created.isoformat(sep=' ')}\t{chain}"
        )

    def attempt(
        self, rows: Rows, task_id: int, worker: str, claim: int, claimed_at: float,
        ended_at: float, *, failed: bool = False, retry_in: float | None = None,
    ) -> None:  # fmt: skip
        """Attempt ``claim`` (its fencing token too) of the task's step, ended at ``ended_at``:
        its Lease row, which records its claim and a success (``history.timeline``), and
        for a failure its event: the retry ``retry_in`` s later, or (None) the dead letter."""
        self.lease_id += 1
        outcome = "failed" if failed else SUCCEEDED
        rows.leases.append(
            f"{self.lease_id}\t{task_id}\t{claim}\t{claim}\t{worker}\t{ts(claimed_at)}"
            f"\t{ts(claimed_at + LEASE_SECONDS)}\t{ts(ended_at)}\t{outcome}"
        )
        if not failed:
            return
        state, kind = (
            (PENDING, "retry_scheduled") if retry_in is not None else (DEAD, "dead_lettered")
        )
        data = {
            "steps": {str(task_id): [state, claim, claim]}, "token": claim,
            "error_class": ERROR_CLASS, "error": ERRORS[claim], "retry_in": retry_in,
            "task_status": state,
        }  # fmt: skip
        reason = "max_attempts" if state == DEAD else ""
        self.event(rows, task_id, kind, f"worker:{worker}", ended_at, data, reason=reason)

    def failures(
        self, rows: Rows, task_id: int, workflow: str, worker: str, step: StepRow,
        claim_at: float, count: int, *, dies: bool,
    ) -> float:  # fmt: skip
        """The step's first ``count`` attempts from ``claim_at``: each fails 0.01 s after its
        claim and is retried 0.2 s times its number later, or (the last, if it ``dies``) is
        dead-lettered. Returns when the claim after them, or the last one, began."""
        for claim in range(1, count + 1):
            failed_at = claim_at + 0.01
            last = dies and claim == count
            retry_in = None if last else 0.2 * claim
            self.attempt(
                rows, task_id, worker, claim, claim_at, failed_at, failed=True, retry_in=retry_in
            )
            self.tally.add(workflow, failed_at, N_DEAD if last else N_RETRY)
            # The step keeps its last error, even once a retry succeeds.
            step.error, step.error_class = copy_text(ERRORS[claim]), ERROR_CLASS
            if retry_in is not None:
                claim_at = failed_at + retry_in
                step.available = ts(claim_at)
        return claim_at

    def task(self, task_id: int, rows: Rows) -> None:
        status = self.plan.of(task_id)
        self.totals[status] += 1
        workflow, kind = WORKFLOWS[task_id % 10]
        now = self.plan.now
        created = self.start + SPAN * task_id / self.plan.n
        if status in (PENDING, RUNNING):
            created = now - 1 - 180 * _frac(task_id, 1)
        started = created + 0.01 + 0.3 * _frac(task_id, 2)
        finished = started + 0.005 + 1.5 * _frac(task_id, 3)
        c_at = ts(created)
        payload_hash = hashlib.sha256(b"%d" % task_id).hexdigest()
        worker = WORKER.format(1 + task_id % 2, 1000 + task_id % 4)
        task_finished, updated = NULL, c_at
        gate = GATES[task_id % 2]
        if status == WAITING:
            workflow, kind = gate[0], gate[1]
        elif status == DEAD and task_id % 10 < 8:
            workflow, kind = "demo.flaky", "flaky"
        # The enqueue: the task row and its step, no event (history.timeline reads it).
        step = StepRow(kind, status, NULL if status == WAITING else c_at)
        payload = f'{{"n": {task_id}, "customer": "c-{task_id % 1000}"}}'
        self.tally.add(workflow, created, N_ENQ)
        if status == SUCCEEDED:
            retried = 1 if kind == "flaky" and task_id % 100 < 10 else 0
            claim_at = self.failures(
                rows, task_id, workflow, worker, step, started, retried, dies=False
            )
            if retried:
                finished = max(finished, claim_at + 0.01)
            self.tally.run(workflow, finished, finished - claim_at)
            # The success: its Lease row alone (no next step for an event to make due).
            self.attempt(rows, task_id, worker, retried + 1, claim_at, finished)
            step.attempts = retried + 1
            step.result = FLAKY_RESULT.format(n=retried + 1) if kind == "flaky" else RESULTS[kind]
            step.started, step.finished = ts(claim_at), ts(finished)
            task_finished = updated = step.finished
        elif status == CANCELLED:
            at = min(created + 30 + 600 * _frac(task_id, 4), now - 1)
            data = {"steps": {str(task_id): [CANCELLED, 0, 0]}, "task_status": CANCELLED}
            # A person's cancel names no step.
            self.event(
                rows, task_id, CANCELLED, "alice", at, data, reason="no longer needed", step=False
            )
            step.finished = task_finished = updated = ts(at)
        elif status == DEAD:
            claim_at = self.failures(rows, task_id, workflow, worker, step, started, 3, dies=True)
            step.attempts = 3
            step.cause, step.dead_workflow = CAUSE, workflow
            step.started, step.finished = ts(claim_at), ts(claim_at + 0.01)
            task_finished = updated = step.finished
        elif status == RUNNING:
            # The claim: the live lease on the step; the task row stays as enqueued.
            step.attempts = 1
            step.started, step.lease_expires = ts(started), ts(started + LEASE_SECONDS)
            step.lease_worker = worker
        elif status == WAITING:
            self.approval(rows, task_id, gate, started)
            updated = ts(started)
        stored = PENDING if status == RUNNING else status  # DESIGN rule 11
        rows.tasks.append(
            f"{task_id}\t{workflow}\t1\t{payload}\t{payload_hash}\t{NULL}\tdefault\t0\t{stored}"
            f"\tapi\t{c_at}\t{updated}\t{task_finished}\t{NULL}\t{NULL}"
        )
        rows.steps.append(step.line(task_id))

    def approval(self, rows: Rows, task_id: int, gate: tuple[Any, ...], opened: float) -> None:
        """The request the task's approval step opened at ``opened``, and its event."""
        workflow, _kind, action, draft_step, send_back, hours, on_expiry = gate
        self.approval_id += 1
        draft = {"title": f"Article {task_id}", "body": "Draft text.", "revision": 0}
        draft_hash = hashlib.sha256(canonical(draft).encode()).hexdigest()
        summary = f"{action.title()}s the draft of task {task_id} ({workflow})"
        expires = opened + hours * 3600
        rows.approvals.append(
            f"{self.approval_id}\t{task_id}\t{task_id}\t0\tpending\t{action}\t{copy_text(summary)}"
            f"\t{jtext(draft)}\t{draft_hash}\t{draft_step}\t{send_back}\teditors\t[]\t{on_expiry}"
            f"\tapi\t{ts(opened)}\t{ts(expires)}\t\t{NULL}\t\t{NULL}\t{NULL}"
        )
        data = {
            "steps": {str(task_id): [WAITING, 0, 0]}, "task_status": WAITING,
            "request": self.approval_id, "revision": 0, "draft_hash": draft_hash,
            "expires_at": datetime.fromtimestamp(expires, UTC).isoformat(),
        }  # fmt: skip
        self.event(rows, task_id, "approval_requested", "system", opened, data)


COLUMNS = {
    "tasks_app_task": "id, workflow, workflow_version, payload, payload_hash, idempotency_key,"
    " queue, priority, status, created_by, created_at, updated_at, finished_at,"
    " cancel_requested_at, created_by_user_id",
    "tasks_app_step": "id, task_id, position, revision, kind, status, queue, priority, attempts,"
    " max_attempts, available_at, idempotency_key, fencing_token, lease_expires_at,"
    " lease_worker, dispatched_at, result, last_error, error_class, started_at, finished_at,"
    " change_request, error_fingerprint, dead_workflow",
    "tasks_app_lease": "id, step_id, token, attempt, worker_id, acquired_at, expires_at,"
    " released_at, outcome",
    "tasks_app_event": "id, task_id, step_id, kind, actor, actor_user_id, reason, data, created_at,"
    " chain_previous, chain_hash",
    "approvals_approvalrequest": "id, task_id, step_id, revision, status, action, summary, draft,"
    " draft_hash, draft_step, send_back_to, approver_group, approver_users, on_expiry,"
    " requested_by, created_at, expires_at, decided_by, decided_at, comment,"
    " decided_by_user_id, requested_by_user_id",
    # Written after the tasks (Tally), not per chunk: see load.
    "tasks_app_counter": "name, value",
    "tasks_app_workflowsample": "id, workflow, taken_at, hourly, enqueued, succeeded, retried,"
    " dead_lettered, run_buckets, run_ms",
}
# The tables of COLUMNS that Generator.chunks writes row by row.
PER_TASK = (
    "tasks_app_task",
    "tasks_app_step",
    "tasks_app_lease",
    "tasks_app_event",
    "approvals_approvalrequest",
)
FIELDS = {
    "tasks_app_task": "tasks",
    "tasks_app_step": "steps",
    "tasks_app_lease": "leases",
    "tasks_app_event": "events",
    "approvals_approvalrequest": "approvals",
}


def load(dsn: str, n: int, *, seed: int = 1) -> dict[str, Any]:
    """Fill a migrated database with ``n`` tasks; return what was written and how long it
    took. The tables written must be empty of anything worth keeping: they are truncated."""
    began = time.monotonic()
    the_plan = plan(n, seed, time.time())
    gen = Generator(the_plan)
    tables = list(PER_TASK)
    written: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="bench-console-data-") as folder:
        # One connection runs one COPY at a time: the rows are generated in one pass and
        # spooled to a file per table, then each file is copied in.
        spools = {table: Path(folder, f"{table}.copy") for table in tables}
        files = {table: path.open("w", buffering=1 << 20) for table, path in spools.items()}
        try:
            for rows in gen.chunks():
                for table in tables:
                    lines: list[str] = getattr(rows, FIELDS[table])
                    if lines:
                        files[table].write("\n".join(lines) + "\n")
                        written[table] += len(lines)
        finally:
            for handle in files.values():
                handle.close()
        # The counters and the workflow figures' samples of that history.
        rollup = {
            "tasks_app_counter": gen.tally.counter_lines(),
            "tasks_app_workflowsample": gen.tally.sample_lines(the_plan.now),
        }
        for table, lines in rollup.items():
            with spools.setdefault(table, Path(folder, f"{table}.copy")).open("w") as spool:
                spool.write("".join(line + "\n" for line in lines))
            written[table] = len(lines)
        generated = time.monotonic() - began
        with psycopg.connect(dsn, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            # COPY FREEZE wants its table truncated in the same transaction. The events refuse
            # a TRUNCATE unless the database allows it (Server._create, in bench/databases.py).
            # The payloads' search copy has no key to cascade from: a trigger fills it anew.
            truncated = [*tables, *rollup, "tasks_app_payloadsearch"]
            cur.execute("TRUNCATE " + ", ".join(truncated) + " CASCADE")
            for table in [*tables, *rollup]:
                sql = f"COPY {table} ({COLUMNS[table]}) FROM STDIN WITH (FREEZE)"
                with cur.copy(sql) as cp, spools[table].open("rb") as source:
                    while block := source.read(1 << 20):
                        cp.write(block)
                # The identity sequence past the rows, so later inserts work.
                if table != "tasks_app_counter":  # keyed by name
                    cur.execute(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"  # noqa: S608 (a table of COLUMNS)
                        f" coalesce(max(id), 0) + 1, false) FROM {table}"
                    )
            conn.commit()
        copied = time.monotonic() - began - generated
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        vacuum_began = time.monotonic()
        conn.execute("VACUUM (ANALYZE)")
        vacuumed = time.monotonic() - vacuum_began
        check(conn, the_plan, written)
        size = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])  # type: ignore[index]
    return {
        "tasks": n,
        "by_status": the_plan.counts(),
        "rows": dict(written),
        "generate_s": generated,
        "copy_s": copied,
        "vacuum_analyze_s": vacuumed,
        "database_mib": size / 1024 / 1024,
        "now": ts(the_plan.now),
    }


def check(conn: psycopg.Connection[Any], the_plan: Plan, written: Counter[str]) -> None:
    """The loaded rows against the plan: every table's count; the tasks per stored status (a
    task whose step runs is stored ``pending``: DESIGN rule 11) and the steps per status (the
    plan's); a step's status its task's, but a running one's; a Lease row for each attempt
    that ended and none yet for a running one, whose live lease is on its step; no event
    of a transition other rows record (``enqueued``, ``claimed``, ``succeeded``)."""
    problems = []
    for table, count in written.items():
        sql = f"SELECT count(*) FROM {table}"  # noqa: S608 (a table of COLUMNS)
        found = conn.execute(sql).fetchone()[0]  # type: ignore[index]
        if found != count:
            problems.append(f"{table}: {found} rows, wrote {count}")
    planned = the_plan.counts()
    stored = Counter(planned)
    stored[PENDING] += stored.pop(RUNNING, 0)
    for table, want in (("tasks_app_task", dict(+stored)), ("tasks_app_step", planned)):
        sql = f"SELECT status, count(*) FROM {table} GROUP BY status"  # noqa: S608 (a constant)
        found = {str(status): int(count) for status, count in conn.execute(sql).fetchall()}
        if found != want:
            problems.append(f"{table} per status {found}, planned {want}")
    queries = {
        "steps whose status is not their task's": "SELECT count(*) FROM tasks_app_step s"
        " JOIN tasks_app_task t ON t.id = s.task_id"
        " WHERE t.status <> CASE s.status WHEN 'running' THEN 'pending' ELSE s.status END",
        "steps with a live lease that do not run, or running without one": "SELECT count(*)"
        " FROM tasks_app_step WHERE (status = 'running')"
        " <> (lease_worker <> '' AND lease_expires_at IS NOT NULL AND started_at IS NOT NULL)",
        "Lease rows beyond the attempts that ended": "SELECT (SELECT count(*) FROM"
        " tasks_app_lease) - (SELECT coalesce(sum(fencing_token), 0)"
        " - count(*) FILTER (WHERE status = 'running') FROM tasks_app_step)",
        "Lease rows without their attempt": "SELECT count(*) FROM tasks_app_lease"
        " WHERE attempt <> token OR released_at IS NULL",
        "events that other rows record": "SELECT count(*) FROM tasks_app_event"
        " WHERE kind IN ('enqueued', 'claimed', 'succeeded')",
    }
    for what, sql in queries.items():
        found = conn.execute(sql).fetchone()[0]  # type: ignore[index]
        if found:
            problems.append(f"{found} {what}")
    if problems:
        raise RuntimeError("the console data did not load as planned: " + "; ".join(problems))
