"""Doorbells: published after commit, once per queue, on their own or in a burst."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state
from django.conf import settings
from django.db import transaction

from tasks_app import services
from tasks_app.engine.dispatch import Doorbell, Publisher, coalesce, ring_on_commit
from tasks_app.models import Task
from tests.conftest import BrokerView
from tests.e2e_support import wait_for


def test_doorbells_due_now_are_kept_once_per_queue_and_later_ones_each() -> None:
    bells = [
        Doorbell(1, "default"),
        Doorbell(2, "default"),
        Doorbell(3, "other"),
        Doorbell(4, "default", countdown=5),
        Doorbell(5, "default", countdown=5),
    ]
    assert coalesce(bells) == [bells[0], bells[2], bells[3], bells[4]]


def test_with_a_publish_wait_a_doorbell_on_its_own_is_published_before_submit_returns(
    broker: BrokerView, settings: Any
) -> None:
    settings.TASKS_PUBLISH_WAIT_MS = 250
    publisher = Publisher()
    publisher.submit([Doorbell(11, "default")])
    # Waited for (well within TASKS_PUBLISH_WAIT_MS on a healthy broker): nothing pending.
    assert publisher._busy is False and not publisher._due
    assert broker.step_ids() == [11]


def test_a_burst_is_published_from_the_background_and_coalesced_per_queue(
    broker: BrokerView,
) -> None:
    publisher = Publisher()
    publisher.submit([Doorbell(21, "default")])
    # Closer together than dispatch.BURST_SECONDS: a burst, for the background thread.
    for step_id in range(22, 40):
        publisher.submit([Doorbell(step_id, "default")])
    assert publisher.flush(timeout=10)
    published = broker.step_ids()
    # Nobody waited: the background thread published the burst (at least once after the
    # last submit, since flush found nothing pending), coalesced into far fewer messages
    # than doorbells, the first submitted first.
    assert published[0] == 21
    assert 1 <= len(published) < 19
    assert set(published) <= set(range(21, 40))
    assert not publisher._due and not publisher._busy


@pytest.mark.django_db(transaction=True)
def test_ring_on_commit_rings_nothing_for_a_rolled_back_transaction(broker: BrokerView) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        ring_on_commit([Doorbell(51, settings.TASKS_QUEUES[0])])
        raise RuntimeError("rolled back")
    assert broker.step_ids() == []

    with transaction.atomic():
        ring_on_commit([Doorbell(52, settings.TASKS_QUEUES[0]), Doorbell(53, "default")])
    assert broker.step_ids() == [52]


# --- a hung broker --------------------------------------------------------------------------


@pytest.fixture
def hung_broker() -> Iterator[None]:
    """Make the current Celery app's broker a server that accepts connections and never
    answers (a hung Redis), for the length of the test."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            accepted.append(connection)  # held open, never read from or written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    previous = celery_state.get_current_app()
    previous_default = getattr(celery_state, "default_app", None)
    hung = Celery("hung", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    hung.conf.broker_transport_options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    hung.conf.broker_connection_timeout = settings.CELERY_BROKER_CONNECTION_TIMEOUT
    # The doorbells' thread reads the default app; this thread its own current one.
    hung.set_current()
    celery_state.set_default_app(hung)
    try:
        yield
    finally:
        celery_state.set_default_app(previous_default)  # type: ignore[arg-type]
        previous.set_current()
        stop.set()
        thread.join()
        # Closing them ends the publishes still waiting on an answer.
        for connection in accepted:
            connection.close()
        server.close()


def test_a_hung_broker_holds_a_doorbell_up_no_longer_than_the_bound(
    hung_broker: None, settings: Any
) -> None:
    settings.TASKS_PUBLISH_WAIT_MS = 200
    publisher = Publisher()
    started = time.monotonic()
    publisher.submit([Doorbell(61, "default")])
    waited = time.monotonic() - started
    # The bound, not the broker's 5 s socket timeout (a generous margin for a busy CI).
    assert waited < 2.0
    assert publisher._busy  # the background thread is still stuck on the broker


def test_by_default_submit_hands_the_doorbell_over_and_does_not_wait_for_it(
    hung_broker: None,
) -> None:
    publisher = Publisher()
    publisher.submit([Doorbell(62, "default")])
    # Returned while the broker never answers: the thread took the doorbell and is stuck
    # publishing it, which a submit that waited would still be doing.
    wait_for(lambda: publisher._busy, timeout=10, what="the thread to start publishing")
    assert publisher._published < publisher._submitted


@pytest.mark.django_db(transaction=True)
def test_enqueue_returns_within_the_bound_while_the_broker_hangs_and_the_task_stands(
    hung_broker: None, settings: Any
) -> None:
    settings.TASKS_PUBLISH_WAIT_MS = 200
    started = time.monotonic()
    task = services.enqueue("demo.noop", {"n": 1}, idempotency_key="hung-broker").task
    waited = time.monotonic() - started
    assert waited < 2.0
    # Committed: the sweeper rings for it once the broker answers again.
    assert Task.objects.filter(pk=task.pk, status="pending").exists()
