"""Dead letters grouped by cause, and what the effects ledger says before a rerun.

A cause is the error class plus the message with what varies masked
(``tasks_app.models.fingerprints``); it is stored on the step when it dies, so ``/dead/groups/``
reads an index. Each group links to its dead letters, whose bulk actions act on that group
only. The task page and every bulk preview show each dead step's external writes: those
that happened (a rerun skips them by key) and those in doubt (started, no outcome).
"""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console.presenters import payload_changes
from tasks_app import services
from tasks_app.engine import runner
from tasks_app.models import Effect, Step, StepStatus, Task, TaskStatus
from tasks_app.models.fingerprints import fingerprint, masked_message
from tasks_app.operations import listings, selectors
from tasks_app.operations.listings import DeadFilter
from tests.cause_support import causes, dead, dead_step
from tests.conftest import only_step
from tests.console_support import HTMX, login
from tests.lease_support import claim, expire_lease

__all__ = ["causes"]  # the fixture, used by name

# --- the fingerprint --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("HTTP 503 from /articles/871", "HTTP 503 from /articles/12"),
        (
            "request 9f2c0a1b-1111-2222-3333-444455556666 failed",
            "request 0b1c2d3e-aaaa-bbbb-cccc-dddd00001111 failed",
        ),
        ("no row 'article-001' in table", "no row 'other' in table"),
        ('key "a" missing', 'key "bcd" missing'),
        ("object at 0x7f3a2b1c9d00 is gone", "object at 0x55d1 is gone"),
        ("checksum 3fa9c0e1d2b4 mismatch", "checksum 00ab12cd34ef mismatch"),
        ("took 12.5 s", "took 3 s"),
    ],
)
def test_what_varies_from_step_to_step_is_masked(one: str, other: str) -> None:
    assert fingerprint("x.Error", f"x.Error: {one}") == fingerprint("x.Error", f"x.Error: {other}")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("HTTP 503 from the remote", "HTTP 404 from the remote"),
        ("status=500", "status=502"),
        ("connection refused", "connection reset"),
    ],
)
def test_different_causes_differ(one: str, other: str) -> None:
    assert fingerprint("x.Error", one) != fingerprint("x.Error", other)


def test_the_error_class_is_part_of_the_cause() -> None:
    assert fingerprint("x.One", "boom") != fingerprint("x.Other", "boom")


def test_the_masked_message_is_a_tracebacks_last_line_without_its_class() -> None:
    traceback = 'Traceback (most recent call last):\n  File "a.py", line 3\nx.Error: HTTP 503 at 42'
    assert masked_message("x.Error", traceback) == "HTTP 503 at <n>"


# --- dying stores it ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_that_dies_of_a_failure_stores_its_cause(causes: None) -> None:
    step = dead_step(dead(message="HTTP 503 from /articles/7"))

    assert step.error_fingerprint == fingerprint(step.error_class, step.last_error)
    assert (
        step.error_fingerprint
        == dead_step(dead(message="HTTP 503 from /articles/8")).error_fingerprint
    )


@pytest.mark.django_db
def test_a_step_whose_lease_ran_out_on_its_last_attempt_stores_its_cause(causes: None) -> None:
    task = services.enqueue("test.causes.a", {"message": "x"}).task
    claim(only_step(task))
    expire_lease(only_step(task))

    step = dead_step(task)
    assert step.error_class == "lease_expired"
    assert step.error_fingerprint == fingerprint("lease_expired", step.last_error)


# --- the groups -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_dead_letters_group_by_cause_with_count_workflows_first_and_last_seen(causes: None) -> None:
    first = dead("test.causes.a", "HTTP 503 from /articles/1")
    dead("test.causes.b", "HTTP 503 from /articles/2")
    newest = dead("test.causes.a", "HTTP 503 from /articles/3")
    other = dead("test.causes.a", "connection refused by 10.0.0.7")

    groups = listings.dead_groups(DeadFilter())

    assert [(g.count, g.workflows) for g in groups] == [
        (3, ["test.causes.a", "test.causes.b"]),
        (1, ["test.causes.a"]),
    ]
    big, small = groups
    assert big.example.task_id == newest.pk
    assert big.first_seen == dead_step(first).finished_at
    assert big.last_seen == dead_step(newest).finished_at
    assert big.message == "HTTP 503 from /articles/<n>"
    assert small.example.task_id == other.pk
    assert small.message == "connection refused by <n>.<n>"
    # Narrowed like the list: by workflow.
    only_b = listings.dead_groups(DeadFilter(workflow="test.causes.b"))
    assert [(g.fingerprint, g.count) for g in only_b] == [(big.fingerprint, 1)]


@pytest.mark.django_db
def test_grouping_reads_the_same_few_queries_however_many_causes(causes: None) -> None:
    for n in range(6):
        dead(message=f"cause number {'abcdef'[n]} happened")

    with CaptureQueriesContext(connection) as queries:
        groups = listings.dead_groups(DeadFilter())

    assert len(groups) == 6
    assert len(queries) == 2


@pytest.mark.django_db
def test_the_groups_page_links_each_cause_to_its_dead_letters(causes: None, oncall: User) -> None:
    dead(message="HTTP 503 from /articles/1")
    dead(message="HTTP 503 from /articles/2")
    lone = dead(message="timeout after 30 s")
    client = login(oncall)

    page = client.get(reverse("console:dead_groups")).content.decode()

    cause = dead_step(lone).error_fingerprint
    assert f"/dead/?fingerprint={cause}" in page
    assert "HTTP 503 from /articles/&lt;n&gt;" in page
    listed = client.get(reverse("console:dead"), {"fingerprint": cause}).content.decode()
    assert f"#{lone.pk}</a>" in listed
    assert "Showing one cause" in listed
    assert "/articles/1" not in listed


@pytest.mark.django_db
def test_a_malformed_cause_is_refused_naming_the_field(oncall: User) -> None:
    client = login(oncall)
    for url in (reverse("console:dead"), reverse("console:dead_groups")):
        response = client.get(url, {"fingerprint": "not-a-cause"})
        assert response.status_code == 400
        assert "fingerprint: the 16 hexadecimal digits of a cause" in response.content.decode()


@pytest.mark.django_db
def test_a_bulk_action_on_a_group_acts_on_that_group_only(causes: None, oncall: User) -> None:
    ours = [dead(message=f"HTTP 503 from /articles/{n}") for n in range(3)]
    theirs = dead(message="connection refused")
    cause = dead_step(ours[0]).error_fingerprint
    client = login(oncall)
    form = {"action": "cancel", "reason": "the remote is gone for good", "fingerprint": cause}

    preview = client.post(reverse("console:dead_bulk"), form, headers=HTMX)
    page = preview.content.decode()
    assert "Plan: Cancel 3 tasks" in page
    assert f'cause <span class="mono">{cause}</span>' in page
    token = preview.context["plan"].token()
    confirmed = client.post(
        reverse("console:dead_bulk"), {**form, "plan": token, "confirm": "1"}, headers=HTMX
    )

    assert confirmed.status_code == 200
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert [statuses[t.pk] for t in ours] == [TaskStatus.CANCELLED] * 3
    assert statuses[theirs.pk] == TaskStatus.DEAD
    # A confirm whose cause differs from the preview's is refused.
    again = [dead(message="HTTP 503 from /articles/9")]
    preview = client.post(reverse("console:dead_bulk"), form, headers=HTMX)
    refused = client.post(
        reverse("console:dead_bulk"),
        {
            **form,
            "fingerprint": dead_step(theirs).error_fingerprint,
            "plan": preview.context["plan"].token(),
            "confirm": "1",
        },
        headers=HTMX,
    )
    assert refused.status_code == 409
    assert Task.objects.get(pk=again[0].pk).status == TaskStatus.DEAD


# --- the effects ledger before a rerun ------------------------------------------------------


@pytest.mark.django_db
def test_the_ledger_tells_writes_that_happened_from_writes_in_doubt(causes: None) -> None:
    clean = dead(message="plain failure")
    applied = dead(message="after writing", writes=["publish"])
    doubtful = dead(message="unused", writes=["publish"], hangs=["notify"])

    summary = selectors.dead_step_ledger([clean.pk, applied.pk, doubtful.pk])

    assert summary.in_doubt == [doubtful.pk]
    assert summary.applied == [applied.pk, doubtful.pk]
    row = selectors.task_detail(doubtful).dead_row
    assert row is not None
    assert [(e.name, e.applied) for e in row.effects] == [("publish", True), ("notify", False)]
    assert Effect.objects.get(step=row.step, status=Effect.Status.STARTED).key.endswith(":notify")


@pytest.mark.django_db
def test_the_task_page_says_what_a_rerun_repeats(causes: None, oncall: User) -> None:
    task = dead(message="unused", writes=["publish"], hangs=["notify"])

    page = login(oncall).get(reverse("console:task", args=[task.pk])).content.decode()

    assert "External writes of this step" in page
    assert "<strong>happened</strong>; running the step again skips it by its key" in page
    assert "<strong>in doubt</strong>" in page
    assert "calls it again with the same key" in page


@pytest.mark.django_db
def test_a_bulk_preview_counts_the_tasks_with_writes_in_doubt_before_confirming(
    causes: None, oncall: User
) -> None:
    dead(message="boom 1")
    doubtful = dead(message="boom 2", writes=["publish"], hangs=["notify"])
    dead(message="boom 3", writes=["publish"])
    client = login(oncall)

    preview = client.post(
        reverse("console:dead_bulk"),
        {"action": "resolve_retry", "reason": "the remote is back", "workflow": "test.causes.a"},
        headers=HTMX,
    ).content.decode()

    assert "<strong>1 task has external writes in doubt</strong>" in preview
    assert f'<a href="/tasks/{doubtful.pk}/">#{doubtful.pk}</a>' in preview
    assert "they will be called again." in preview
    assert "2 tasks have external writes that happened: a rerun skips them by their key." in preview
    # Nothing changed by the preview.
    assert Task.objects.filter(status=TaskStatus.DEAD).count() == 3


# --- the timeline and the step's error --------------------------------------------------------


def test_a_payload_change_lists_each_field_with_secrets_redacted() -> None:
    changes = payload_changes(
        {"title": "Old", "tags": ["a", "b"], "api_token": "s3cret", "same": 1},
        {"title": "New", "tags": ["a"], "api_token": "other", "same": 1, "added": None},
    )

    assert [(c.path, c.before, c.after) for c in changes] == [
        ("added", "", "null"),
        ("api_token", "•••redacted•••", "•••redacted•••"),
        ("tags[1]", '"b"', ""),
        ("title", '"Old"', '"New"'),
    ]


@pytest.mark.django_db
def test_the_timeline_shows_a_redrives_payload_change_and_a_resolves_outcome(
    causes: None, oncall: User
) -> None:
    task = dead(message="bad title", title="Old", api_token="s3cret-value")
    services.redrive(
        task,
        actor=oncall,
        reason="fix the title",
        payload={"message": "bad title", "title": "New", "api_token": "rotated-value"},
    )
    runner.run_task_steps(task)
    services.resolve(
        Task.objects.get(pk=task.pk), actor=oncall, reason="sent by hand", outcome="done"
    )

    page = login(oncall).get(reverse("console:task", args=[task.pk])).content.decode()

    assert "The payload this redrive changed" in page
    assert "<del>&quot;Old&quot;</del>" in page
    assert "<ins>&quot;New&quot;</ins>" in page
    assert "s3cret-value" not in page
    assert "rotated-value" not in page
    assert "outcome: it happened (marked done)" in page


@pytest.mark.django_db
def test_a_steps_error_shows_only_while_it_is_the_steps_state(causes: None) -> None:
    task = dead(message="boom")
    assert selectors.task_detail(task).steps[0].error_is_current

    services.redrive(task, actor="cli:oncall", reason="try again")
    assert not selectors.task_detail(task).steps[0].error_is_current

    runner.run_task_steps(task)
    row = selectors.task_detail(task).steps[0]
    assert row.step.status == StepStatus.DEAD and row.error_is_current
    services.resolve(
        Task.objects.get(pk=task.pk), actor="cli:oncall", reason="by hand", outcome="done"
    )
    row = selectors.task_detail(task).steps[0]
    assert row.step.status == StepStatus.SUCCEEDED
    assert row.step.error_class  # still stored ...
    assert not row.error_is_current  # ... but not shown as its state


@pytest.mark.django_db
def test_the_migration_gives_the_steps_already_dead_their_cause(causes: None) -> None:
    migration = importlib.import_module("tasks_app.migrations.0015_dead_letter_causes")
    task = dead("test.causes.b", "HTTP 503 from /articles/5")
    Step.objects.filter(task=task).update(error_fingerprint="", dead_workflow="")

    migration.backfill(django_apps, connection.schema_editor())

    step = dead_step(task)
    assert step.error_fingerprint == fingerprint(step.error_class, step.last_error)
    assert step.dead_workflow == "test.causes.b"


@pytest.mark.django_db
def test_each_cause_counts_the_dead_letters_its_list_shows(causes: None) -> None:
    dead("test.causes.a", "HTTP 503 from /articles/1")
    dead("test.causes.b", "HTTP 503 from /articles/2")
    dead("test.causes.a", "connection refused")
    cancelled = dead("test.causes.a", "HTTP 503 from /articles/3")
    services.cancel(cancelled, actor="cli:oncall", reason="gone for good")
    redriven = dead("test.causes.b", "connection refused")
    services.redrive(redriven, actor="cli:oncall", reason="try again")

    groups = listings.dead_groups(DeadFilter())

    assert sum(group.count for group in groups) == 3
    for group in groups:
        listed = listings.dead_letter_page(DeadFilter(fingerprint=group.fingerprint), after=None)
        assert len(listed.rows) == group.count
        assert sorted({step.task.workflow for step in listed.rows}) == group.workflows
