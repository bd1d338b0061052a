"""Workflows as graphs: steps whose dependencies are met run in parallel, each with its own
lease, attempts, step key and ledger entries; a join receives its branches' results by name;
a dead branch is redriven alone; a cancel stops every branch.

Everything runs for real (the enqueue's SQL or its ORM twin, the claims, the runner, the
ledger and PostgreSQL); the remote is an in-process fake that counts its writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Effect, EventKind, Step, StepStatus, TaskStatus
from tasks_app.observability.invariants import check
from tasks_app.operations.why import why_step
from tasks_app.workflows import StepSpec, Workflow
from tests.conftest import backdate, event_kinds
from tests.graph_support import Remote, diamond, enqueue, registered, run, statuses, step_of


@pytest.fixture(params=[True, False], ids=["sql", "orm"])
def paths(request: pytest.FixtureRequest, settings: Any) -> bool:
    """Each test runs on the hot path's SQL and on the ORM code it restates."""
    settings.TASKS_SQL_FAST_PATH = request.param
    return bool(request.param)


@pytest.fixture
def remote(db: None, paths: bool) -> Iterator[Remote]:
    made = Remote()
    with registered(diamond("test.graph.diamond", made)):
        yield made


def _flow() -> Workflow:
    from tasks_app.workflows import registry

    return registry.latest("test.graph.diamond")


def _clean() -> None:
    report = check(since=None)
    assert report.findings == [], [str(finding) for finding in report.findings]


# --- declaring a graph -------------------------------------------------------------------------


def _noop(ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            (StepSpec("a", _noop, after=("b",)), StepSpec("b", _noop)),
            "step a waits for b, which must be declared before it",
        ),
        (
            (StepSpec("a", _noop), StepSpec("b", _noop, after=("a", "a"))),
            "step b names a step twice",
        ),
        ((StepSpec("a", _noop, after=("a",)),), "step a waits for a"),
    ],
    ids=["later", "twice", "itself"],
)
def test_a_graph_that_cannot_run_is_refused_when_declared(
    steps: tuple[StepSpec, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Workflow("test.graph.bad", 1, steps=steps)


def test_after_takes_kinds_not_one_string() -> None:
    with pytest.raises(ValueError, match="after takes a tuple of step kinds"):
        StepSpec("b", _noop, after="a")  # type: ignore[arg-type]


def test_a_workflow_without_after_is_a_line_and_stores_nothing_of_it(db: None) -> None:
    line = Workflow("test.graph.line", 1, steps=(StepSpec("a", _noop), StepSpec("b", _noop)))
    assert line.is_line
    assert [line.stored_after(p) for p in range(2)] == [None, None]
    spelled = Workflow(
        "test.graph.spelled", 1, steps=(StepSpec("a", _noop), StepSpec("b", _noop, after=("a",)))
    )
    assert spelled.is_line
    assert not diamond("test.graph.d", Remote()).is_line


# --- running a graph ---------------------------------------------------------------------------


def test_the_enqueue_makes_each_root_due_and_stores_the_graph(remote: Remote) -> None:
    task = enqueue(_flow())
    rows = {s.kind: s for s in Step.objects.filter(task=task)}
    assert {kind: s.status for kind, s in rows.items()} == {
        "start": StepStatus.PENDING,
        "a": StepStatus.BLOCKED,
        "b": StepStatus.BLOCKED,
        "c": StepStatus.BLOCKED,
        "join": StepStatus.BLOCKED,
        "finish": StepStatus.BLOCKED,
    }
    assert rows["start"].after == []
    assert rows["a"].after == [0]
    assert rows["join"].after == [1, 2, 3]
    assert rows["finish"].after == [4]


def test_branches_run_in_parallel_and_the_join_waits_for_all_of_them(remote: Remote) -> None:
    task = enqueue(_flow())
    run(task, "start")
    assert statuses(task) | {} == {
        "start": "succeeded",
        "a": "pending",
        "b": "pending",
        "c": "pending",
        "join": "blocked",
        "finish": "blocked",
    }
    # Each branch is claimed under its own lease: two run at once.
    first = services.claim_step(step_of(task, "a").pk, worker_id="w1")
    second = services.claim_step(step_of(task, "b").pk, worker_id="w2")
    assert first is not None and second is not None
    assert {first.token, second.token} == {1}
    assert step_of(task, "a").lease_worker == "w1"
    assert step_of(task, "b").lease_worker == "w2"
    services.complete_step(second, {"branch": "b"})
    services.complete_step(first, {"branch": "a"})
    assert statuses(task)["join"] == "blocked"
    run(task, "c")
    assert statuses(task)["join"] == "pending"
    run(task, "join")
    run(task, "finish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    # The join received its branches' results by name; a branch saw only what it waits for.
    assert set(remote.seen["join"]) == {"start", "a", "b", "c"}
    assert remote.seen["join"]["c"]["branch"] == "c"
    assert set(remote.seen["c"]) == {"start"}
    assert set(remote.seen["finish"]) == {"start", "a", "b", "c", "join"}
    _clean()


def test_each_branch_has_its_own_step_key_and_ledger_entry(remote: Remote) -> None:
    task = enqueue(_flow(), key="graph-keys")
    for kind in ("start", "a", "b", "c"):
        run(task, kind)
    keys = dict(Step.objects.filter(task=task).values_list("kind", "idempotency_key"))
    assert keys["a"] == "graph-keys:1:a" and keys["c"] == "graph-keys:3:c"
    effects = dict(Effect.objects.filter(step__task=task).values_list("key", "step__kind"))
    assert effects == {
        "graph-keys:0:start:write_start": "start",
        "graph-keys:1:a:write_a": "a",
        "graph-keys:2:b:write_b": "b",
        "graph-keys:3:c:write_c": "c",
    }


def test_a_worker_drain_runs_the_whole_graph_once(remote: Remote) -> None:
    task = enqueue(_flow())
    start = step_of(task, "start")
    backdate(start)
    ran = runner.drain(start.pk)
    for _ in range(10):
        due = Step.objects.filter(task=task, status=StepStatus.PENDING).first()
        if due is None:
            break
        backdate(due)
        ran += runner.drain(due.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert ran == 6
    assert sorted(remote.writes) == ["a", "b", "c", "finish", "join", "start"]
    _clean()


# --- a dead branch, a redrive, a cancel -------------------------------------------------------


def test_partial_redrive_reruns_the_dead_branch_and_repeats_no_other_effect(
    remote: Remote,
) -> None:
    remote.failing.add("c")
    task = enqueue(_flow())
    run(task, "start")
    run(task, "a")
    run(task, "c")
    task.refresh_from_db()
    # The dead branch makes the task dead at once, for on-call; b still runs.
    assert task.status == TaskStatus.DEAD
    assert statuses(task)["c"] == "dead"
    run(task, "b")
    task.refresh_from_db()
    assert task.status == TaskStatus.DEAD
    assert Step.objects.filter(task=task, status=StepStatus.DEAD).count() == 1
    # One dead_lettered event, naming the dead branch: b's success did not write another.
    assert event_kinds(task, EventKind.DEAD_LETTERED) == [EventKind.DEAD_LETTERED]

    remote.failing.clear()
    services.redrive(task, actor="cli:oncall", reason="remote fixed")
    assert statuses(task)["c"] == "pending"
    assert statuses(task)["a"] == statuses(task)["b"] == "succeeded"
    run(task, "c")
    run(task, "join")
    run(task, "finish")
    task.refresh_from_db()
    assert task.status == TaskStatus.SUCCEEDED
    assert (remote.writes_of("a"), remote.writes_of("b"), remote.writes_of("c")) == (1, 1, 1)
    assert remote.writes_of("join") == 1
    _clean()


def test_a_cancel_stops_every_branch(remote: Remote) -> None:
    task = enqueue(_flow())
    run(task, "start")
    held = [
        services.claim_step(step_of(task, kind).pk, worker_id=f"w-{kind}") for kind in ("a", "b")
    ]
    services.cancel(task, actor="cli:oncall", reason="not needed")
    task.refresh_from_db()
    assert task.cancel_requested_at is not None
    assert statuses(task) | {} == {
        "start": "succeeded",
        "a": "running",
        "b": "running",
        "c": "cancelled",
        "join": "cancelled",
        "finish": "cancelled",
    }
    for claim in held:
        assert claim is not None
        services.complete_step(claim, {"late": True})
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    assert statuses(task)["join"] == "cancelled"
    _clean()


# --- what the checker and "why" say of a graph ------------------------------------------------


@pytest.mark.no_fold_check
def test_the_checker_finds_a_join_that_ran_before_one_of_its_branches(remote: Remote) -> None:
    task = enqueue(_flow())
    run(task, "start")
    run(task, "a")
    run(task, "b")
    _clean()
    # Written behind the services' back: the join marked done while branch c is still due.
    Step.objects.filter(pk=step_of(task, "join").pk).update(status=StepStatus.SUCCEEDED)
    findings = [f for f in check(since=None).findings if f.check == "order"]
    assert len(findings) == 1, findings
    assert f"step {step_of(task, 'join').pk} is succeeded" in findings[0].detail
    assert "position 3 has not succeeded" in findings[0].detail


def test_why_names_the_branch_a_join_waits_for(remote: Remote) -> None:
    task = enqueue(_flow())
    run(task, "start")
    run(task, "a")
    run(task, "c")
    join = step_of(task, "join")
    [blocker] = why_step(join)
    assert blocker.subject == "step 2 (b)"
    assert blocker.words.endswith("waits for step 2 (b), which is pending.")
