"""End to end in the embedded default: no DATABASE_URL, no REDIS_URL, so SQLite and
Celery's file-system broker under TASKS_VAR_DIR, with a real worker that embeds beat.

Everything runs in subprocesses (migrate, the worker, the producer commands), as on a
laptop after ``make run``; this test needs neither the PostgreSQL test database nor Redis.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tasks_app.redaction import REDACTED
from tests.e2e_support import PYTHON, ROOT, Worker, manage, wait_for
from tests.permission_tables import ACTION_CASES, PAGE_CASES
from tests.remotes import loopback_remotes

# The environment variables that would switch away from the embedded default.
SERVICE_VARIABLES = ("DATABASE_URL", "REDIS_URL", "TASKS_BROKER_PREFIX")
SWEEP_DONE = r"Task tasks_app\.tasks\.sweep\[[^\]]+\] succeeded in"


def embedded_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
    env["TASKS_VAR_DIR"] = str(var_dir)
    env["TASKS_SWEEP_SECONDS"] = "1"
    return env


def status(env: dict[str, str], key: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(manage("task_status", "--key", key, "--json", env=env))
    return parsed


def rows(database: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(database)) as db:
        return db.execute(sql, params).fetchall()


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_embedded_default_runs_a_flaky_task_to_success(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    env = embedded_env(var_dir)
    manage("migrate", "--noinput", env=env, timeout=90)
    worker = Worker(["-c", "1", "-B", "--loglevel=INFO"], env=env, log_path=tmp_path / "worker.log")
    try:
        worker.wait_ready(timeout=60)
        created = json.loads(
            manage(
                "enqueue",
                "demo.flaky",
                "--payload",
                '{"fail_first": 1}',
                "--key",
                "embedded-1",
                env=env,
            )
        )
        assert (created["created"], created["status"], created["key"]) == (
            True,
            "pending",
            "embedded-1",
        )

        def finished() -> dict[str, Any] | None:
            current = status(env, "embedded-1")
            return current if current["status"] in {"succeeded", "dead", "cancelled"} else None

        final = wait_for(
            finished,
            timeout=60,
            interval=0.2,
            what=lambda: "embedded-1 to finish\n" + worker.tail(),
        )
        # Beat's sweeper runs on the maintenance queue of the same worker.
        wait_for(
            lambda: worker.count(SWEEP_DONE) >= 1,
            timeout=30,
            what=lambda: "a sweep to run\n" + worker.tail(),
        )
        worker.assert_quiet()
    finally:
        worker.stop()

    assert final["status"] == "succeeded"
    [step] = final["steps"]
    assert (step["kind"], step["status"], step["attempts"], step["fencing_token"]) == (
        "flaky",
        "succeeded",
        2,
        2,
    )
    # task_status redacts the result as the console does: a key named "token" is taken for
    # a secret (demo.flaky's is its fencing token, printed above).
    assert step["result"] == {"token": REDACTED, "attempt": 2}

    # The state lives in the SQLite file under TASKS_VAR_DIR, with its whole history.
    database = var_dir / "db.sqlite3"
    task_id = final["id"]
    assert [event["kind"] for event in final["events"]] == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "succeeded",
    ]
    # The enqueue is the task row's, the claims and the success the attempts' Lease rows
    # (below): the retry alone is an Event row.
    kinds = rows(
        database, "SELECT kind FROM tasks_app_event WHERE task_id = ? ORDER BY id", task_id
    )
    assert [kind for (kind,) in kinds] == ["retry_scheduled"]
    leases = rows(
        database,
        "SELECT token, outcome FROM tasks_app_lease WHERE step_id = ? ORDER BY token",
        step["id"],
    )
    assert leases == [(1, "failed"), (2, "succeeded")]
    assert (var_dir / "broker" / "queue").is_dir()
    # Beat's schedule file (its suffix depends on the dbm module shelve picks).
    assert list(var_dir.glob("celerybeat-schedule*"))


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_embedded_default_takes_the_demo_article_through_its_review(tmp_path: Path) -> None:
    """What `make run` shows a newcomer: the seeded article waits for `editor`, who approves
    it from the command line; the worker publishes it once."""
    var_dir = tmp_path / "var"
    env = embedded_env(var_dir)
    with loopback_remotes() as (publishing, mail):
        env["PUBLISH_URL"], env["MAIL_URL"] = publishing.url, mail.url
        manage("migrate", "--noinput", env=env, timeout=90)
        seeded = manage("seed_demo", env=env)
        assert "publish_article: waiting_approval" in seeded
        worker = Worker(["-c", "1", "--loglevel=INFO"], env=env, log_path=tmp_path / "worker.log")
        try:
            worker.wait_ready(timeout=60)
            [request] = [
                json.loads(line)
                for line in manage(
                    "decide", "list", "--user", "editor", "--json", env=env
                ).splitlines()
                if json.loads(line)["workflow"] == "publish_article"
            ]
            decided = json.loads(
                manage(
                    "decide",
                    "approve",
                    str(request["id"]),
                    "--user",
                    "editor",
                    "--draft-hash",
                    request["draft_hash"],
                    "--json",
                    env=env,
                )
            )
            assert (decided["status"], decided["decided_by"]) == ("approved", "editor")

            def published() -> dict[str, Any] | None:
                current = status(env, "demo:publish:article-001:v1")
                return current if current["status"] == "succeeded" else None

            final = wait_for(
                published,
                timeout=60,
                interval=0.2,
                what=lambda: "the article to be published\n" + worker.tail(),
            )
            worker.assert_quiet()
        finally:
            worker.stop()

    # The seed sent the first draft back once: its rows stay as superseded history.
    assert [(s["kind"], s["status"]) for s in final["steps"]] == [
        ("generate_draft", "superseded"),
        ("generate_draft", "succeeded"),
        ("editor_review", "superseded"),
        ("editor_review", "succeeded"),
        ("publish", "succeeded"),
        ("cleanup", "succeeded"),
    ]
    assert [write["key"] for write in publishing.applied] == [
        "demo:publish:article-001:v1:2:publish:publish"
    ]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_console_answers_every_role_as_its_tables_say_on_the_embedded_default(
    tmp_path: Path,
) -> None:
    """The permission tables (``tests/permission_tables.py``), on SQLite, page by page."""
    env = {**embedded_env(tmp_path / "var"), "DJANGO_ALLOWED_HOSTS": "testserver"}
    manage("migrate", "--noinput", env=env, timeout=90)
    done = subprocess.run(
        [PYTHON, "-m", "tests.embedded_console"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [tuple(json.loads(line)) for line in done.stdout.splitlines() if line.startswith("[")]
    expected = [("page", *case) for case in PAGE_CASES] + [
        ("action", *case) for case in ACTION_CASES
    ]
    assert seen == expected
