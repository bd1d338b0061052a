"""The pieces of ``LOGGING`` that keep the log to a line per thing worth hearing of
(``tasks_app/observability/logs.py``); what real worker and beat processes write with them
is checked in ``tests/engine/test_e2e_worker_log.py`` and
``tests/observability/test_e2e_beat_log.py``."""

from __future__ import annotations

import logging

import pytest

from tasks_app.observability.logs import DiscardSummary, OneLinePerCrash


class WorkerLostError(Exception):
    """Stands for billiard's class of that name, which the filter knows by its name."""


def record(name: str, msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def crash_told(pid: int) -> logging.LogRecord:
    return record(
        "tasks_app.engine.crashes",
        "pool process %d died %s; released %d claim(s) of its batch of %d without charging them%s",
        pid,
        "running step 7",
        0,
        1,
        "",
    )


def billiard_exit(pid: int) -> logging.LogRecord:
    return record(
        "multiprocessing",
        "Process %r pid:%r exited with %r",
        "ForkPoolWorker-2",
        pid,
        "signal 9 (SIGKILL)",
        level=logging.ERROR,
    )


def celery_worker_lost() -> logging.LogRecord:
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 1.")
    return record(
        "celery.worker.request", "Task handler raised error: %r", lost, level=logging.ERROR
    )


def test_a_death_the_crash_line_told_of_is_that_line_alone() -> None:
    crashes = OneLinePerCrash()
    kept = [
        crashes.filter(r) for r in (crash_told(4711), billiard_exit(4711), celery_worker_lost())
    ]
    assert kept == [True, False, False]


def test_a_process_that_died_holding_no_step_keeps_billiards_line() -> None:
    crashes = OneLinePerCrash()
    crashes.filter(crash_told(4711))
    assert crashes.filter(billiard_exit(4712)) is True
    assert crashes.filter(celery_worker_lost()) is False


def test_when_billiard_speaks_first_both_lines_stay() -> None:
    crashes = OneLinePerCrash()
    assert [crashes.filter(billiard_exit(4711)), crashes.filter(crash_told(4711))] == [True, True]


def test_other_errors_of_the_same_loggers_stay() -> None:
    crashes = OneLinePerCrash()
    failed = record(
        "celery.worker.request", "Task handler raised error: %r", ValueError("x"), level=40
    )
    assert crashes.filter(failed) is True
    assert (
        crashes.filter(record("tasks_app.engine.crashes", "could not hand back %d", 4711)) is True
    )


def test_discarded_messages_are_summed_up_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    summary = DiscardSummary(logging.getLogger("config.celery"))
    summary.report()  # nothing discarded: nothing said
    for _ in range(30):
        summary.discarded("tasks_app.tasks.sweep", expired=True)
    summary.discarded("tasks_app.tasks.run_step", expired=False)
    summary.report()
    summary.report()
    assert [r.getMessage() for r in caplog.records] == [
        "discarded 31 message(s) unrun: tasks_app.tasks.run_step 1 revoked, "
        "tasks_app.tasks.sweep 30 expired"
    ]
