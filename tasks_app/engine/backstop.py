"""The doorbell's backstop: each worker node rings for due work that no doorbell brought.

A doorbell is lost when Redis refused or dropped it (out of memory, read-only after a
failover, restarted) or its producer died before publishing. The sweeper rings again for
such a step, but only ``TASKS_REDISPATCH_SECONDS`` after its last ring, and only from the
maintenance worker. So every ``TASKS_BACKSTOP_SECONDS`` each worker node that has a pool
process free asks the database whether one of its queues has a step due for longer than
that: had a doorbell reached a free process, the step would have been claimed within
milliseconds. If so the node rings one doorbell for that queue, naming the step, and the
worker that takes it drains the queue (``runner.drain``). Once Redis accepts writes again,
due work is claimed within about ``TASKS_BACKSTOP_SECONDS``.

It is cheap and bounded: one indexed query per queue per interval per node, only while
the node has room (a busy system runs none), and at most one doorbell per queue per
interval per node. It rings through the broker rather than running the step itself, so a
node's main process never runs a handler, and the claim still decides. Started when the
worker is ready (its signal receivers are connected by ``TasksAppConfig.ready``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models.functions import Now

from tasks_app.engine import consuming
from tasks_app.engine.dispatch import Doorbell, publish
from tasks_app.engine.transitions import paused_filter
from tasks_app.models import Step

logger = logging.getLogger(__name__)


def overdue(queues: Sequence[str], seconds: float) -> list[Doorbell]:
    """A doorbell for each of ``queues`` (not paused) that has a step due for longer than
    ``seconds`` by the database's clock, naming the one it would claim first."""
    bells = []
    for queue in queues:
        step_id = (
            Step.objects.due(Now() - timedelta(seconds=seconds))
            .filter(queue=queue)
            .exclude(paused_filter())
            .order_by("-priority", "available_at")  # step_due_idx
            .values_list("pk", flat=True)
            .first()
        )
        if step_id is not None:
            bells.append(Doorbell(step_id, queue))
    return bells


class Backstop(threading.Thread):
    """Every ``interval`` seconds, while the node has room: ring for its overdue queues.
    Each kind of trouble (the database or the broker failing) logs one line when it
    starts and one when it ends, as does a streak of rings."""

    def __init__(self, queues: Sequence[str], interval: float) -> None:
        super().__init__(name="doorbell-backstop", daemon=True)
        self.queues = list(queues)
        self.interval = interval
        self.stopping = threading.Event()
        self.trouble: str | None = None
        self.ringing = False

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.check()
        connection.close()

    def check(self) -> list[Doorbell]:
        """Ring for the node's overdue queues if it has room; returns what it rang."""
        if not consuming.has_room():
            connection.close()  # busy for a while, maybe: hold no idle connection
            return []
        try:
            close_old_connections()
            bells = overdue(self.queues, self.interval)
            if bells:
                publish(bells)
        except Exception as exc:
            if self.trouble is None:
                logger.warning("backstop: cannot ring for due work: %s", exc)
            self.trouble = type(exc).__name__
            connection.close_if_unusable_or_obsolete()
            return []
        if self.trouble is not None:
            logger.info("backstop: can ring again")
        self.trouble = None
        if bells and not self.ringing:
            logger.info(
                "backstop: due work in %s waited over %g s with no doorbell; ringing, "
                "every %g s while that lasts",
                ", ".join(sorted({bell.queue for bell in bells})),
                self.interval,
                self.interval,
            )
        self.ringing = bool(bells)
        return bells


_backstop: Backstop | None = None


@worker_ready.connect
def _start(sender: Any, **kwargs: Any) -> None:
    """Once a worker node is ready: note its pool's size, and start its backstop if it
    consumes a queue of steps (the maintenance worker does not)."""
    global _backstop
    consumer = sender
    consuming.serving(consumer.controller.concurrency if consumer.controller else None)
    consumed = consumer.app.amqp.queues.consume_from or consumer.app.amqp.queues
    queues = [queue for queue in settings.TASKS_QUEUES if queue in consumed]
    if settings.TASKS_BACKSTOP_SECONDS and queues:
        _backstop = Backstop(queues, settings.TASKS_BACKSTOP_SECONDS)
        _backstop.start()


@worker_shutdown.connect
def _stop(sender: Any = None, **kwargs: Any) -> None:
    if _backstop is not None:
        _backstop.stop()
