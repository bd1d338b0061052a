"""Which workers are alive, and when the sweeper last ran.

Every Celery worker node writes a :class:`Heartbeat` row when it is ready, again every
``TASKS_HEARTBEAT_SECONDS`` from a thread of its main process, and once more when it shuts
down cleanly. A node whose last report is older than ``TASKS_WORKER_SILENT_SECONDS`` is
silent: killed, hung, cut off from the database, or on a machine that went away. A node
that cannot take work from the broker (``tasks_app.engine.consuming``: Redis refuses its reads,
or does not answer them) withholds its reports, so it goes silent too: running but idle
is not live. The sweeper reports after every sweep, which is what readiness asks about.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.db.models.functions import Now

from tasks_app.db.clock import db_now
from tasks_app.engine import consuming
from tasks_app.models import Heartbeat, Step, StepStatus

logger = logging.getLogger(__name__)

SWEEPER = "sweeper"
# Nodes not seen for this long are no longer listed (their rows go with the next sweep).
FORGET_AFTER = timedelta(days=7)
LISTED_FOR = timedelta(days=1)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int | None
    processes: list[int]


def worker_started(node: NodeInfo) -> None:
    Heartbeat.objects.update_or_create(
        name=node.name,
        defaults={
            "role": Heartbeat.Role.WORKER,
            "hostname": node.hostname,
            "pid": node.pid,
            "queues": node.queues,
            "concurrency": node.concurrency,
            "processes": node.processes,
            "started_at": Now(),
            "seen_at": Now(),
            "stopped_at": None,
        },
    )


def name_taken(name: str, hostname: str, pid: int) -> str | None:
    """Whether another live worker node already reports under ``name``; None when the name
    is free. A node's row is its name's: two processes under one name would share one
    heartbeat, so a dead one would look live. A row left by a process of this host that no
    longer runs (killed, then started again under its old name) does not count."""
    silent_after = timedelta(seconds=settings.TASKS_WORKER_SILENT_SECONDS)
    row = (
        Heartbeat.objects.filter(
            name=name,
            role=Heartbeat.Role.WORKER,
            stopped_at=None,
            seen_at__gte=Now() - silent_after,
        )
        .exclude(pid=pid, hostname=hostname)
        .first()
    )
    if row is None or (row.hostname == hostname and not process_running(row.pid)):
        return None
    return (
        f"worker node name {name} is taken: process {row.pid} on {row.hostname} reports under "
        f"it (seen {round((db_now() - row.seen_at).total_seconds())} s ago); give each worker "
        "its own name (--hostname, as the Procfile does: worker-$$@%h)"
    )


def process_running(pid: int | None) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def worker_seen(node: NodeInfo) -> None:
    # The pool replaces processes that die or reach their task limit: keep the list fresh.
    seen = Heartbeat.objects.filter(name=node.name).update(
        seen_at=Now(), processes=node.processes, stopped_at=None
    )
    if not seen:  # the row was removed meanwhile (forgotten after a long silence)
        worker_started(node)


def worker_stopped(name: str) -> None:
    Heartbeat.objects.filter(name=name).update(stopped_at=Now(), seen_at=Now())


def sweeper_ran() -> None:
    """Record a sweep, and forget nodes nobody has seen for a week."""
    Heartbeat.objects.update_or_create(
        name=SWEEPER,
        defaults={"role": Heartbeat.Role.SWEEPER, "seen_at": Now(), "pid": os.getpid()},
        create_defaults={
            "role": Heartbeat.Role.SWEEPER,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
        },
    )
    Heartbeat.objects.filter(role=Heartbeat.Role.WORKER, seen_at__lt=Now() - FORGET_AFTER).delete()


def last_sweep_age() -> timedelta | None:
    """How long ago the sweeper last finished a sweep, by the database's clock."""
    row = Heartbeat.objects.filter(name=SWEEPER).values_list("seen_at", flat=True).first()
    return None if row is None else max(db_now() - row, timedelta(0))


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRow:
    name: str
    hostname: str
    queues: list[str]
    concurrency: int | None
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None
    # Steps running under a live lease held by one of the node's processes.
    running: int
    now: datetime

    @property
    def state(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        silent_after = timedelta(seconds=settings.TASKS_WORKER_SILENT_SECONDS)
        return "silent" if self.now - self.seen_at > silent_after else "live"

    @property
    def seen_ago(self) -> timedelta:
        return max(self.now - self.seen_at, timedelta(0))


def workers() -> list[WorkerRow]:
    """Worker nodes seen in the last day: live ones first, then silent, then stopped."""
    now = db_now()
    rows = list(Heartbeat.objects.filter(role=Heartbeat.Role.WORKER, seen_at__gte=now - LISTED_FOR))
    # A running step holds its live lease, which names the process.
    holders = collections.Counter(
        Step.objects.filter(status=StepStatus.RUNNING).values_list("lease_worker", flat=True)
    )
    listed = [
        WorkerRow(
            name=row.name,
            hostname=row.hostname,
            queues=list(row.queues),
            concurrency=row.concurrency,
            started_at=row.started_at,
            seen_at=row.seen_at,
            stopped_at=row.stopped_at,
            running=sum(holders[f"{row.hostname}:{pid}"] for pid in row.processes),
            now=now,
        )
        for row in rows
    ]
    order = {"live": 0, "silent": 1, "stopped": 2}
    return sorted(listed, key=lambda row: (order[row.state], row.name))


def by_state(rows: Iterable[WorkerRow]) -> collections.Counter[str]:
    """How many of ``rows`` are live, silent and stopped."""
    return collections.Counter(row.state for row in rows)


# --- the worker's side ------------------------------------------------------------------------


class HeartbeatThread(threading.Thread):
    """Reports a node every ``interval`` seconds until stopped, unless it cannot consume
    (then the report is withheld until it can); a failed report (the database is away) is
    logged and tried again at the next beat. Each kind of trouble logs one line when it
    starts and one when it ends."""

    def __init__(self, node_name: str, describe: Callable[[], NodeInfo], interval: float) -> None:
        super().__init__(name="tasks-heartbeat", daemon=True)
        self.node_name = node_name
        self.describe = describe
        self.interval = interval
        self.stopping = threading.Event()
        # Set once a warm shutdown begins: the node stops asking for work on purpose while
        # it finishes the steps it holds, which is no sign of a broker it cannot read.
        self.shutting_down = threading.Event()
        self.failing = False
        self.withheld = False

    def leaving(self) -> None:
        """The node is shutting down: it reports itself while it finishes its steps, and
        no longer asks whether it can consume."""
        self.shutting_down.set()

    def stop(self) -> None:
        """Stop beating; waits for a report in flight, so none lands after the stop."""
        self.stopping.set()
        self.join(timeout=5)

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.beat()
        close_old_connections()

    def beat(self) -> bool:
        """Report the node once, if it can consume; returns whether it was reported."""
        reason = None if self.shutting_down.is_set() else consuming.cannot_consume()
        if reason is not None:
            if not self.withheld:
                logger.warning("heartbeat: not reporting this worker as live: %s", reason)
            self.withheld = True
            return False
        if self.withheld:
            logger.info("heartbeat: this worker consumes again; reporting it as live")
        self.withheld = False
        try:
            close_old_connections()
            worker_seen(self.describe())
        except DatabaseError as exc:
            if not self.failing:
                logger.warning("heartbeat: cannot report this worker: %s", exc)
            self.failing = True
            return False
        if self.failing:
            logger.info("heartbeat: reporting again")
        self.failing = False
        return True


def describe_consumer(consumer: Any) -> NodeInfo:
    """A Celery worker node as the heartbeat reports it (``consumer`` is the sender of
    ``worker_ready``)."""
    info: dict[str, Any] = consumer.pool.info if consumer.pool is not None else {}
    processes: Iterable[int] = info.get("processes") or [os.getpid()]
    return NodeInfo(
        name=consumer.hostname,
        # As the runner names a lease's worker (runner.worker_id).
        hostname=socket.gethostname(),
        pid=os.getpid(),
        queues=sorted(consumer.app.amqp.queues.consume_from or consumer.app.amqp.queues),
        concurrency=consumer.controller.concurrency if consumer.controller else None,
        processes=sorted(int(pid) for pid in processes),
    )
