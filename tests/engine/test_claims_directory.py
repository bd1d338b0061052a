"""The directory of a worker's claim records (``tasks_app.engine.claims_directory``) kept for
the worker's whole life: made again when a cleaner removed it, with one warning; a pool
process whose file went with it records its next batch where the main process looks; a
directory that cannot be made turns crash isolation off, once in the log and in ``/readyz``
while it lasts."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks_app.engine import claims_directory, crashes, leases
from tasks_app.observability import health

LOOKS = 10


def claims(count: int) -> list[leases.Claim]:
    return [
        leases.Claim(
            step_id=n, task_id=n, token=1, attempt=1, worker_id="h:1", lease_seconds=30, queue="q"
        )
        for n in range(1, count + 1)
    ]


@pytest.fixture
def worker_directory(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """A worker's directory made under ``TASKS_CLAIMS_DIR`` as its main process makes it."""
    settings.TASKS_CLAIMS_DIR = str(tmp_path / "claims")
    crashes.prepare()
    assert crashes._directory is not None
    yield crashes._directory.path
    crashes.clean_up()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_removed_directory_is_made_again_with_one_warning_not_a_stream(
    worker_directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert crashes._directory is not None
    watcher = crashes.ChildWatcher(worker_directory, crashes._directory)
    watcher.look()
    shutil.rmtree(worker_directory)

    with caplog.at_level(logging.INFO, logger="tasks_app"):
        for _ in range(LOOKS):
            watcher.look()

    assert worker_directory.is_dir()
    assert (os.stat(worker_directory).st_mode & 0o777) == 0o700
    [warning] = warnings_of(caplog)
    assert "was removed" in warning and "made it again" in warning
    assert not any(record.exc_info for record in caplog.records)


def test_a_pool_process_records_its_next_batch_where_the_watcher_looks_after_a_removal(
    worker_directory: Path,
) -> None:
    record = crashes.ClaimsRecord()
    path = worker_directory / str(os.getpid())
    record.open(path)
    record.holding(claims(2))
    shutil.rmtree(worker_directory)  # the open file goes with it

    batch = claims(3)
    record.holding(batch)
    record.running(1)

    held = crashes.read_batch(path)
    record.close()
    assert held is not None
    assert (held.claims, held.culprit) == (batch, batch[1])


def test_a_looking_failure_is_logged_once_per_streak(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = crashes.ChildWatcher(tmp_path / "never-made")  # nothing keeps it

    with caplog.at_level(logging.INFO, logger="tasks_app"):
        for _ in range(LOOKS):
            watcher.look()

    assert len([r for r in caplog.records if r.exc_info]) == 1


@pytest.fixture
def unmakeable(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """``TASKS_CLAIMS_DIR`` under a plain file: no directory can be made there."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings.TASKS_CLAIMS_DIR = str(blocker / "claims")
    yield blocker
    crashes.clean_up()


@pytest.mark.django_db
def test_a_directory_that_cannot_be_made_turns_crash_isolation_off_and_readyz_says_so(
    unmakeable: Path, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    if not settings.REDIS_URL:
        pytest.skip("crash isolation is reported through Redis")
    with caplog.at_level(logging.INFO, logger="tasks_app"):
        crashes.prepare()
        assert crashes._directory is not None
        watcher = crashes.ChildWatcher(crashes._directory.path, crashes._directory)
        for _ in range(LOOKS):
            watcher.look()
        crashes.start_recording()  # a pool process records nothing, and says nothing

        assert not crashes.record.is_open
        [warning] = warnings_of(caplog)
        assert "crash isolation is off" in warning
        assert claims_directory.node() in claims_directory.nodes_off()
        body, _ = health.ready()
        assert body["status"] == "not ready"
        assert body["checks"]["crash_isolation"] == {
            "ok": False,
            "detail": "off on 1 worker(s)",
            "ms": body["checks"]["crash_isolation"]["ms"],
        }

        unmakeable.unlink()  # the disk is fixed
        watcher.look()

    assert crashes._directory.path.is_dir()
    # Back on: one line says so, and none says it was removed.
    assert len(warnings_of(caplog)) == 1
    assert claims_directory.nodes_off() == []
    assert health.ready()[0]["checks"]["crash_isolation"]["ok"] is True
    assert any("crash isolation is on again" in r.getMessage() for r in caplog.records)


def test_a_directory_open_to_others_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    kept = claims_directory.ClaimsDirectory(shared)

    assert not kept.usable()
    with pytest.raises(OSError, match="alone"):
        claims_directory.make_private(shared)
