"""The Schedules pages: every stored schedule with its state, timing, workflow and policy, its
next runs in the reader's time zone and in UTC, its last runs with their tasks and its
missed slots, removed ones last; and on a schedule's own page on-call's actions (pause,
resume and backfill previewed then confirmed, run now), each with a reason and an audited
event. Refusals change nothing: bad input answers 400 naming the field, a stale or spent
plan 409, and a reader without the permission 403 with nothing of the schedule."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.core import signing
from django.test import Client

from console.schedule_plans import SALT
from tasks_app.db.clock import db_now
from tasks_app.engine.schedules import schedules, slot_key, slot_text
from tasks_app.models import Event, EventKind, RunOutcome, ScheduleRun, StoredSchedule, Task
from tasks_app.operations import schedules as schedule_actions
from tests.console_support import HTMX, body, login
from tests.rows import action_rows
from tests.schedules_page_support import (
    HOURLY,
    NIGHTLY,
    QUARTERLY,
    confirm,
    declared,
    iso,
    missed_for,
    paused_for,
    plan_of,
    request_id_of,
    store,
)

pytestmark = pytest.mark.django_db

NAME = HOURLY.name
PAGE = f"/schedules/{NAME}/"
BERLIN = ZoneInfo("Europe/Berlin")
BERLIN_LOCAL = re.compile(r"\d{4}-\d\d-\d\d 02:30 CES?T")
BERLIN_IN_UTC = re.compile(r"\d{4}-\d\d-\d\d 0[01]:30 UTC")


@pytest.fixture(autouse=True)
def stored(db: None) -> Iterator[list[StoredSchedule]]:
    with declared(HOURLY, NIGHTLY, QUARTERLY) as rows:
        yield rows


def rows() -> tuple[Any, ...]:
    """Every row a schedule's action could change."""
    return (
        *action_rows(),
        list(StoredSchedule.objects.order_by("name").values_list()),
        list(ScheduleRun.objects.order_by("pk").values_list()),
    )


def card(page: str, name: str) -> str:
    """A schedule's card on the list."""
    start = page.index(f'id="schedule-{name}"')
    end = page.find('<section id="schedule-', start + 1)
    return page[start : end if end > 0 else None]


def in_berlin(client: Client) -> Client:
    client.cookies["tz"] = "Europe/Berlin"
    return client


# --- reading ---------------------------------------------------------------------------------


def test_the_list_shows_each_schedule_with_its_timing_workflow_policy_and_next_runs(
    auditor: User,
) -> None:
    page = body(login(auditor).get("/schedules/"))

    hourly = card(page, NAME)
    assert "cron 0 * * * * (UTC)" in hourly
    assert '<a href="/workflows/demo.noop/">demo.noop</a>' in hourly
    assert "skip: missed slots are recorded, not run; a slot counts as missed when" in hourly
    assert "when a tick finds it past its time" in hourly
    assert '<span class="badge status-succeeded">active</span>' in hourly
    assert len(re.findall(r"<tr><td><time datetime=", hourly)) == 5
    assert "No run yet." in hourly
    assert "cron 30 2 * * * (Europe/Berlin)" in card(page, NIGHTLY.name)
    quarter = card(page, QUARTERLY.name)
    assert "every 15 min" in quarter
    assert "each: each missed slot runs, at most the newest 3" in quarter
    # Code and the stored schedules agree: nothing to sync.
    assert "sync_schedules</code> stores them" not in page
    # A reader without the permission is offered no action.
    assert "backfill or run" not in page


def test_next_runs_show_in_the_readers_time_zone_and_in_utc(oncall: User) -> None:
    berlin = html.unescape(body(in_berlin(login(oncall)).get("/schedules/")))
    utc = html.unescape(body(login(oncall).get("/schedules/")))

    assert 'data-time-zone="Europe/Berlin"' in berlin
    assert "Times on this page are in Europe/Berlin, your browser's time zone" in berlin
    nightly = card(berlin, NIGHTLY.name)
    assert '<th scope="col">Europe/Berlin</th><th scope="col">UTC</th>' in nightly
    assert len(BERLIN_LOCAL.findall(nightly)) == 5
    assert len(BERLIN_IN_UTC.findall(nightly)) == 5

    assert "your browser has not said its time zone" in utc
    nightly = card(utc, NIGHTLY.name)
    assert '<th scope="col">UTC</th></tr>' in nightly
    assert not BERLIN_LOCAL.search(nightly)
    assert len(BERLIN_IN_UTC.findall(nightly)) == 5
    # The hourly one's slots are on the hour in both zones.
    assert re.search(r"\d\d:00 CES?T</time></td><td class=\"muted\">[^<]* \d\d:00 UTC", berlin)


@pytest.mark.parametrize("cookie", ["Mars/Olympus", "../../etc/passwd", "<b>x</b>", "a" * 200])
def test_a_zone_the_server_does_not_know_shows_utc_and_says_so(oncall: User, cookie: str) -> None:
    client = login(oncall)
    client.cookies["tz"] = cookie
    page = body(client.get("/schedules/"))
    assert 'data-time-zone="UTC"' in page
    assert "Times on this page are in UTC: your browser&#x27;s time zone" in page
    assert "<b>x</b>" not in page


def test_removed_schedules_come_last_marked_removed_with_their_history(oncall: User) -> None:
    task = schedule_actions.run_now(NAME, actor="cli:test", reason="before removal").task
    schedules.unregister(NAME)
    store(NIGHTLY, QUARTERLY)

    page = body(login(oncall).get("/schedules/"))

    names = re.findall(r'<section id="schedule-([^"]+)"', page)
    assert names == [NIGHTLY.name, QUARTERLY.name, NAME]
    removed = card(page, NAME)
    assert '<span class="badge status-cancelled">removed</span>' in removed
    assert "Removed from code" in removed and "its history stays" in removed
    assert f'<a href="/tasks/{task.pk}/">#{task.pk}</a>' in removed
    assert "None: it was removed from code." in removed
    assert "backfill or run" not in removed
    detail = body(login(oncall).get(PAGE))
    assert 'id="actions"' not in detail
    refused = login(oncall).post(f"{PAGE}pause/", {"reason": "x"})
    assert refused.status_code == 409
    assert "was removed from code" in body(refused)


def test_a_paused_schedule_says_who_why_when_and_the_slots_waiting(oncall: User) -> None:
    paused_for(NAME, 3, reason="the warehouse is migrating")
    page = body(login(oncall).get("/schedules/"))

    hourly = card(page, NAME)
    assert '<span class="badge status-waiting_approval">paused</span>' in hourly
    assert "Paused by <strong>cli:test</strong>" in hourly
    assert "“the warehouse is migrating”" in hourly
    assert "3 slots came due while it was paused" in hourly
    assert "None of them runs until someone resumes it." in hourly


def test_last_runs_link_their_tasks_and_missed_slots_are_listed(oncall: User) -> None:
    missed = missed_for(NAME, 3)
    task = schedule_actions.run_now(NAME, actor="cli:test", reason="catch up").task

    hourly = card(body(login(oncall).get("/schedules/")), NAME)

    assert len(missed) == 3
    assert 'Missed slots <span class="muted">(3 in all)</span>' in hourly
    for slot in missed:
        assert f'<time datetime="{iso(slot)}">' in hourly
    assert f'<a href="/tasks/{task.pk}/">#{task.pk}</a>' in hourly
    assert '<span class="badge status-pending">pending</span>' in hourly
    assert '<span class="badge status-running">Run now</span>' in hourly


def test_changes_in_code_not_yet_stored_are_named_with_the_command(oncall: User) -> None:
    schedules.unregister(NAME)
    schedules.register(replace(HOURLY, cron="15 * * * *"))
    try:
        page = body(login(oncall).get("/schedules/"))
    finally:
        schedules.unregister(NAME)
        schedules.register(HOURLY)

    assert "Code declares changes not stored yet:" in page
    assert f"{NAME}: changed cron" in page
    assert "<code>manage.py sync_schedules</code>" in page
    assert f"Code declares {NAME}: changed cron, not stored yet" in card(page, NAME)


def test_the_schedule_page_offers_its_actions_to_oncall_only(
    oncall: User, auditor: User, editor: User
) -> None:
    mine = body(login(oncall).get(PAGE))
    assert f'action="{PAGE}pause/"' in mine and f'action="{PAGE}run-now/"' in mine
    assert f'action="{PAGE}backfill/"' in mine
    assert "An hourly job of the Schedules page&#x27;s tests." in mine
    for reader in (auditor, editor):
        theirs = body(login(reader).get(PAGE))
        assert "An hourly job of the Schedules page&#x27;s tests." in theirs
        assert 'id="actions"' not in theirs and "/pause/" not in theirs
    assert login(oncall).get("/schedules/no.such/").status_code == 404


# --- refusals --------------------------------------------------------------------------------

ACTIONS = {
    "pause": {"reason": "incident"},
    "resume": {"reason": "over", "mode": "each", "confirm": "1", "plan": "x"},
    "backfill": {"reason": "catch up", "since": "2026-01-01T00:00Z", "until": "2026-01-02T00:00Z"},
    "run-now": {"reason": "now", "request_id": "abcdefgh"},
}


@pytest.mark.parametrize("role", ["auditor", "editor", "outsider"])
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_action_is_refused_for_readers_without_the_permission(
    request: pytest.FixtureRequest, role: str, action: str
) -> None:
    paused_for(NAME, 2)
    before = rows()

    for headers in ({}, HTMX):
        response = login(request.getfixturevalue(role)).post(
            f"{PAGE}{action}/", ACTIONS[action], headers=headers
        )
        assert response.status_code == 403
        assert "Not permitted" in body(response)
        for shown in (NAME, "hourly", "<table", "paused for the test"):
            assert shown not in body(response)
    assert rows() == before


def test_an_action_without_the_csrf_token_is_refused(oncall: User) -> None:
    before = rows()
    response = login(oncall, enforce_csrf_checks=True).post(f"{PAGE}pause/", {"reason": "x"})
    assert response.status_code == 403
    assert rows() == before


@pytest.mark.parametrize(
    ("action", "fields", "words"),
    [
        ("pause", {"reason": "  "}, "reason: is required and may not be empty"),
        ("run-now", {"reason": ""}, "reason: is required and may not be empty"),
        ("run-now", {"reason": "x", "request_id": "no!"}, "request_id: 8 to 64 of"),
        ("resume", {"reason": "", "mode": "each"}, "reason: is required"),
        ("resume", {"reason": "x", "mode": "sometimes"}, "mode: one of policy, skip"),
        ("backfill", {"reason": "", "since": "2026-01-01T00:00"}, "reason: is required"),
        ("backfill", {"reason": "x", "since": "yesterday"}, "since: a date and time"),
        (
            "backfill",
            {"reason": "x", "since": "2026-01-02T00:00Z", "until": "2026-01-01T00:00Z"},
            "until: must not be before since",
        ),
    ],
)
def test_bad_input_is_refused_in_place_naming_the_field(
    oncall: User, action: str, fields: dict[str, str], words: str
) -> None:
    if action == "resume":
        paused_for(NAME, 2)
    elif action == "backfill":
        missed_for(NAME, 2)
        fields = {
            "until": iso(StoredSchedule.objects.get(name=NAME).next_slot - timedelta(hours=1)),
            **fields,
        }
    before = rows()

    response = login(oncall).post(f"{PAGE}{action}/", fields, headers=HTMX)

    assert response.status_code == 400
    page = body(response)
    assert words in page
    assert 'class="field-error" role="alert"' in page
    assert "HX-Retarget" not in response  # the card, in place
    assert page.lstrip().startswith('<section id="schedule-card"')
    assert rows() == before


# --- pause, resume, backfill, run now --------------------------------------------------------


def test_oncall_pauses_with_a_reason_and_the_audit_log_lists_it(
    oncall: User, auditor: User
) -> None:
    response = login(oncall).post(f"{PAGE}pause/", {"reason": "warehouse down"}, headers=HTMX)

    assert response.status_code == 200
    assert response["HX-Reswap"] == "outerHTML show:top"
    page = body(response)
    assert "Schedule page.hourly paused" in page
    assert '<span class="badge status-waiting_approval">paused</span>' in page
    assert f'action="{PAGE}resume/"' in page and f'action="{PAGE}pause/"' not in page
    row = StoredSchedule.objects.get(name=NAME)
    assert (row.paused_by, row.paused_reason) == (oncall.username, "warehouse down")
    audit = body(login(auditor).get("/audit/"))
    entry = audit[audit.index('data-kind="schedule_paused"') :].split("</tr>")[0]
    assert "Schedule paused" in entry and f'href="{PAGE}">{NAME}</a>' in entry
    assert "warehouse down" in entry
    assert f"<td>{oncall.username}</td>" in audit


def test_a_plain_post_is_answered_with_a_redirect_to_the_page(oncall: User) -> None:
    client = login(oncall)
    response = client.post(f"{PAGE}pause/", {"reason": "warehouse down"})
    assert (response.status_code, response["Location"]) == (302, PAGE)
    assert "Schedule page.hourly paused" in body(client.get(PAGE))


def test_a_resume_applies_exactly_the_slots_its_preview_showed(oncall: User) -> None:
    paused_for(NAME, 3)
    client = login(oncall)
    fields = {"mode": "each", "reason": "warehouse back"}

    preview = client.post(f"{PAGE}resume/", fields, headers=HTMX)

    assert preview.status_code == 200
    plan = signing.loads(plan_of(preview), salt=SALT)["plan"]
    assert len(plan["enqueue"]) == 3 and plan["missed"] == []
    times = ", ".join(slot[11:16] for slot in plan["enqueue"])
    assert f"Resuming enqueues 3 runs (UTC): {times}." in body(preview)
    assert "Nothing has changed yet." in body(preview)
    assert StoredSchedule.objects.get(name=NAME).paused_at is not None
    assert not ScheduleRun.objects.exists()

    done = client.post(f"{PAGE}resume/", {**fields, "plan": plan_of(preview), "confirm": "1"})

    assert done.status_code == 302
    runs = ScheduleRun.objects.filter(schedule=NAME).order_by("slot")
    assert [slot_text(run.slot) for run in runs] == plan["enqueue"]
    assert all(run.outcome == RunOutcome.ENQUEUED and run.task_id for run in runs)
    keys = set(Task.objects.values_list("idempotency_key", flat=True))
    assert keys == {slot_key(NAME, run.slot) for run in runs}
    assert StoredSchedule.objects.get(name=NAME).paused_at is None
    event = Event.objects.get(kind=EventKind.SCHEDULE_RESUMED)
    assert (event.actor, event.reason, event.data["enqueued"]) == (
        oncall.username,
        "warehouse back",
        plan["enqueue"],
    )


def test_a_resume_by_policy_records_the_missed_slots_and_runs_none(oncall: User) -> None:
    paused_for(NAME, 2)
    preview = login(oncall).post(f"{PAGE}resume/", {"reason": "back"}, headers=HTMX)
    assert "Resuming enqueues no run. 2 missed slot(s) are recorded and not run." in body(preview)
    assert 'data-plan="missed"' in body(preview) and 'data-plan="enqueue"' not in body(preview)


def test_change_goes_back_to_the_form_as_it_was(oncall: User) -> None:
    paused_for(NAME, 2)
    fields = {"mode": "latest", "reason": "back", "change": "1", "plan": "x"}
    page = body(login(oncall).post(f"{PAGE}resume/", fields, headers=HTMX))
    assert '<option value="latest" selected>' in page
    assert "Preview the resume" in page and "Nothing has changed yet." not in page


def test_a_stale_plan_is_refused_with_409_and_changes_nothing(oncall: User) -> None:
    paused_for(NAME, 3)
    client = login(oncall)
    token = plan_of(client.post(f"{PAGE}resume/", {"reason": "back"}, headers=HTMX))
    # The schedule moves on before the confirm: it is resumed and paused again.
    other = schedule_actions.plan_resume(NAME)
    schedule_actions.resume(NAME, actor="cli:test", reason="someone else", plan=other)
    schedule_actions.pause(NAME, actor="cli:test", reason="again")
    before = rows()

    response = client.post(f"{PAGE}resume/", {"reason": "back", "plan": token, "confirm": "1"})

    assert response.status_code == 409
    assert "changed since the preview: preview again" in body(response)
    assert "Nothing changed" in body(response)
    assert rows() == before


def test_a_plan_is_applied_once(oncall: User) -> None:
    paused_for(NAME, 2)
    client = login(oncall)
    fields = {"mode": "each", "reason": "back"}
    token = plan_of(client.post(f"{PAGE}resume/", fields, headers=HTMX))
    assert (
        client.post(f"{PAGE}resume/", {**fields, "plan": token, "confirm": "1"}).status_code == 302
    )
    schedule_actions.pause(NAME, actor="cli:test", reason="again")
    before = rows()

    again = client.post(f"{PAGE}resume/", {**fields, "plan": token, "confirm": "1"})

    assert again.status_code == 409
    assert "already confirmed and applied" in body(again)
    assert rows() == before


@pytest.mark.parametrize(
    ("token", "words"),
    [("forged", "carries no preview of a resume"), (None, "made by someone else")],
)
def test_a_plan_not_made_for_this_confirm_is_refused(
    oncall: User, superuser: User, token: str | None, words: str
) -> None:
    paused_for(NAME, 2)
    if token is None:
        token = plan_of(login(superuser).post(f"{PAGE}resume/", {"reason": "x"}, headers=HTMX))
    before = rows()
    response = login(oncall).post(f"{PAGE}resume/", {"reason": "x", "plan": token, "confirm": "1"})
    assert response.status_code == 409
    assert words in body(response)
    assert rows() == before


def test_a_backfill_reads_local_times_in_the_readers_zone_and_enqueues_what_it_showed(
    oncall: User,
) -> None:
    missed = missed_for(NAME, 3)
    client = in_berlin(login(oncall))
    since, until = (
        slot.astimezone(BERLIN).strftime("%Y-%m-%dT%H:%M") for slot in (missed[0], missed[-1])
    )
    fields = {"since": since, "until": until, "zone": "Europe/Berlin", "reason": "catch up"}

    preview = client.post(f"{PAGE}backfill/", fields, headers=HTMX)

    assert preview.status_code == 200, body(preview)[:2000]
    plan = signing.loads(plan_of(preview), salt=SALT)["plan"]
    assert plan["enqueue"] == [slot_text(slot) for slot in missed]
    for slot in missed:
        assert f'<time datetime="{iso(slot)}">' in body(preview)
    done = confirm(client, f"{PAGE}backfill/", **fields)
    assert done.status_code == 302
    runs = ScheduleRun.objects.filter(schedule=NAME).order_by("slot")
    assert [(run.slot, run.outcome, bool(run.task_id)) for run in runs] == [
        (slot, RunOutcome.ENQUEUED, True) for slot in missed
    ]
    event = Event.objects.get(kind=EventKind.SCHEDULE_BACKFILLED)
    assert (event.actor, event.reason) == (oncall.username, "catch up")


def test_a_backfill_takes_times_with_their_zone(oncall: User) -> None:
    missed = missed_for(NAME, 2)
    fields = {"since": iso(missed[0]), "until": iso(missed[-1]), "reason": "catch up"}
    done = confirm(login(oncall), f"{PAGE}backfill/", **fields)
    assert done.status_code == 302
    assert ScheduleRun.objects.filter(outcome=RunOutcome.ENQUEUED).count() == 2


@pytest.mark.parametrize("later", [0, 2], ids=["same second", "two seconds later"])
def test_run_now_sent_twice_with_one_request_id_starts_one_task(
    oncall: User, monkeypatch: pytest.MonkeyPatch, later: int
) -> None:
    client = login(oncall)
    request_id = request_id_of(client.get(PAGE))
    fields = {"reason": "the report is needed now", "request_id": request_id}
    # The run's moment is in its payload (the slot field): the clock decides whether the
    # second send finds the same payload or another one under its key.
    now = db_now().replace(microsecond=0)
    monkeypatch.setattr(schedule_actions, "db_now", lambda: now)
    first = client.post(f"{PAGE}run-now/", fields, headers=HTMX)
    monkeypatch.setattr(schedule_actions, "db_now", lambda: now + timedelta(seconds=later))
    second = client.post(f"{PAGE}run-now/", fields, headers=HTMX)

    task = Task.objects.get()
    assert task.idempotency_key == f"schedule:{NAME}:now:{request_id}"
    assert f'task <a href="/tasks/{task.pk}/">#{task.pk}</a> enqueued.' in body(first)
    assert second.status_code == 200
    assert "already run by this request: task" in body(second)
    assert f'<a href="/tasks/{task.pk}/">#{task.pk}</a>' in body(second)
    assert ScheduleRun.objects.get().task_id == task.pk
    assert Event.objects.filter(kind=EventKind.SCHEDULE_RUN_NOW).count() == 1
    # The fresh form after it asks for a new run.
    assert request_id_of(first) != request_id


def test_without_scripts_a_preview_is_the_whole_page_and_its_confirm_a_redirect(
    oncall: User,
) -> None:
    missed = missed_for(NAME, 2)
    client = login(oncall)
    fields = {"since": iso(missed[0]), "until": iso(missed[-1]), "reason": "catch up"}

    preview = client.post(f"{PAGE}backfill/", fields)

    assert preview.status_code == 200
    assert body(preview).startswith("<!doctype html>")
    assert "Backfilling enqueues 2 runs (UTC)" in body(preview)
    done = client.post(f"{PAGE}backfill/", {**fields, "plan": plan_of(preview), "confirm": "1"})
    assert (done.status_code, done["Location"]) == (302, PAGE)
    assert "backfilled: 2 run(s) enqueued." in body(client.get(PAGE))


def test_a_backfill_finding_nothing_to_enqueue_offers_no_confirm(oncall: User) -> None:
    missed = missed_for(NAME, 2)
    schedule_actions.backfill(
        NAME,
        actor="cli:test",
        reason="done before",
        plan=schedule_actions.plan_backfill(NAME, since=missed[0], until=missed[-1]),
    )
    fields = {"since": iso(missed[0]), "until": iso(missed[-1]), "reason": "again"}
    page = body(login(oncall).post(f"{PAGE}backfill/", fields, headers=HTMX))
    assert "Backfilling enqueues no run." in page
    assert 'name="confirm"' not in page and 'name="change"' in page


def test_a_refusal_shows_although_the_form_it_came_from_is_gone(oncall: User) -> None:
    # Someone resumed it before this preview was asked for: the page offers a pause now.
    response = login(oncall).post(f"{PAGE}resume/", {"reason": "back"}, headers=HTMX)
    assert response.status_code == 409
    assert f"Nothing changed: schedule {NAME} is not paused." in body(response)
    assert "Preview the resume" not in body(response)
