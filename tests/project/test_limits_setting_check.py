"""``TASKS_LIMITS`` is read by Django's system check (``tasks_app.apps.check_limits_setting``):
``manage.py check``, and every command that runs the checks (runserver, migrate), names
what a claim could not read, or a limit no workflow declares, before a worker meets it."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError


def limit_errors() -> list[CheckMessage]:
    return [message for message in run_checks() if message.id == "tasks_app.E002"]


def test_overrides_of_declared_limits_pass_the_check(settings: Any) -> None:
    settings.TASKS_LIMITS = {
        "demo_llm": {"rate": "600/m"},
        "demo_customer": {"concurrency": 0},
    }
    assert limit_errors() == []


def test_each_problem_with_the_setting_is_an_error_naming_it(settings: Any) -> None:
    settings.TASKS_LIMITS = {
        "demo_llm": {"rate": "fast"},
        "demo_customer": {"concurrency": -1, "burst": 3},
        "demo_llmm": {"concurrency": 2},
    }

    assert sorted(error.msg for error in limit_errors()) == [
        "TASKS_LIMITS['demo_customer']: a dict of concurrency and rate",
        "TASKS_LIMITS['demo_llm']['rate']: rate 'fast': write it as count/period, "
        "such as 200/s or 50/10s",
        "TASKS_LIMITS['demo_llmm']: no workflow declares a limit of that name",
    ]
    assert all(error.is_serious() for error in limit_errors())
    assert all("TASKS_LIMITS maps" in (error.hint or "") for error in limit_errors())


def test_manage_py_check_refuses_a_bad_setting(settings: Any) -> None:
    settings.TASKS_LIMITS = {"demo_customer": {"concurrency": "two"}}
    with pytest.raises(SystemCheckError, match=r"tasks_app\.E002.*a whole number, 0 or more"):
        call_command("check")
