"""Worker presence: nodes report themselves, the console lists what each runs and when it
was last seen, and a node that stops reporting shows as silent."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import F
from django.test import Client

from tasks_app import services
from tasks_app.engine import presence
from tasks_app.models import Heartbeat, Task, TaskStatus
from tests.conftest import only_step
from tests.e2e_support import wait_for, worker_on_test_database
from tests.remotes import LoopbackRemote


def node(name: str = "celery@box-1", *, processes: list[int] | None = None) -> presence.NodeInfo:
    return presence.NodeInfo(
        name=name,
        hostname="box-1",
        pid=100,
        queues=["default"],
        concurrency=2,
        processes=[101, 102] if processes is None else processes,
    )


def age(name: str, seconds: float) -> None:
    """As if the node's last report were ``seconds`` older."""
    Heartbeat.objects.filter(name=name).update(seen_at=F("seen_at") - timedelta(seconds=seconds))


def listed() -> dict[str, presence.WorkerRow]:
    return {row.name: row for row in presence.workers()}


def test_a_node_that_reported_is_live_with_its_queues_and_processes(db: None) -> None:
    presence.worker_started(node())

    row = listed()["celery@box-1"]
    assert (row.state, row.queues, row.concurrency, row.running) == ("live", ["default"], 2, 0)


def test_a_node_not_seen_for_longer_than_the_silence_setting_is_silent(
    db: None, settings: Any
) -> None:
    settings.TASKS_WORKER_SILENT_SECONDS = 30
    presence.worker_started(node())
    presence.worker_started(node("celery@box-2"))
    age("celery@box-1", 29)
    age("celery@box-2", 31)

    states = {name: row.state for name, row in listed().items()}
    assert states == {"celery@box-1": "live", "celery@box-2": "silent"}
    # Live first, then silent: what needs a look is in one place.
    assert [row.name for row in presence.workers()] == ["celery@box-1", "celery@box-2"]


def test_a_report_brings_a_silent_node_back_and_a_clean_shutdown_says_stopped(
    db: None,
) -> None:
    presence.worker_started(node())
    age("celery@box-1", 3600)
    assert listed()["celery@box-1"].state == "silent"

    presence.worker_seen(node(processes=[103]))
    assert listed()["celery@box-1"].state == "live"
    assert Heartbeat.objects.get(name="celery@box-1").processes == [103]

    presence.worker_stopped("celery@box-1")
    assert listed()["celery@box-1"].state == "stopped"


def test_the_running_column_counts_live_leases_held_by_the_nodes_processes(db: None) -> None:
    presence.worker_started(node())
    presence.worker_started(node("celery@box-2", processes=[201]))
    steps = [
        only_step(services.enqueue("demo.noop", {}, idempotency_key=f"p-{i}").task)
        for i in range(3)
    ]
    services.claim_step(steps[0].pk, worker_id="box-1:101")
    services.claim_step(steps[1].pk, worker_id="box-1:102")
    claim = services.claim_step(steps[2].pk, worker_id="box-1:102")
    assert claim is not None
    services.complete_step(claim, {})  # released: no longer running

    rows = listed()
    assert (rows["celery@box-1"].running, rows["celery@box-2"].running) == (2, 0)


def test_nodes_unseen_for_a_day_are_not_listed_and_after_a_week_forgotten(db: None) -> None:
    presence.worker_started(node("celery@old"))
    presence.worker_started(node("celery@ancient"))
    age("celery@old", 2 * 24 * 3600)
    age("celery@ancient", 8 * 24 * 3600)

    assert listed() == {}
    presence.sweeper_ran()
    assert set(Heartbeat.objects.values_list("name", flat=True)) == {"celery@old", "sweeper"}


def test_a_sweep_records_when_the_sweeper_ran(db: None) -> None:
    assert presence.last_sweep_age() is None
    services.sweep()
    first = presence.last_sweep_age()
    assert first is not None and first < timedelta(seconds=5)

    Heartbeat.objects.filter(name="sweeper").update(seen_at=F("seen_at") - timedelta(hours=1))
    late = presence.last_sweep_age()
    assert late is not None and late >= timedelta(hours=1)


@pytest.mark.parametrize("path", ["/", "/queues/"])
def test_the_overview_and_queues_pages_list_live_and_silent_workers(
    client: Client, oncall: User, path: str
) -> None:
    presence.worker_started(node())
    presence.worker_started(node("celery@gone"))
    age("celery@gone", 3600)
    client.force_login(oncall)

    page = client.get(path).content.decode()

    assert 'data-worker="celery@box-1" data-state="live"' in page
    assert 'data-worker="celery@gone" data-state="silent"' in page
    if path == "/":
        assert "1 live</a>, <strong>1 silent</strong>" in page


def test_the_pages_say_when_no_worker_has_reported(client: Client, oncall: User) -> None:
    client.force_login(oncall)
    assert "No worker has reported in the last day" in client.get("/queues/").content.decode()


# --- a real worker ----------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_reports_what_it_runs_keeps_reporting_and_goes_silent_when_killed(
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> None:
    with worker_on_test_database(
        tmp_path_factory.mktemp("presence"),
        module_remotes,
        what="the presence test",
        TASKS_HEARTBEAT_SECONDS="1",
        TASKS_WORKER_SILENT_SECONDS="3",
    ) as worker:
        (row,) = wait_for(
            lambda: presence.workers() or None, timeout=30, what="the worker to report"
        )
        assert row.state == "live" and row.concurrency == 2
        assert set(row.queues) == {"default", "maintenance"}
        children = Heartbeat.objects.get(name=row.name).processes
        assert len(children) == 2 and all(worker.is_pool_child(pid) for pid in children)

        # What it runs: a step that sleeps holds a lease of one of its processes.
        task = services.enqueue("demo.flaky", {"sleep": 3}, idempotency_key="presence-1").task
        wait_for(
            lambda: presence.workers()[0].running == 1,
            timeout=30,
            what="the running step to be listed",
        )
        # It keeps reporting: its last report moves past its start.
        wait_for(
            lambda: presence.workers()[0].seen_at > row.seen_at + timedelta(seconds=1),
            timeout=30,
            what="a second heartbeat",
        )
        wait_for(
            lambda: Task.objects.get(pk=task.pk).status == TaskStatus.SUCCEEDED,
            timeout=30,
            what="the step to finish",
        )

        os.killpg(worker.pid, signal.SIGKILL)  # no shutdown: it just stops reporting
        worker.process.wait()
        age(row.name, 60)
        (gone,) = presence.workers()
        assert gone.state == "silent"


@pytest.mark.e2e
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_shut_down_cleanly_shows_as_stopped(
    tmp_path_factory: pytest.TempPathFactory,
    module_remotes: tuple[LoopbackRemote, LoopbackRemote],
) -> None:
    with worker_on_test_database(
        tmp_path_factory.mktemp("presence-stop"), module_remotes, what="the presence test"
    ) as worker:
        wait_for(lambda: presence.workers() or None, timeout=30, what="the worker to report")
        worker.stop()
    (row,) = presence.workers()
    assert row.state == "stopped"
