"""Doorbells: messages that tell a worker some step may be due.

A doorbell may be lost or delivered twice; the claim in the database decides. They are
published after commit, so a rolled-back transaction rings nothing; bursts go out from a
background thread, so a producer waits on the broker at most ``TASKS_PUBLISH_WAIT_MS``
(a hung broker holds up only that thread); a broker that is down makes the publish fail
fast and be logged while the enqueue stands: the sweeper re-dispatches due steps later.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

RUN_STEP = "tasks_app.tasks.run_step"
# Doorbells for retries further out than this are left to the sweeper, so no message sits
# unacknowledged in a worker for long (Redis would re-deliver it after its visibility
# timeout).
MAX_COUNTDOWN = 60.0
# Doorbells submitted closer together than this are a burst: published from the background
# thread and coalesced, instead of one by one in the committing thread.
BURST_SECONDS = 0.002


@dataclass(frozen=True)
class Doorbell:
    step_id: int
    queue: str
    countdown: float = 0.0


def ring_on_commit(doorbells: list[Doorbell]) -> None:
    """Ring after commit, once per queue for the steps due now (see :class:`Publisher`)."""
    bells = coalesce(doorbells)
    if bells:
        transaction.on_commit(lambda: publisher.submit(bells), robust=True)


def coalesce(doorbells: list[Doorbell]) -> list[Doorbell]:
    """Keep the first doorbell of each queue among those due now, and every later one."""
    kept: list[Doorbell] = []
    rung: set[str] = set()
    for bell in doorbells:
        if bell.countdown > 0:
            kept.append(bell)
        elif bell.queue not in rung:
            rung.add(bell.queue)
            kept.append(bell)
    return kept


class Publisher:
    """Publishes doorbells from a background thread: a producer hands them over after its
    commit and returns without waiting on the broker's round trip (DESIGN rule 1: the
    database decides; a lost doorbell is rung again by the sweeper). With
    ``TASKS_PUBLISH_WAIT_MS`` above 0, a doorbell submitted on its own is waited for, at
    most that long, so it is on its way to a worker when the call returns; a burst never
    is. Either way a broker that hangs holds up only the thread.

    Doorbells for steps due now are coalesced per queue: a worker woken by one drains every
    due step of its queue (and recruits another worker while there is more), so one per
    queue is enough, and a burst of enqueues rings a handful of times instead of once each.
    Doorbells for later (retries with a countdown) are kept one by one. A publish that
    fails is logged and dropped; the sweeper rings again for due steps. Pending doorbells
    are flushed when the process exits.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.flush, timeout=2.0)

    def _reset(self) -> None:
        # Also run in a forked child: the parent's thread and lock state do not carry over.
        self._cond = threading.Condition()
        self._due: dict[str, Doorbell] = {}
        self._later: list[Doorbell] = []
        self._busy = False
        self._last = 0.0
        # Submissions counted, and how many of them are published (or failed): what a
        # submitter waits on.
        self._submitted = 0
        self._published = 0
        self._thread: threading.Thread | None = None

    def submit(self, doorbells: list[Doorbell]) -> None:
        """Hand the doorbells to the background thread; when they come one at a time and
        ``TASKS_PUBLISH_WAIT_MS`` is set, wait for their publish, at most that long."""
        now = time.monotonic()
        wait = settings.TASKS_PUBLISH_WAIT_MS / 1000
        with self._cond:
            burst = bool(self._busy or self._due or self._later or now - self._last < BURST_SECONDS)
            self._last = now
            for bell in doorbells:
                if bell.countdown > 0:
                    self._later.append(bell)
                else:
                    self._due.setdefault(bell.queue, bell)
            self._submitted += 1
            ticket = self._submitted
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="doorbells", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if burst or wait <= 0:
                return
            deadline = now + wait
            try:
                while self._published < ticket:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        logger.info("doorbells not yet published after %.0f ms", wait * 1000)
                        return
                    self._cond.wait(remaining)
            finally:
                # A submit right after this one's publish is part of the same burst.
                self._last = time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._later:
                    self._cond.wait()
                bells = [*self._due.values(), *self._later]
                self._due.clear()
                self._later.clear()
                self._busy = True
                taken = self._submitted
            self._publish(bells, taken)
            # Let a burst gather for a moment: at most one publish per BURST_SECONDS.
            time.sleep(BURST_SECONDS)

    def _publish(self, bells: list[Doorbell], taken: int) -> None:
        try:
            publish(bells)
        except Exception as exc:
            logger.warning("could not ring %d doorbell(s); the sweeper will: %s", len(bells), exc)
        finally:
            with self._cond:
                self._busy = False
                self._published = max(self._published, taken)
                self._cond.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every submitted doorbell was published (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._due or self._later or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True


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


publisher = Publisher()
