"""The dead letters as the API reads them: the console's list (its filters, newest task
first, a page at a time) with errors redacted, and grouped by cause, each group linking
to its own dead letters."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User

from tasks_app.models import Step
from tests.api_support import call, conforms, token_for
from tests.factories import dead_task, noop, unknown_outcome

pytestmark = pytest.mark.django_db

DEAD = "/api/v1/dead/"
GROUPS = "/api/v1/dead/groups/"


@pytest.fixture
def secret(oncall: User) -> str:
    return token_for(oncall, "oncall")


def base() -> str:
    return str(django_settings.CONSOLE_BASE_URL).rstrip("/")


def read(secret: str, path: str, template: str) -> Any:
    answer = call("GET", path, secret)
    assert answer.status_code == 200, answer.content
    return conforms(answer, "GET", template)


def test_it_lists_each_dead_step_with_its_task_and_cause(secret: str) -> None:
    task = dead_task()
    noop()  # not dead: not listed
    step = Step.objects.get(task=task)
    (row,) = read(secret, DEAD, DEAD)["items"]
    assert row == {
        "task_id": task.pk,
        "workflow": "demo.flaky",
        "queue": "default",
        "step_id": step.pk,
        "position": step.position,
        "kind": step.kind,
        "attempts": 1,
        "max_attempts": step.max_attempts,
        "error_class": step.error_class,
        "message": "tasks_app.exceptions.PermanentError: failing on claim 1 of 1 (fail_first)",
        "last_error": step.last_error,
        "fingerprint": step.error_fingerprint,
        "died_at": row["died_at"],
        "url": f"{base()}/tasks/{task.pk}/",
    }
    assert row["died_at"] is not None and step.error_fingerprint


def test_an_error_quoting_a_secret_is_listed_without_it(secret: str) -> None:
    task = dead_task()
    Step.objects.filter(task=task).update(
        last_error="PermanentError: remote refused {'api_token': 'tok-5ecret', 'n': 1}"
    )
    answer = call("GET", DEAD, secret)
    assert "tok-5ecret" not in answer.content.decode()
    (row,) = answer.json()["items"]
    assert "•••redacted•••" in row["last_error"] and "'n': 1" in row["last_error"]
    assert row["message"] == row["last_error"]


def test_the_consoles_filters_narrow_the_list(secret: str) -> None:
    permanent, unknown = dead_task(), unknown_outcome()
    by_class = Step.objects.get(task=unknown).error_class
    by_cause = Step.objects.get(task=permanent).error_fingerprint
    assert [r["task_id"] for r in read(secret, DEAD, DEAD)["items"]] == [unknown.pk, permanent.pk]
    chosen = read(secret, f"{DEAD}?error_class={by_class}", DEAD)["items"]
    assert [r["task_id"] for r in chosen] == [unknown.pk]
    chosen = read(secret, f"{DEAD}?fingerprint={by_cause}", DEAD)["items"]
    assert [r["task_id"] for r in chosen] == [permanent.pk]
    assert read(secret, f"{DEAD}?workflow=demo.noop", DEAD)["items"] == []


def test_it_pages_by_keyset_after(secret: str, settings: Any) -> None:
    settings.CONSOLE_PAGE_SIZE = 2
    ids = [dead_task({"error": "permanent", "fail_first": 1, "seed": n}).pk for n in range(3)]
    first = read(secret, DEAD, DEAD)
    assert [r["task_id"] for r in first["items"]] == ids[:0:-1]
    assert first["next_after"] == ids[1]
    last = read(secret, f"{DEAD}?after={first['next_after']}", DEAD)
    assert [r["task_id"] for r in last["items"]] == ids[:1]
    assert last["next_after"] is None


def test_the_groups_count_each_cause_and_link_to_its_dead_letters(secret: str) -> None:
    same = [dead_task({"error": "permanent", "fail_first": 1, "seed": n}).pk for n in range(2)]
    other = unknown_outcome().pk
    groups = read(secret, GROUPS, GROUPS)
    assert groups["total"] == 3
    largest, smallest = groups["items"]
    assert (largest["count"], smallest["count"]) == (2, 1)
    assert largest["workflows"] == ["demo.flaky"]
    assert largest["example_task_id"] == max(same)
    assert largest["first_seen"] <= largest["last_seen"]
    cause = largest["fingerprint"]
    assert largest["api_url"] == f"{base()}{DEAD}?fingerprint={cause}"
    assert largest["url"] == f"{base()}/dead/?fingerprint={cause}"
    listed = read(secret, largest["api_url"].removeprefix(base()), DEAD)
    assert sorted(r["task_id"] for r in listed["items"]) == same
    listed = read(secret, smallest["api_url"].removeprefix(base()), DEAD)
    assert [r["task_id"] for r in listed["items"]] == [other]


def test_a_groups_link_keeps_the_filter_it_was_read_with(secret: str) -> None:
    dead_task()
    (group,) = read(secret, f"{GROUPS}?workflow=demo.flaky", GROUPS)["items"]
    assert group["api_url"].endswith(
        f"{DEAD}?workflow=demo.flaky&fingerprint={group['fingerprint']}"
    )


def test_a_groups_message_shows_no_secret(secret: str) -> None:
    task = dead_task()
    Step.objects.filter(task=task).update(last_error="PermanentError: password=hunter2 refused")
    answer = call("GET", GROUPS, secret)
    assert answer.status_code == 200
    assert "hunter2" not in answer.content.decode()


def test_the_groups_are_not_paged(secret: str) -> None:
    answer = call("GET", f"{GROUPS}?after=5", secret)
    assert answer.status_code == 400
    assert (answer.json()["field"], answer.json()["rule"]) == ("after", "unexpected")
