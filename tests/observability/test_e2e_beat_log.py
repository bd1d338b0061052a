"""End to end: a real beat whose broker refuses its sends (a Redis of the test's own, made
read-only as a failover leaves the old primary) logs one line when the refusals start and
one when sends work again, never an ERROR or a traceback per refused send."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import cast

import pytest
from django.db import connection

from tests.e2e_support import beat_process, database_url, wait_for
from tests.redis_support import PrivateRedis

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
