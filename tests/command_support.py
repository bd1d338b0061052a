"""Running the operator commands in the test's process: what one prints, what one refuses
(exit status 2, one line, nothing stored), and what a command could change."""

from __future__ import annotations

import getpass
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tasks_app.history import timeline
from tasks_app.history.timeline import HistoryEntry
from tasks_app.models import Task
from tests.rows import action_rows

OS_USER = f"cli:{getpass.getuser()}"


def run(*args: Any, **options: Any) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def refused(*args: Any, **options: Any) -> str:
    """Run a command that must refuse its input: exit status 2, one line, nothing stored."""
    before = action_rows()
    with pytest.raises(CommandError) as excinfo:
        call_command(*args, stdout=StringIO(), stderr=StringIO(), **options)
    assert excinfo.value.returncode == 2
    message = str(excinfo.value)
    assert message and "\n" not in message
    assert action_rows() == before
    return message


def status_of(task: Task) -> str:
    task.refresh_from_db()
    return task.status


def last_event(task: Task) -> HistoryEntry:
    """The newest entry of ``task``'s history (its enqueue is its row's, not an Event's)."""
    history = timeline.history(task.pk)
    assert history, task
    return history[-1]


def lines(text: str) -> list[str]:
    return text.strip().splitlines()
