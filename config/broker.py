"""Celery's Redis transport, unchanged but for two things: a worker that loses its broker
connection survives it, and publishing reuses one Redis client per channel.

On a lost connection kombu gives the worker's unacknowledged messages back to Redis over
that connection, and once reconnected it acknowledges the messages of the tasks that were
running over the old one. With Redis restarted or unreachable both fail (kombu 5.7 raises
``AttributeError`` from a channel whose connection is gone), and Celery stops the whole
worker as an unrecoverable error. Here both are logged and the worker goes on: the
messages are only doorbells. The sweeper rings again for every due step
(``TASKS_REDISPATCH_SECONDS``), a running step is held by its lease, and a message Redis
still holds comes back after the visibility timeout, finding nothing to claim.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from kombu.transport import redis

logger = logging.getLogger(__name__)


class QoS(redis.QoS):
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

    def ack(self, delivery_tag: Any) -> None:
        if self._connection_gone("acknowledge"):
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        if self._connection_gone("reject"):
            return
        super().reject(delivery_tag, requeue=requeue)

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

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._shared_client

    @cached_property
    def _shared_client(self) -> Any:
        return self._create_client()  # type: ignore[attr-defined]  # kombu's own, not in its stubs


class Transport(redis.Transport):
    Channel = Channel
