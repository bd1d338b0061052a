"""Celery's Redis transport, unchanged but for two things: a worker rides out broker faults
instead of exiting, and publishing reuses one Redis client per channel.

What a worker meets, and what it does here (kombu 5.7 would raise each of these out of the
event loop, and Celery would stop the whole worker as an unrecoverable error):

- **The connection lost** (Redis restarted or unreachable). kombu gives the worker's
  unacknowledged messages back to Redis over that connection, and once reconnected
  acknowledges the messages of the tasks that were running over the old one; both fail
  (``AttributeError`` from a channel whose connection is gone). Both are logged and the
  worker goes on.
- **Writes refused** (out of memory under ``noeviction``; read-only, as the old primary
  after a failover; a failing snapshot under ``stop-writes-on-bgsave-error``). A message
  read from a queue is still delivered when Redis will not record it as unacknowledged,
  an acknowledgement or rejection Redis refuses is dropped here, and the periodic restore
  of unacknowledged messages waits for its next round. One line is logged when Redis
  starts refusing each of these and one when it accepts it again.
- **A read refused** (an error answer to ``BRPOP``: a replica unblocking its clients when
  it changes role, ``READONLY``, an ACL that no longer allows it). The consumer drops that
  connection and asks again on a new one ``READ_RETRY_SECONDS`` later, which reaches the
  new primary when the address moved to it.
- **Its queues' declaration refused** (a reconnecting consumer on a replica, which never
  gets as far as a read). Reported as a refused read is, at once.

Any other error answer the consumer meets makes Celery reconnect rather than exit
(``CELERY_BROKER_CHANNEL_ERROR_RETRY``). The reads, their answers and refusals are
reported to :mod:`tasks_app.engine.consuming`, which tells whether the node can consume.

None of this loses work, because the messages are only doorbells. The sweeper rings again
for every due step (``TASKS_REDISPATCH_SECONDS``) and each worker node for its queues'
(``tasks_app.engine.backstop``); a running step is held by its lease; and a message Redis still
holds comes back after the visibility timeout, finding nothing to claim.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cached_property
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import redis, virtual
from redis.exceptions import ResponseError

from tasks_app.engine import consuming

logger = logging.getLogger(__name__)

# After Redis refused a read, the consumer asks again this much later (it answers an
# idle read once a second anyway, so this costs Redis nothing more).
READ_RETRY_SECONDS = 1.0


class Refusals:
    """What Redis refuses this process, by action: logged once when it starts refusing
    and once when it accepts again, however many messages pass meanwhile."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def refused(self, action: str, exc: BaseException, consequence: str) -> None:
        if action not in self._since:
            self._since[action] = monotonic()
            logger.warning(
                "Redis refuses to %s (%s: %s); %s", action, type(exc).__name__, exc, consequence
            )

    def accepted(self, action: str) -> None:
        since = self._since.pop(action, None)
        if since is not None:
            first = monotonic() - since
            logger.info("Redis lets this worker %s again (first refused %.0f s ago)", action, first)


refusals = Refusals()

RECORD = "record a doorbell as unacknowledged"
ACKNOWLEDGE = "acknowledge a doorbell"
RESTORE = "restore unacknowledged doorbells"
READ = "serve the queues"


class QoS(redis.QoS):
    def append(self, message: Any, delivery_tag: Any) -> None:
        try:
            super().append(message, delivery_tag)
        except ResponseError as exc:
            # Already taken off its queue: run it anyway (the claim decides). Should this
            # worker die before it is done, the sweeper rings for its step again.
            virtual.QoS.append(self, message, delivery_tag)
            refusals.refused(RECORD, exc, "each is run all the same")
        else:
            refusals.accepted(RECORD)

    def restore_unacked_once(self, stderr: Any = None) -> None:
        held = len(self._delivered or ())
        try:
            super().restore_unacked_once(stderr)
        except Exception as exc:
            if self._delivered is not None:
                self._delivered.clear()
            logger.warning(
                "could not give %d unacknowledged doorbell(s) back to the broker (%s); "
                "the sweeper rings again for their steps",
                held,
                exc,
            )

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        try:
            super().restore_visible(start, num, interval)
        except ResponseError as exc:
            refusals.refused(RESTORE, exc, "trying again at the next round")
        else:
            refusals.accepted(RESTORE)

    def ack(self, delivery_tag: Any) -> None:
        if self._connection_gone("acknowledge"):
            return
        try:
            super().ack(delivery_tag)
        except ResponseError as exc:
            self._refused_ack(delivery_tag, exc)
        else:
            refusals.accepted(ACKNOWLEDGE)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._connection_gone("reject"):
            return
        try:
            super().reject(delivery_tag, requeue=requeue)
        except ResponseError as exc:
            self._refused_ack(delivery_tag, exc)
        else:
            refusals.accepted(ACKNOWLEDGE)

    def _refused_ack(self, delivery_tag: Any, exc: BaseException) -> None:
        # Forgotten here; Redis, if it recorded the message, hands it out again after the
        # visibility timeout, as a late doorbell that finds nothing to claim.
        virtual.QoS.ack(self, delivery_tag)
        refusals.refused(
            ACKNOWLEDGE,
            exc,
            "each comes back after the visibility timeout, finding nothing to claim",
        )

    def _connection_gone(self, action: str) -> bool:
        if self.channel.connection is not None:
            return False
        logger.info("cannot %s a doorbell received over a lost broker connection", action)
        return True


class Channel(redis.Channel):
    """kombu builds a new Redis client (registering some 200 response callbacks) for every
    message it publishes; the client is a thin, thread-safe wrapper around the channel's
    connection pool, so one per channel serves every publish."""

    QoS = QoS
    # Until then no read is sent, after Redis refused one.
    _reads_resume_at = 0.0

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._shared_client

    @cached_property
    def _shared_client(self) -> Any:
        return self._create_client()  # type: ignore[attr-defined]  # kombu's own, not in its stubs

    def _brpop_start(self, timeout: Any = None) -> None:
        # The event loop calls this on every turn while no read is out; kombu's timers
        # turn it at least once a second, so the pause ends on time.
        if monotonic() < self._reads_resume_at:
            return
        super()._brpop_start(timeout)  # type: ignore[misc]  # kombu's own, not in its stubs
        if self._in_poll:  # type: ignore[attr-defined]  # a read went out
            consuming.asked()

    def _brpop_read(self, **options: Any) -> Any:
        try:
            delivered = super()._brpop_read(**options)  # type: ignore[misc]  # not in stubs
        except Empty:
            self._read_answered()  # nothing waiting: Redis said so within its timeout
            raise
        except ResponseError as exc:
            self._read_refused(exc)
            raise Empty() from exc
        self._read_answered()
        return delivered

    def _queue_bind(self, *args: Any) -> None:
        # A consumer declares its queues before it reads them, on every reconnection. A
        # replica (the old primary after a failover, perhaps restarted empty) refuses
        # that, so the consumer keeps reconnecting without ever sending a read: a refusal
        # as plain as a refused read, and said as soon.
        try:
            super()._queue_bind(*args)  # type: ignore[misc]  # kombu's own, not in its stubs
        except ResponseError as exc:
            consuming.refused(exc)
            raise
        consuming.accepted()

    def _read_answered(self) -> None:
        consuming.answered()
        refusals.accepted(READ)

    def _read_refused(self, exc: BaseException) -> None:
        self._reads_resume_at = monotonic() + READ_RETRY_SECONDS
        consuming.refused(exc)
        refusals.refused(READ, exc, f"asking again every {READ_RETRY_SECONDS:g} s")
        # A new connection for the next read: after a failover the address may lead to the
        # new primary, while this one stays with the replica.
        with suppress(Exception):
            self.client.connection.disconnect()


class Transport(redis.Transport):
    Channel = Channel
