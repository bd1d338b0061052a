"""CELERY: the plain Celery task a Django team would write instead of the durable core.

Defined in this Django project, started with
``celery -A config worker -I bench.plain_tasks -Q benchplain``: Django is loaded, late
acks and ignored results as in our settings. The body does nothing; only in the latency
cell (``seq`` given) it appends its start time to a Redis list, one RPUSH.
"""

from __future__ import annotations

import os
import time

import redis
from celery import shared_task
from django.conf import settings

from bench import worker_hooks  # noqa: F401  (the ready signal for the harness)
from bench.common import PLAIN_STARTS_KEY

_client: redis.Redis | None = None


def _starts() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def starts_key() -> str:
    return os.environ.get("TASKS_BROKER_PREFIX", "") + PLAIN_STARTS_KEY


@shared_task(name="bench.noop", acks_late=True, ignore_result=True)
def noop(seq: int | None = None) -> None:
    if seq is not None:
        _starts().rpush(starts_key(), f"{seq} {time.time():.6f}")
