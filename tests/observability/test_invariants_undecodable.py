"""``check_invariants`` names each row whose JSON no Python process can decode (stored by
SQL, nested past the decoder's recursion limit): its task, its step and the column."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tasks_app.observability import invariants
from tests.factories import noop, succeeded
from tests.lease_support import step_at
from tests.poison_support import poison


@pytest.mark.django_db
def test_the_checker_names_the_task_step_and_column_that_cannot_be_decoded() -> None:
    healthy, payload, result = noop(), noop(), succeeded()
    poison(payload.pk)
    step = step_at(result, 0)
    poison(step.pk, "result")

    report = invariants.check(since=None)

    found = sorted(
        (finding.task_id, finding.detail.split(" cannot")[0])
        for finding in report.findings
        if finding.check == "undecodable"
    )
    assert found == [
        (payload.pk, f"column payload of task {payload.pk}"),
        (result.pk, f"column result of step {step.pk}"),
    ]
    assert all(finding.task_id != healthy.pk for finding in report.findings)


@pytest.mark.django_db
def test_check_invariants_prints_the_undecodable_row_and_exits_1() -> None:
    task = noop()
    poison(task.pk)
    out = StringIO()

    with pytest.raises(CommandError) as failed:
        call_command("check_invariants", stdout=out, stderr=StringIO())

    assert failed.value.returncode == 1
    assert out.getvalue().splitlines() == [
        f"undecodable: task {task.pk}: column payload of task {task.pk} cannot be decoded "
        "(nested deeper than Python's JSON decoder reads; 24,009 characters as stored)"
    ]
