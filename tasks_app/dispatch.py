"""Doorbells: messages that tell a worker some step may be due.

A doorbell may be lost or delivered twice; the claim in the database decides. They are
published after commit, so a rolled-back transaction rings nothing, and a broker that is
down makes the publish fail fast and be logged while the enqueue stands: the sweeper
re-dispatches due steps later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

RUN_STEP = "tasks_app.tasks.run_step"
# Doorbells for retries further out than this are left to the sweeper, so no message sits
# unacknowledged in a worker for long (Redis would re-deliver it after its visibility
# timeout).
MAX_COUNTDOWN = 60.0


@dataclass(frozen=True)
class Doorbell:
    step_id: int
    queue: str
    countdown: float = 0.0


def ring_on_commit(doorbells: list[Doorbell]) -> None:
    """Publish after commit, one doorbell per queue for the steps due now.

    A worker woken by a doorbell drains every due step of its queue (and recruits another
    worker while there is more), so ringing once per queue is enough; the first step named
    is run first. Doorbells for later (retries with a countdown) are kept one by one.
    """
    bells: list[Doorbell] = []
    rung: set[str] = set()
    for bell in doorbells:
        if bell.countdown > 0:
            bells.append(bell)
        elif bell.queue not in rung:
            rung.add(bell.queue)
            bells.append(bell)
    if bells:
        transaction.on_commit(lambda: publish(bells), robust=True)


def publish(doorbells: list[Doorbell]) -> None:
    """Send the doorbells over one broker connection, without blocking retries."""
    app = current_app
    with app.producer_or_acquire() as producer:
        # Connect without kombu's retry loop: the transport's ``max_retries`` sleeps two
        # seconds before retrying a refused connection, which would hold up every commit
        # while the broker is down. Failing at once is fine: the sweeper rings again.
        producer.connection.ensure_connection(max_retries=0)
        for bell in doorbells:
            if bell.countdown > MAX_COUNTDOWN:
                continue
            app.send_task(
                RUN_STEP,
                args=[bell.step_id],
                queue=bell.queue,
                countdown=bell.countdown or None,
                producer=producer,
                retry=False,
            )
