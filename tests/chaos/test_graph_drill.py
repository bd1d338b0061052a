"""The graph drill: 200 ``chaos.fan_out`` tasks (``tests/chaos/graph_workflow.py``: ``start``,
10 branches in parallel, each writing once to the publishing remote, then ``join``) drained
by real workers while whole workers are SIGKILLed and replaced, six times over the run.

Each kill waits for a write the remote has applied and the ledger has not yet recorded,
and kills the worker whose pool process waits for its answer: the step's next attempt
must call again with the same key, and the remote apply it once.

- every task succeeded, no step is dead, the checker finds nothing
  (``check(since=None)``, its ``order`` check included) and no write was applied twice
  (:func:`assert_nothing_lost_or_done_twice`);
- the remote applied each branch's write and each join's record exactly once: 2,000 keys
  and 200, and nothing else;
- each join started after every one of its branches had finished (the current rows);
- every step a kill cut short ran again under a higher token, and every write cut after the
  remote applied it was sent again with its key.

What it measured is recorded (``record_property``) and shown after the run.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.models import Effect, Step, StepStatus, TaskStatus
from tasks_app.workflows import registry
from tests.chaos.harness import (
    Cluster,
    Cut,
    Record,
    Remotes,
    assert_cut_steps_ran_again,
    assert_nothing_lost_or_done_twice,
    wait_for_drain,
)
from tests.e2e_support import ROOT, Worker, wait_for
from tests.remotes import LoopbackRemote

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

TASKS = 200
# Step workers and pool processes each: nine processes for 2,400 steps on two CPUs; their
# handlers mostly wait for the remote's answer.
WORKERS = 3
CONCURRENCY = 3
# Spread over the run: the n-th kill once n eighths of the steps have succeeded, so the
# last leaves a quarter of the work to run on the replacements.
KILLS = 6


@dataclass(frozen=True)
class Kill:
    # The token of each step the worker's pool held when it was killed (step -> token).
    tokens: dict[int, int]
    # When, by the database's clock.
    at: datetime
    # The write the remote had applied and the ledger not recorded, and whether the
    # kill landed before the record (its ledger row still ``started`` after the kill).
    key: str
    cut_after_applying: bool


@pytest.fixture
def drill_workflow() -> Iterator[None]:
    """``chaos.fan_out`` registered in this process for the drill, and only for it."""
    from tests.chaos import graph_workflow

    registry.register(graph_workflow.DRILL)
    yield
    registry.unregister(graph_workflow.NAME, graph_workflow.DRILL.version)


def add_worker(cluster: Cluster) -> Worker:
    """A step worker that imports the drill's workflow; not waited for."""
    from tests.chaos import graph_workflow

    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    name = f"graph{len(cluster.processes)}"
    worker = Worker(
        [
            *("--queues", "default", "--concurrency", str(CONCURRENCY)),
            *("-I", graph_workflow.MODULE, "--loglevel", "INFO", "-n", f"{name}@%h"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        env={**cluster.env, "PYTHONPATH": python_path},
        log_path=cluster.folder / f"{name}.log",
    )
    cluster.workers.append(worker)
    cluster.processes.append(worker)
    return worker


def enqueue(count: int) -> list[int]:
    from tests.chaos import graph_workflow

    items = [
        {"workflow": graph_workflow.NAME, "payload": {}, "idempotency_key": f"graph-{n}"}
        for n in range(count)
    ]
    return [result.task.pk for result in services.enqueue_many(items, actor="test:chaos")]


def succeeded_steps(ids: Sequence[int]) -> int:
    return Step.objects.filter(task__in=ids, status=StepStatus.SUCCEEDED).count()


def wait_for_steps(ids: Sequence[int], count: int, cluster: Cluster) -> None:
    """Wait until ``count`` of the tasks' steps have succeeded."""
    wait_for(
        lambda: succeeded_steps(ids) >= count,
        timeout=120,
        interval=0.05,
        what=lambda: f"{count} steps to succeed, {succeeded_steps(ids)} did\n" + cluster.tails(),
    )


def applied_not_recorded(cluster: Cluster, remote: LoopbackRemote) -> tuple[Worker, str] | None:
    """A write the remote applied whose answer the ledger has not recorded yet, and the live
    worker whose pool process holds its step."""
    applied = {write["key"] for write in remote.applied}
    # The latest started first: the most of its answer's way back is still ahead.
    waiting = (
        Effect.objects.filter(status=Effect.Status.STARTED, step__status=StepStatus.RUNNING)
        .order_by("-created_at")
        .values_list("key", "step__lease_worker")
    )
    for key, holder in waiting:
        if key not in applied:
            continue
        pid = int(holder.rsplit(":", 1)[1])
        victim = next((worker for worker in cluster.workers if worker.is_pool_child(pid)), None)
        if victim is not None:
            return victim, key
    return None


def pool_of(worker: Worker) -> set[int]:
    """The worker's pool processes now: its children, as Linux lists them per thread."""
    return {
        int(pid)
        for children in Path(f"/proc/{worker.pid}/task").glob("*/children")
        for pid in children.read_text().split()
    }


def held_by(pool: set[int]) -> dict[int, int]:
    """The token of each running step a process of ``pool`` holds (a lease's worker id
    ends with its pid)."""
    running = Step.objects.filter(status=StepStatus.RUNNING).values_list(
        "pk", "fencing_token", "lease_worker"
    )
    return {step: token for step, token, holder in running if int(holder.rsplit(":", 1)[1]) in pool}


def kill_mid_call(cluster: Cluster, remote: LoopbackRemote) -> Kill:
    """SIGKILL the worker holding a write the remote applied and the ledger has not
    recorded, and start another in its place."""
    victim, key = wait_for(
        lambda: applied_not_recorded(cluster, remote),
        timeout=60,
        # The window is the answer's way back (graph_workflow.ANSWER_SECONDS).
        interval=0.02,
        what=lambda: "a write applied and not yet recorded\n" + cluster.tails(),
    )
    pool = pool_of(victim)
    cluster.kill(victim)
    at = db_now()
    # Read after the kill, so a step claimed meanwhile is counted too. Nobody else holds
    # these steps until their leases run out: the rows are as the kill left them.
    tokens = held_by(pool)
    cut = Effect.objects.filter(key=key, status=Effect.Status.STARTED).exists()
    add_worker(cluster)
    return Kill(tokens, at, key, cut)


def written_keys(ids: Sequence[int]) -> tuple[list[str], list[str]]:
    """The ledger keys of the branches' writes and of the joins' records: a step's key and
    the effect's name (``Effects.key``), read from the current rows."""
    from tests.chaos import graph_workflow

    rows = Step.objects.current().filter(task__in=ids).values_list("kind", "idempotency_key")
    branches = [f"{key}:write" for kind, key in rows if kind in graph_workflow.KINDS]
    joins = [f"{key}:record" for kind, key in rows if kind == "join"]
    return branches, joins


def joins_before_branches(ids: Sequence[int]) -> dict[int, tuple[datetime, datetime]]:
    """Tasks whose join started before their last branch finished: when each did."""
    from tests.chaos import graph_workflow

    rows = (
        Step.objects.current()
        .filter(task__in=ids)
        .values_list("task", "kind", "started_at", "finished_at")
    )
    joined: dict[int, datetime] = {}
    last_branch: dict[int, datetime] = {}
    for task, kind, started, finished in rows:
        if kind == "join":
            assert started is not None, f"task {task}'s join never started"
            joined[task] = started
        elif kind in graph_workflow.KINDS:
            assert finished is not None, f"task {task}'s {kind} never finished"
            last_branch[task] = max(finished, last_branch.get(task, finished))
    assert set(joined) == set(last_branch) == set(ids)
    return {
        task: (started, last_branch[task])
        for task, started in joined.items()
        if started < last_branch[task]
    }


def not_once(applied: Counter[str], expected: Sequence[str]) -> dict[str, int]:
    """The expected keys not applied exactly once, and the keys applied unexpected."""
    known = set(expected)
    wrong = {key: applied[key] for key in expected if applied[key] != 1}
    wrong.update({key: count for key, count in applied.items() if key not in known})
    return wrong


def test_200_fan_outs_of_10_survive_workers_killed_mid_write(
    drill_workflow: None,
    cluster: Cluster,
    counting_remotes: Remotes,
    record_property: Record,
) -> None:
    from tests.chaos import graph_workflow

    publishing, mail = counting_remotes
    steps = TASKS * (graph_workflow.WIDTH + 2)
    cluster.start(workers=0)
    for worker in [add_worker(cluster) for _ in range(WORKERS)]:
        worker.wait_ready(timeout=90)

    began = time.monotonic()
    ids = enqueue(TASKS)
    kills: list[Kill] = []
    for n in range(1, KILLS + 1):
        wait_for_steps(ids, steps * n // (KILLS + 2), cluster)
        kills.append(kill_mid_call(cluster, publishing))
    wait_for_drain(ids, cluster, timeout=150)
    drained = time.monotonic() - began

    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes, dead_as=())
    assert statuses == Counter({TaskStatus.SUCCEEDED: TASKS})
    current = Step.objects.current().filter(task__in=ids)
    assert Counter(current.values_list("status", flat=True)) == Counter(
        {StepStatus.SUCCEEDED: steps}
    )

    # Each branch's write and each join's record applied once, and nothing else.
    applied = Counter(write["key"] for write in publishing.applied)
    branches, joins = written_keys(ids)
    assert (len(branches), len(joins)) == (TASKS * graph_workflow.WIDTH, TASKS)
    wrong = not_once(applied, [*branches, *joins])
    assert not wrong, f"writes not applied exactly once: {dict(list(wrong.items())[:20])}"
    assert not mail.applied
    # Each join got all ten results by name (it checks them itself, and says so).
    results = current.filter(kind="join").values_list("result", flat=True)
    assert all((result or {}).get("joined") == list(graph_workflow.KINDS) for result in results)

    early = joins_before_branches(ids)
    assert not early, f"joins started before their branches finished: {early}"

    # Every step a kill cut short ran again under a higher token; every write cut after the
    # remote applied it was sent again with the same key, and applied once.
    cuts: list[Cut] = [assert_cut_steps_ran_again(kill.tokens, kill.at) for kill in kills]
    received = Counter(request["key"] for request in publishing.received)
    cut_writes = [kill.key for kill in kills if kill.cut_after_applying]
    assert cut_writes, "no kill landed between a write and its record"
    not_again = {
        key: (received[key], applied[key])
        for key in cut_writes
        if received[key] < 2 or applied[key] != 1
    }
    assert not not_again, f"cut writes (sent, applied) not sent again and applied once: {not_again}"

    record_property("drill_s", round(drained, 1))
    record_property("kills", len(kills))
    record_property("writes_cut_after_applying", len(cut_writes))
    record_property("writes_sent_again", sum(1 for count in received.values() if count > 1))
    record_property("steps_cut", sum(cut.steps for cut in cuts))
    # Per kill: from it until the last step it cut had finished again.
    record_property("recovery_s", [cut.recovery for cut in cuts])
    record_property("steps_run_again", current.filter(attempts__gt=1).count())
