"""What beat logs, end to end: a real beat sends sweeps without a line per send (unless
messages are logged), and one whose broker refuses its sends (a Redis of the test's own,
made read-only as a failover leaves the old primary) logs one line when the refusals start
and one when sends work again, never an ERROR or a traceback per refused send."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import cast

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.conftest import BROKER_PREFIX, BrokerView
from tests.e2e_support import beat_process, database_url, wait_for
from tests.redis_support import PrivateRedis
from tests.settings_support import load_settings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.django_db]


def test_beat_logs_a_streak_of_refused_sends_once(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    beat = beat_process(
        {
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": private_redis.url,
            "TASKS_BROKER_PREFIX": "",  # its own server: no prefix
            "TASKS_SWEEP_SECONDS": "1",
            "TASKS_VAR_DIR": str(tmp_path / "var"),
            # One line per send, refused or not: the test counts the refused ones by them.
            "TASKS_LOG_MESSAGES": "1",
        },
        tmp_path,
    )
    try:
        beat.wait_ready(timeout=60)
        wait_for(
            lambda: cast(int, private_redis.client.llen("maintenance")) >= 1,
            timeout=30,
            what=beat.tail,
        )
        with private_redis.read_only():  # every send is refused while it lasts
            wait_for(
                lambda: re.search(r"beat: cannot send sweep \(.*read only replica", beat.output()),
                timeout=30,
                what=beat.tail,
            )
            refused_from = beat.mark()
            # Let several more sends be refused before the broker takes writes again.
            wait_for(
                lambda: beat.output(refused_from).count("Sending due task sweep") >= 3,
                timeout=30,
                what=beat.tail,
            )
        found = wait_for(
            lambda: re.search(r"beat: sending again after (\d+) refused send\(s\)", beat.output()),
            timeout=30,
            what=beat.tail,
        )
    finally:
        beat.stop()
    logged = beat.output()
    assert int(found.group(1)) >= 3, logged
    assert logged.count("beat: cannot send") == 1, logged
    assert "Traceback" not in logged and "ERROR" not in logged, logged


def test_logging_drops_beats_line_per_message_unless_messages_are_logged() -> None:
    code = (
        # Celery sets the root logger's level from --loglevel.
        "import logging; logging.getLogger().setLevel(logging.INFO); "
        "log = logging.getLogger('celery.beat'); "
        "log.info('beat: Starting...'); "
        "log.info('Scheduler: Sending due task %s (%s)', 'sweep', 'tasks_app.tasks.sweep')"
    )
    quiet = load_settings(code, TASKS_LOG_MESSAGES="0")
    assert "beat: Starting..." in quiet.stderr
    assert "Sending due task" not in quiet.stderr
    chatty = load_settings(code, TASKS_LOG_MESSAGES="1")
    assert "Scheduler: Sending due task sweep (tasks_app.tasks.sweep)" in chatty.stderr


@pytest.mark.parametrize("messages", ["0", "1"], ids=["default", "TASKS_LOG_MESSAGES"])
def test_beat_sends_sweeps_without_a_line_per_send(
    messages: str, tmp_path: Path, broker: BrokerView
) -> None:
    """A real ``celery beat`` scheduling the sweep every second: it says it started, (unless
    messages are logged) nothing per sweep it sends, and, stopped, that it stopped."""
    if not settings.REDIS_URL:
        raise AssertionError("beat's test needs Redis: run `make test`")
    queue = f"{BROKER_PREFIX}{settings.TASKS_MAINTENANCE_QUEUE}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "TASKS_BROKER_PREFIX": BROKER_PREFIX,
        "TASKS_SWEEP_SECONDS": "1",
        "TASKS_VAR_DIR": str(tmp_path / "var"),
        "TASKS_LOG_MESSAGES": messages,
    }
    beat = beat_process(env, tmp_path)
    try:
        beat.wait_ready(timeout=60)
        wait_for(
            lambda: cast(int, client.llen(queue)) >= 2,
            timeout=30,
            what=lambda: "beat to send two sweeps\n" + beat.tail(),
        )
    finally:
        beat.stop()
    logged = beat.output()
    assert "beat: Starting..." in logged
    sent = cast(int, client.llen(queue))
    stopped = re.findall(
        r"INFO tasks_app\.integrations\.beat: beat: stopped; messages sent since it started: (.*)",
        logged,
    )
    assert stopped == [f"sweep {sent}"], logged
    if messages == "0":
        assert "Sending due task" not in logged, logged
    else:
        assert "Scheduler: Sending due task sweep" in logged, logged
