"""Doorbells: published after commit, once per queue, on their own or in a burst."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction

from tasks_app.dispatch import Doorbell, Publisher, coalesce, ring_on_commit
from tests.conftest import BrokerView


def test_doorbells_due_now_are_kept_once_per_queue_and_later_ones_each() -> None:
    bells = [
        Doorbell(1, "default"),
        Doorbell(2, "default"),
        Doorbell(3, "other"),
        Doorbell(4, "default", countdown=5),
        Doorbell(5, "default", countdown=5),
    ]
    assert coalesce(bells) == [bells[0], bells[2], bells[3], bells[4]]


def test_a_doorbell_on_its_own_is_published_before_submit_returns(broker: BrokerView) -> None:
    publisher = Publisher()
    publisher.submit([Doorbell(11, "default")])
    # Published in this thread: nothing is left pending.
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
    # The first went out on its own; the burst after it went out from the background (at
    # least once, after the last submit, since flush found nothing pending), coalesced
    # into far fewer messages than doorbells.
    assert published[0] == 21
    assert 2 <= len(published) < 19
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
