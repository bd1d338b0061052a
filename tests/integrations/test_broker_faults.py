"""Broker faults a worker rides out, and what says so.

The transport (``tasks_app/integrations/broker.py``) against a Redis of the test's own made to
refuse writes: out of memory under ``noeviction``, or read-only as a replica (what a failover does
to the old primary). A message read is delivered though Redis would not record it, a refused
acknowledgement is dropped (the message comes back after the visibility timeout), a refused read
pauses the consumer for a second instead of ending it. Then what the node makes of it
(``tasks_app.engine.consuming``, the heartbeat), the doorbell's backstop
(``tasks_app.engine.backstop``) and ``/readyz``. The fault drills
(``tests/chaos/test_broker_refusing_writes.py``) do the same to whole worker processes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
import redis
from celery.worker import state as worker_state
from django.db.models import F
from django.test import Client
from kombu import Connection, Consumer, Exchange, Message, Producer, Queue

import tasks_app.integrations.broker
from tasks_app import services
from tasks_app.engine import consuming, presence
from tasks_app.engine.backstop import Backstop
from tasks_app.engine.dispatch import Doorbell
from tasks_app.models import Heartbeat, Step
from tests.conftest import BrokerView, backdate, only_step, worker_thread
from tests.e2e_support import wait_for
from tests.redis_support import PrivateRedis

QUEUE = Queue("default", Exchange("default", type="direct"), routing_key="default")


@pytest.fixture
def transport(private_redis: PrivateRedis) -> Iterator[Connection]:
    """A kombu connection to the test's Redis through the project's transport, with a
    one-second visibility timeout."""
    connection = Connection(
        private_redis.url,
        transport="tasks_app.integrations.broker:Transport",
        transport_options={"visibility_timeout": 1, "unacked_restore_throttle": 1},
    )
    assert isinstance(connection.transport, tasks_app.integrations.broker.Transport)
    try:
        yield connection
    finally:
        connection.release()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each test starts with nothing reported and no refusal logged yet."""
    consuming.reset()
    monkeypatch.setattr(
        tasks_app.integrations.broker, "refusals", tasks_app.integrations.broker.Refusals()
    )
    caplog.set_level(logging.INFO, logger="tasks_app.integrations.broker")
    caplog.set_level(logging.INFO, logger="tasks_app")


def publish(connection: Connection, n: int) -> None:
    with connection.channel() as channel:
        Producer(channel).publish(
            {"n": n},
            exchange=QUEUE.exchange,
            routing_key="default",
            declare=[QUEUE],
            serializer="json",
        )


@contextlib.contextmanager
def consumer(connection: Connection) -> Iterator[list[Message]]:
    received: list[Message] = []
    with Consumer(
        connection,
        [QUEUE],
        callbacks=[lambda body, message: received.append(message)],
        accept=["json"],
    ):
        yield received


def drain(connection: Connection, seconds: float) -> None:
    """Let the consumer read for ``seconds`` (kombu raises a timeout when nothing came)."""
    with contextlib.suppress(TimeoutError, socket.timeout):
        connection.drain_events(timeout=seconds)


def next_message(connection: Connection, received: list[Message], what: str) -> Message:
    def arrived() -> bool:
        drain(connection, 1)
        return bool(received)

    wait_for(arrived, timeout=10, what=what)
    return received.pop(0)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


# --- the transport ----------------------------------------------------------------------------


def test_a_doorbell_read_from_a_full_redis_is_delivered_and_its_refused_ack_dropped(
    private_redis: PrivateRedis, transport: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    publish(transport, 1)
    publish(transport, 2)
    with consumer(transport) as received, private_redis.out_of_memory():
        first = next_message(transport, received, "the first doorbell")
        # Redis could not record it as unacknowledged: delivered all the same.
        assert private_redis.client.hlen("unacked") == 0
        first.ack()  # refused by Redis; no error
        next_message(transport, received, "the second doorbell").ack()
    assert lines(caplog, "Redis refuses to record a doorbell as unacknowledged") == 1
    assert lines(caplog, "Redis refuses to acknowledge a doorbell") == 1

    publish(transport, 3)
    with consumer(transport) as received:
        third = next_message(transport, received, "the third doorbell")
        assert private_redis.client.hlen("unacked") == 1  # recorded again
        third.ack()
    assert private_redis.client.hlen("unacked") == 0
    assert lines(caplog, "Redis lets this worker acknowledge a doorbell again") == 1


def test_an_ack_a_replica_refuses_leaves_the_doorbell_to_come_back_after_the_visibility_timeout(
    private_redis: PrivateRedis, transport: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    publish(transport, 1)
    with consumer(transport) as received:
        message = next_message(transport, received, "the doorbell")
        with private_redis.read_only():
            message.ack()  # refused by Redis; no error
        assert lines(caplog, "Redis refuses to acknowledge a doorbell") == 1
        qos = cast(Any, transport.default_channel).qos
    assert private_redis.client.hlen("unacked") == 1  # Redis still holds it

    def back_in_its_queue() -> bool:
        qos.restore_visible(num=10, interval=1)
        return bool(private_redis.client.llen("default"))

    wait_for(back_in_its_queue, timeout=10, what="the doorbell back after the visibility timeout")


def test_a_read_refused_by_a_replica_pauses_the_consumer_and_it_reads_again_once_writable(
    private_redis: PrivateRedis, transport: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    with consumer(transport) as received:
        drain(transport, 1.5)  # an idle read, answered "nothing" after a second
        assert consuming.cannot_consume() is None

        with private_redis.read_only():
            before = private_redis.refused_reads()
            began = time.monotonic()
            while time.monotonic() - began < 3:
                drain(transport, 0.2)
            refused = private_redis.refused_reads() - before
            reason = consuming.cannot_consume()
        # About one read a second, not a read on every turn of the loop.
        assert 1 <= refused <= 5, f"{refused} reads refused in 3 s"
        assert reason is not None and reason.startswith("Redis refuses to serve its queues")

        publish(transport, 1)
        next_message(transport, received, "a read served again")
        assert consuming.cannot_consume() is None
    assert lines(caplog, "Redis refuses to serve the queues") == 1
    assert lines(caplog, "Redis lets this worker serve the queues again") == 1


def test_a_consumer_a_replica_refuses_its_queues_cannot_consume_at_once_until_they_are_declared(
    private_redis: PrivateRedis, transport: Connection, a_busy_pool: None
) -> None:
    # As a consumer reconnecting after a failover: it declares its queues before any read.
    # (A busy node: so the refusal is what says so, not a read left unanswered.)
    with private_redis.read_only():
        with pytest.raises(redis.exceptions.ReadOnlyError):
            Consumer(transport, [QUEUE], accept=["json"]).declare()
        reason = consuming.cannot_consume()
    assert reason is not None and reason.startswith("Redis refuses to serve its queues")
    assert "ReadOnlyError" in reason

    # Declared on the next reconnection once Redis accepts writes again, before any read
    # is sent or answered.
    with transport.clone() as reconnected:
        Consumer(reconnected, [QUEUE], accept=["json"]).declare()
    assert consuming.cannot_consume() is None


# --- what the node makes of it ------------------------------------------------------------------


@pytest.fixture
def a_busy_pool() -> Iterator[None]:
    """Both of a two-process node's processes hold a request."""

    class Held:
        pass

    held = [Held(), Held()]
    consuming.serving(2)
    for request in held:
        worker_state.reserved_requests.add(request)
    yield
    for request in held:
        worker_state.reserved_requests.discard(request)


def test_a_node_with_a_free_process_and_an_unanswered_read_cannot_consume() -> None:
    consuming.serving(2)
    consuming.asked()
    asked = time.monotonic()
    assert consuming.cannot_consume(now=asked + 1) is None
    reason = consuming.cannot_consume(now=asked + consuming.QUIET_SECONDS + 1)
    assert reason is not None and "no answer from Redis" in reason

    consuming.answered()
    answered = time.monotonic()
    assert consuming.cannot_consume(now=answered + 1) is None
    # Answered, then no read sent again (the consumer reconnecting, say).
    reason = consuming.cannot_consume(now=answered + consuming.QUIET_SECONDS + 1)
    assert reason is not None and "has not asked Redis for work" in reason


def test_a_busy_node_sends_no_read_and_is_not_suspected(a_busy_pool: None) -> None:
    consuming.asked()
    assert consuming.cannot_consume(now=time.monotonic() + 600) is None


def test_nothing_reported_by_the_transport_counts_as_consuming() -> None:
    # The embedded file-system broker reports no reads.
    consuming.serving(2)
    assert consuming.cannot_consume(now=time.monotonic() + 600) is None


def node() -> presence.NodeInfo:
    return presence.NodeInfo(
        name="celery@box-1",
        hostname="box-1",
        pid=100,
        queues=["default"],
        concurrency=2,
        processes=[101, 102],
    )


def from_its_thread[T](work: Callable[[], T]) -> T:
    """Run ``work`` as the heartbeat's or the backstop's thread does: on a database
    connection of its own (each closes or replaces its connection as it sees fit)."""
    done: list[T] = []
    errors: list[BaseException] = []
    thread = worker_thread(lambda: done.append(work()), errors)
    thread.start()
    thread.join(timeout=30)
    assert not errors, errors
    return done[0]


def test_the_heartbeat_is_withheld_while_the_node_cannot_consume(
    transactional_db: None, caplog: pytest.LogCaptureFixture
) -> None:
    presence.worker_started(node())
    Heartbeat.objects.update(seen_at=F("seen_at") - timedelta(hours=1))
    heartbeat = presence.HeartbeatThread("celery@box-1", node, interval=10)

    consuming.refused(redis.exceptions.ReadOnlyError("You can't write against a replica."))
    assert from_its_thread(heartbeat.beat) is False
    assert from_its_thread(heartbeat.beat) is False
    [row] = presence.workers()
    assert row.state == "silent"

    consuming.answered()
    assert from_its_thread(heartbeat.beat) is True
    [row] = presence.workers()
    assert row.state == "live"
    assert lines(caplog, "heartbeat: not reporting this worker as live: Redis refuses") == 1
    assert lines(caplog, "heartbeat: this worker consumes again") == 1


def test_a_warm_shutdown_is_not_taken_for_a_node_that_cannot_consume(
    transactional_db: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm shutdown stops the consumer first, then waits for the pool to finish its
    steps: the node asks Redis for nothing meanwhile, on purpose."""
    from celery.signals import worker_shutting_down

    import config.celery

    presence.worker_started(node())
    heartbeat = presence.HeartbeatThread("celery@box-1", node, interval=10)
    monkeypatch.setattr(config.celery, "_heartbeat", heartbeat)
    # Its last read was answered a minute ago and none was sent since (back-dated), with a
    # pool process free: while running, that is a node that cannot consume.
    consuming.serving(2)
    consuming.asked()
    consuming.answered()
    reads = consuming._reads
    reads.asked_at = reads.answered_at = time.monotonic() - 60
    assert consuming.cannot_consume() is not None

    worker_shutting_down.send(sender="celery@box-1", sig="SIGTERM", how="Warm", exitcode=0)
    assert from_its_thread(heartbeat.beat) is True
    [row] = presence.workers()
    assert row.state == "live"
    assert lines(caplog, "heartbeat: not reporting this worker as live") == 0


# --- the doorbell's backstop ------------------------------------------------------------------


def a_due_step(broker: BrokerView, key: str) -> int:
    """A step due now, whose own doorbell (rung on commit) is taken off the broker: as if
    it had been lost."""
    step = only_step(services.enqueue("demo.noop", {}, idempotency_key=key).task)
    assert broker.step_ids() == [step.pk]
    broker.purge()
    return step.pk


def test_the_backstop_rings_for_a_step_due_longer_than_its_interval(
    transactional_db: None, broker: BrokerView
) -> None:
    step_id = a_due_step(broker, "backstop-1")
    backstop = Backstop(["default"], interval=5)

    # Due for less than the interval: its own doorbell may still be on its way.
    assert from_its_thread(backstop.check) == []
    backdate(Step.objects.get(pk=step_id), 6)
    assert from_its_thread(backstop.check) == [Doorbell(step_id, "default")]
    assert broker.step_ids() == [step_id]


def test_the_backstop_leaves_paused_queues_and_busy_nodes_alone(
    transactional_db: None, broker: BrokerView, a_busy_pool: None
) -> None:
    step_id = a_due_step(broker, "backstop-2")
    backdate(Step.objects.get(pk=step_id), 60)
    backstop = Backstop(["default"], interval=5)
    assert from_its_thread(backstop.check) == []  # no process free

    consuming.serving(3)
    services.pause_queue("default", actor="cli:t", reason="incident")
    assert from_its_thread(backstop.check) == []
    assert broker.step_ids() == []


# --- /readyz ------------------------------------------------------------------------------------


def test_readyz_fails_while_redis_refuses_writes_though_it_answers_ping(
    client: Client, db: None, settings: Any, private_redis: PrivateRedis
) -> None:
    services.sweep()
    settings.REDIS_URL = private_redis.url

    def checks() -> tuple[int, dict[str, Any]]:
        response = client.get("/readyz")
        return response.status_code, response.json()["checks"]

    for fault, refusal in [
        (private_redis.out_of_memory, "OutOfMemoryError"),
        (private_redis.read_only, "ReadOnlyError"),
    ]:
        with fault():
            status, found = checks()
        assert status == 503
        assert found["broker"]["ok"] is True  # it answers PING
        assert found["broker_writes"] == {**found["broker_writes"], "ok": False}
        assert found["broker_writes"]["detail"] == f"failed: {refusal}"

    status, found = checks()
    assert (status, found["broker_writes"]["detail"]) == (200, "accepted")
