"""The graph drill: 200 tasks of two workflows (``tests/chaos/graph_workflow.py``), 100
of each, enqueued mixed and drained by real workers while whole workers are SIGKILLed and
replaced, six times over the run. Both are ``start``, 10 runs in parallel, each writing once
to the publishing remote, then ``join``: ``chaos.fan_out`` declares its 10 branches,
``chaos.fan_out_items`` fans out at run time, one row per item of the list ``start`` gives.

Each kill waits for a branch's or an item's write the remote has applied and the ledger
has not yet recorded (the workflows take turns), and kills the worker whose pool process
waits for its answer: the step's next attempt must call again with the same key, and the
remote apply it once.

- every task succeeded, no step is dead, the checker finds nothing
  (``check(since=None)``, its ``order`` check included) and no write was applied twice
  (:func:`assert_nothing_lost_or_done_twice`);
- each fan-out made its 10 items once (one ``fanned_out`` record, rows 0 to 9);
- the remote applied each branch's and each item's write and each join's record exactly
  once: per workflow 1,000 keys and 100, named from the tasks' keys, and nothing else;
- each join started after every row it waits for had finished (all of a fan-out's
  items), and got their results (the items' as one list in item order);
- every step a kill cut short ran again under a higher token, and every write cut after the
  remote applied it was sent again with its key, in both workflows.

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
from typing import Any

import pytest

from tasks_app import services
from tasks_app.db.clock import db_now
from tasks_app.models import (
    Effect,
    Event,
    EventKind,
    Step,
    StepStatus,
    Task,
    TaskStatus,
    step_key,
)
from tasks_app.models.work import item_key
from tasks_app.workflows import Workflow, registry
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

# Half of each workflow.
TASKS = 200
# Step workers and pool processes each: nine processes for 2,400 steps on two CPUs; their
# handlers mostly wait for the remote's answer.
WORKERS = 3
CONCURRENCY = 3
# Spread over the run: the n-th kill once n eighths of the steps have succeeded, so the
# last leaves a quarter of the work to run on the replacements. Even, so each workflow gets
# as many.
KILLS = 6


@dataclass(frozen=True)
class Kill:
    # The token of each step the worker's pool held when it was killed (step -> token).
    tokens: dict[int, int]
    # When, by the database's clock.
    at: datetime
    # The workflow whose write it waited for.
    workflow: str
    # The write the remote had applied and the ledger not recorded, and whether the
    # kill landed before the record (its ledger row still ``started`` after the kill).
    key: str
    cut_after_applying: bool


@pytest.fixture
def drill_workflow() -> Iterator[None]:
    """Both workflows registered in this process for the drill, and only for it."""
    from tests.chaos import graph_workflow

    for flow in graph_workflow.FLOWS:
        registry.register(flow)
    yield
    for flow in graph_workflow.FLOWS:
        registry.unregister(flow.name, flow.version)


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


def enqueue(count: int) -> dict[str, list[int]]:
    """``count`` tasks, the workflows taking turns so both are claimed side by side all
    through the run; their ids by workflow."""
    from tests.chaos import graph_workflow

    names = [flow.name for flow in graph_workflow.FLOWS]
    items = [
        {"workflow": names[n % len(names)], "payload": {}, "idempotency_key": f"graph-{n}"}
        for n in range(count)
    ]
    ids: dict[str, list[int]] = {name: [] for name in names}
    for result in services.enqueue_many(items, actor="test:chaos"):
        ids[result.task.workflow].append(result.task.pk)
    return ids


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


def applied_not_recorded(
    cluster: Cluster, remote: LoopbackRemote, workflow: str
) -> tuple[Worker, str] | None:
    """A branch's or an item's write of ``workflow`` the remote applied whose answer the
    ledger has not recorded yet, and the live worker whose pool process holds its step."""
    from tests.chaos import graph_workflow

    applied = {write["key"] for write in remote.applied}
    # The latest started first: the most of its answer's way back is still ahead.
    waiting = (
        Effect.objects.filter(
            status=Effect.Status.STARTED,
            step__status=StepStatus.RUNNING,
            step__task__workflow=workflow,
            step__kind__in=graph_workflow.BRANCH_KINDS[workflow],
        )
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


def kill_mid_call(cluster: Cluster, remote: LoopbackRemote, workflow: str) -> Kill:
    """SIGKILL the worker holding a write of ``workflow`` the remote applied and the ledger
    has not recorded, and start another in its place."""
    victim, key = wait_for(
        lambda: applied_not_recorded(cluster, remote, workflow),
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
    return Kill(tokens, at, workflow, key, cut)


def expected_writes(ids: Sequence[int], flow: Workflow) -> tuple[list[str], list[str]]:
    """The ledger keys the tasks of ``flow`` must each have written once: every branch's or
    item's write and the join's record (a step's key and the effect's name, ``Effects.key``).
    Named from the tasks' keys and the workflow's declaration, not read from the rows, so a
    missing item shows."""
    from tests.chaos import graph_workflow

    kinds = graph_workflow.BRANCH_KINDS[flow.name]
    position = {spec.kind: n for n, spec in enumerate(flow.steps)}
    rows = [
        (spec.kind, item)
        for spec in flow.steps
        if spec.kind in kinds
        for item in (range(len(graph_workflow.ITEMS)) if spec.fan_out else [0])
    ]
    branches: list[str] = []
    joins: list[str] = []
    for key in Task.objects.filter(pk__in=ids).values_list("idempotency_key", flat=True):
        assert key is not None
        branches += [
            f"{item_key(step_key(key, position[kind], kind), item)}:write" for kind, item in rows
        ]
        joins.append(f"{step_key(key, position['join'], 'join')}:record")
    return branches, joins


def joins_before_branches(
    ids: Sequence[int], kinds: Sequence[str]
) -> dict[int, tuple[datetime, datetime]]:
    """Tasks whose join started before the last of the rows it waits for (of ``kinds``: a
    fan-out's every item) finished: when each did."""
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
        elif kind in kinds:
            assert finished is not None, f"task {task}'s {kind} never finished"
            last_branch[task] = max(finished, last_branch.get(task, finished))
    assert set(joined) == set(last_branch) == set(ids)
    return {
        task: (started, last_branch[task])
        for task, started in joined.items()
        if started < last_branch[task]
    }


def fanned_out_wrongly(ids: Sequence[int]) -> dict[int, tuple[list[Any], list[int]]]:
    """Fan-out tasks that did not record fanning out once, into all the items (the
    ``succeeded`` event of ``start``, its ``fanned_out``), or whose rows at the fan-out's
    position are not items 0 to 9, each once: what each recorded, and its rows' items."""
    from tests.chaos import graph_workflow

    kind = graph_workflow.ITEM_KIND
    recorded: dict[int, list[Any]] = {task: [] for task in ids}
    events = Event.objects.filter(task_id__in=ids, data__has_key="fanned_out")
    for task, event, fanned in events.values_list("task_id", "kind", "data__fanned_out"):
        assert task is not None
        recorded[task].append((event, fanned))
    items: dict[int, list[int]] = {task: [] for task in ids}
    rows = Step.objects.current().filter(task__in=ids, kind=kind).order_by("item")
    for task, item in rows.values_list("task", "item"):
        items[task].append(item)
    once = [(EventKind.SUCCEEDED, {kind: graph_workflow.WIDTH})]
    every = list(range(graph_workflow.WIDTH))
    return {
        task: (recorded[task], items[task])
        for task in ids
        if recorded[task] != once or items[task] != every
    }


def not_once(applied: Counter[str], expected: Sequence[str]) -> dict[str, int]:
    """The expected keys not applied exactly once, and the keys applied unexpected."""
    known = set(expected)
    wrong = {key: applied[key] for key in expected if applied[key] != 1}
    wrong.update({key: count for key, count in applied.items() if key not in known})
    return wrong


def test_200_fan_outs_of_10_declared_or_at_run_time_survive_workers_killed_mid_write(
    drill_workflow: None,
    cluster: Cluster,
    counting_remotes: Remotes,
    record_property: Record,
) -> None:
    from tests.chaos import graph_workflow

    publishing, mail = counting_remotes
    flows = graph_workflow.FLOWS
    # Both shapes make 12 rows a task: start, 10 branches or items, join.
    steps = TASKS * (graph_workflow.WIDTH + 2)
    cluster.start(workers=0)
    for worker in [add_worker(cluster) for _ in range(WORKERS)]:
        worker.wait_ready(timeout=90)

    began = time.monotonic()
    by_flow = enqueue(TASKS)
    ids = [pk for flow in flows for pk in by_flow[flow.name]]
    assert [len(by_flow[flow.name]) for flow in flows] == [TASKS // len(flows)] * len(flows)
    kills: list[Kill] = []
    for n in range(1, KILLS + 1):
        wait_for_steps(ids, steps * n // (KILLS + 2), cluster)
        kills.append(kill_mid_call(cluster, publishing, flows[n % len(flows)].name))
    wait_for_drain(ids, cluster, timeout=150)
    drained = time.monotonic() - began

    statuses = assert_nothing_lost_or_done_twice(ids, counting_remotes, dead_as=())
    assert statuses == Counter({TaskStatus.SUCCEEDED: TASKS})
    current = Step.objects.current().filter(task__in=ids)
    assert Counter(current.values_list("status", flat=True)) == Counter(
        {StepStatus.SUCCEEDED: steps}
    )

    wrong_items = fanned_out_wrongly(by_flow[graph_workflow.ITEMS_NAME])
    assert not wrong_items, f"fan-outs (recorded, items) not made once: {wrong_items}"

    # Each branch's and item's write and each join's record applied once, and nothing else.
    applied = Counter(write["key"] for write in publishing.applied)
    expected: list[str] = []
    for flow in flows:
        branches, joins = expected_writes(by_flow[flow.name], flow)
        assert (len(branches), len(joins)) == (
            len(by_flow[flow.name]) * graph_workflow.WIDTH,
            len(by_flow[flow.name]),
        ), flow.name
        expected += [*branches, *joins]
    wrong = not_once(applied, expected)
    assert not wrong, f"writes not applied exactly once: {dict(list(wrong.items())[:20])}"
    assert not mail.applied
    # Each join got all ten results, by name or as one list in item order (it checks them
    # itself, and says so).
    joined = {
        graph_workflow.NAME: list(graph_workflow.KINDS),
        graph_workflow.ITEMS_NAME: list(graph_workflow.ITEMS),
    }
    for flow in flows:
        results = current.filter(task__in=by_flow[flow.name], kind="join")
        assert all(
            (result or {}).get("joined") == joined[flow.name]
            for result in results.values_list("result", flat=True)
        ), flow.name

        early = joins_before_branches(by_flow[flow.name], graph_workflow.BRANCH_KINDS[flow.name])
        assert not early, f"{flow.name}: joins started before their branches finished: {early}"

    # Every step a kill cut short ran again under a higher token; every write cut after the
    # remote applied it was sent again with the same key, and applied once.
    cuts: list[Cut] = [assert_cut_steps_ran_again(kill.tokens, kill.at) for kill in kills]
    received = Counter(request["key"] for request in publishing.received)
    cut_writes = {
        flow.name: [
            kill.key for kill in kills if kill.cut_after_applying and kill.workflow == flow.name
        ]
        for flow in flows
    }
    missed = [name for name, keys in cut_writes.items() if not keys]
    assert not missed, f"no kill landed between a write and its record in {missed}"
    not_again = {
        key: (received[key], applied[key])
        for keys in cut_writes.values()
        for key in keys
        if received[key] < 2 or applied[key] != 1
    }
    assert not not_again, f"cut writes (sent, applied) not sent again and applied once: {not_again}"

    record_property("drill_s", round(drained, 1))
    record_property("kills", len(kills))
    record_property(
        "writes_cut_after_applying", {name: len(keys) for name, keys in cut_writes.items()}
    )
    record_property("writes_sent_again", sum(1 for count in received.values() if count > 1))
    record_property("steps_cut", sum(cut.steps for cut in cuts))
    # Per kill: from it until the last step it cut had finished again.
    record_property("recovery_s", [cut.recovery for cut in cuts])
    record_property("steps_run_again", current.filter(attempts__gt=1).count())
