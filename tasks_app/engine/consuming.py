"""Whether this worker node can take work from the broker, from what its transport saw.

The Redis transport (``tasks_app/integrations/broker.py``) reports every read of the queues it sends
(``BRPOP``, which Redis answers within a second even when no message waits), every
answer, and every read or declaration of a queue Redis refused. A node cannot consume when:

- Redis refused its last read (a replica after a failover, an ACL that forbids it), or
  the declaration of a queue (a consumer reconnecting to a replica), and has not served
  one or accepted one since; or
- it has a pool process free, yet has sent no read for ``QUIET_SECONDS``, or sent one
  that long ago and heard nothing since (Redis down, hung or out of reach, the consumer
  reconnecting).

A busy node sends no read (kombu waits for a free process first), so it is not
suspected. Nothing is known of a node whose transport reports nothing (the embedded
file-system broker): it counts as consuming.

While a node cannot consume, its heartbeat is withheld (``presence.HeartbeatThread``), so
the console and ``tasks_workers`` show it as silent after ``TASKS_WORKER_SILENT_SECONDS``
and the silent-worker alerts fire: it may be running, but it takes no work.

The state is this process's (a worker node's main process, where the consumer runs);
the transport writes it from the event loop, the heartbeat reads it from its thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from celery.worker import state as worker_state

# A read Redis has not answered for this long means it cannot serve one (it answers an
# idle read after a second).
QUIET_SECONDS = 5.0


@dataclass
class _Reads:
    asked_at: float | None = None
    answered_at: float | None = None
    # Why Redis refused the last read or declaration, until it serves or accepts one.
    refusal: str | None = None
    # The node's pool processes, once it is ready.
    concurrency: int | None = None


_reads = _Reads()


def serving(concurrency: int | None) -> None:
    """The node is ready, with ``concurrency`` pool processes."""
    _reads.concurrency = concurrency


def asked() -> None:
    _reads.asked_at = time.monotonic()


def answered() -> None:
    _reads.answered_at = time.monotonic()
    _reads.refusal = None


def refused(exc: BaseException) -> None:
    _reads.refusal = f"{type(exc).__name__}: {exc}"


def accepted() -> None:
    """Redis accepted a queue's declaration: it no longer refuses this node."""
    _reads.refusal = None


def has_room() -> bool:
    """Whether a pool process is free to take a step (unknown before the node is ready:
    yes)."""
    if _reads.concurrency is None:
        return True
    return len(worker_state.reserved_requests) < _reads.concurrency


def cannot_consume(now: float | None = None) -> str | None:
    """Why this node cannot take work now, or ``None`` when it can (or nothing is known)."""
    reads = _reads
    if reads.refusal is not None:
        return f"Redis refuses to serve its queues ({reads.refusal})"
    if reads.asked_at is None or not has_room():
        return None
    now = time.monotonic() if now is None else now
    if reads.answered_at is not None and reads.answered_at >= reads.asked_at:
        # Answered, and no read sent since: the consumer is not asking for work.
        quiet = now - reads.answered_at
        what = "has not asked Redis for work"
    else:
        quiet = now - reads.asked_at
        what = "has had no answer from Redis to a read of its queues"
    if quiet <= QUIET_SECONDS:
        return None
    return f"with a pool process free, it {what} for {quiet:.0f} s"


def reset() -> None:
    """Forget everything reported (a new node, or a test)."""
    global _reads
    _reads = _Reads()
