"""The audit log: its filters, its CSV export of the same rows with secrets hidden and no
cell a formula, a bad filter refused naming its field, and bulk actions by their plan."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, User

from tasks_app import services
from tasks_app.models import Event, Step
from tests.console_support import HTMX, body, confirm_bulk, export_rows, login
from tests.factories import dead_task, enqueued, noop

pytestmark = pytest.mark.django_db


def test_the_audit_log_filters_and_exports_the_same_rows_as_csv(
    auditor: User, oncall: User
) -> None:
    task = dead_task()
    services.redrive(task, actor=oncall, reason="remote fixed")
    services.pause_queue("default", actor=oncall, reason="incident 7")
    client = login(auditor)
    page = body(client.get("/audit/", {"actor": oncall.username}))
    assert "remote fixed" in page and "incident 7" in page
    assert "cli:producer" not in page
    only_pauses = body(client.get("/audit/", {"kind": "queue_paused"}))
    assert "incident 7" in only_pauses and "remote fixed" not in only_pauses

    rows = export_rows(client, actor=oncall.username)
    assert rows[0][:4] == ["id", "created_at", "kind", "actor"]
    assert [row[2] for row in rows[1:]] == ["queue_paused", "redriven"]
    assert all(row[3] == oncall.username for row in rows[1:])


SECRETS = {"password": "hunter2", "api_token": "abc", "nested": [{"Client-Secret": "x"}]}


def test_the_audit_export_keeps_the_secrets_of_a_redrive_with_changes_hidden(
    auditor: User, oncall: User
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, **SECRETS})
    services.redrive(
        task,
        actor=oncall,
        reason="input fixed, password=hunter2",
        payload={"error": "permanent", "fail_first": 0, **SECRETS, "api_token": "abc-new"},
    )
    rows = export_rows(login(auditor))
    [redriven] = [row for row in rows if row[2] == "redriven"]
    data = json.loads(redriven[7])
    assert data["old_payload"]["password"] == "•••redacted•••"
    assert data["new_payload"]["nested"] == [{"Client-Secret": "•••redacted•••"}]
    assert redriven[6] == "input fixed, password=•••redacted•••"
    # Every cell but the chain hash, whose hex digits may spell "abc" by chance.
    exported = "\n".join(",".join(row[: rows[0].index("chain_hash")]) for row in rows)
    for secret in ("hunter2", "abc", "abc-new", '"x"'):
        assert secret not in exported, secret


def test_the_audit_export_shows_the_lease_tokens_of_the_systems_own_events(
    auditor: User,
) -> None:
    task = dead_task({"error": "permanent", "fail_first": 1, "token": "producer-token"})
    rows = export_rows(login(auditor), kind="claimed")
    [claimed] = [json.loads(row[7]) for row in rows if row[4] == str(task.pk)]
    assert claimed["token"] == Step.objects.get(task=task).fencing_token == 1
    assert "producer-token" not in str(rows)


FORMULAS = ['=HYPERLINK("http://x")', "+1", "-1", "@SUM(A1)", "\t=1", "\r=1"]


def test_no_cell_of_the_audit_export_is_a_formula(auditor: User) -> None:
    mallory = User.objects.create_user("@mallory", password="pw")
    mallory.groups.add(Group.objects.get(name="oncall"))
    services.pause_queue("default", actor=mallory, reason=FORMULAS[0])
    for reason in FORMULAS[1:]:  # written as they are: the services strip a reason
        Event.objects.create(kind="queue_resumed", actor="-cli:x", reason=reason, data={})
    rows = export_rows(login(auditor))[1:]
    assert sorted(row[6] for row in rows) == sorted("'" + reason for reason in FORMULAS)
    assert {row[3] for row in rows} == {"'@mallory", "'-cli:x"}
    assert not [cell for row in rows for cell in row if cell[:1] in ("=", "+", "-", "@")]


BAD_AUDIT_FILTERS = [
    ({"since": "not-a-date"}, "since: a date and time, such as 2026-11-30"),
    ({"until": "2026-13-45"}, "until: a date and time"),
    ({"since": "2026-11-30", "until": "2026-11-29"}, "until: must be later than since"),
    ({"kind": "bogus"}, "kind: 'bogus' is not an event kind"),
    ({"workflow": "no.such"}, "workflow: 'no.such' is not a registered workflow"),
    ({"actor": "a" * 151}, "actor: at most 150 characters"),
    ({"after": "0"}, "after: a whole number from 1"),
    ({"task": "seven"}, "task: a task id, a whole number"),
    ({"task": "0"}, "task: a task id, a whole number from 1"),
]


@pytest.mark.parametrize(("query", "message"), BAD_AUDIT_FILTERS)
def test_a_bad_audit_filter_is_refused_naming_the_field_and_never_widens_the_export(
    auditor: User, oncall: User, query: dict[str, str], message: str
) -> None:
    services.pause_queue("default", actor=oncall, reason="incident 9")
    client = login(auditor)
    export = client.get("/audit/export.csv", query)
    assert export.status_code == 400
    assert export["Content-Type"].startswith("text/plain")
    assert message in export.content.decode() and "incident 9" not in export.content.decode()

    page = client.get("/audit/", query)
    assert page.status_code == 400
    assert message in body(page).replace("&#x27;", "'")
    assert 'class="notice error"' in body(page) and "incident 9" not in body(page)
    partial = client.get("/audit/", query, headers=HTMX)
    assert partial.status_code == 400
    assert message in body(partial).replace("&#x27;", "'")
    assert body(partial).lstrip().startswith('<section id="results"')


def test_a_bad_date_on_the_audit_page_is_shown_on_its_field(auditor: User) -> None:
    page = body(login(auditor).get("/audit/", {"since": "not-a-date"}))
    field = page.split('<label for="id_since">')[0].rsplit('<div class="field', 1)[1]
    assert field.startswith(" invalid")
    assert 'class="field-error" role="alert">since: a date and time' in page


def test_the_audit_log_filters_by_workflow(auditor: User) -> None:
    dead = dead_task()
    enqueued()
    page = body(login(auditor).get("/audit/", {"workflow": "demo.flaky"}))
    assert f'href="/tasks/{dead.pk}/"' in page
    assert "demo.noop" not in page.split('id="results"')[1]


def test_the_audit_log_filters_by_task_and_by_an_actor_prefix_in_any_case(
    auditor: User, oncall: User
) -> None:
    redriven, cancelled = dead_task(), noop()
    services.redrive(redriven, actor=oncall, reason="remote fixed")
    services.cancel(cancelled, actor="cli:alice", reason="not needed")
    client = login(auditor)

    one_task = body(client.get("/audit/", {"task": str(redriven.pk)})).split('id="results"')[1]
    assert "remote fixed" in one_task and "not needed" not in one_task
    assert "cli:producer" in one_task  # the task's own events too: enqueued, claimed, …

    prefix = body(client.get("/audit/", {"actor": oncall.username[:4].upper()}))
    results = prefix.split('id="results"')[1]
    assert "remote fixed" in results and "not needed" not in results
    # Operator actions only, unless an action is chosen: the workers' events are found by
    # theirs.
    assert "cli:producer" not in results
    by_cli = body(client.get("/audit/", {"actor": "CLI:", "kind": "enqueued"}))
    assert f">#{redriven.pk}</a>" in by_cli and f">#{cancelled.pk}</a>" in by_cli
    assert "not needed" not in by_cli.split('id="results"')[1]


def test_the_audit_log_names_each_action_by_its_label(auditor: User, oncall: User) -> None:
    task = dead_task()
    services.resolve(task, actor=oncall, reason="sent by hand", outcome="done")
    services.pause_queue("default", actor=oncall, reason="incident 7")
    page = body(login(auditor).get("/audit/"))

    assert '<option value="resolved">Marked resolved</option>' in page
    assert '<option value="queue_paused">Queue paused</option>' in page
    results = page.split('id="results"')[1]
    assert '<span data-kind="resolved">Marked resolved</span>' in results
    assert '<span data-kind="queue_paused">Queue paused</span>' in results
    assert '<span data-kind="dead_lettered">Dead-lettered</span>' in results


def test_the_audit_export_adds_label_workflow_plan_and_chain_hash_at_the_end(
    auditor: User, oncall: User
) -> None:
    bulk = [dead_task() for _ in range(2)]
    confirm_bulk(login(oncall), action="cancel", reason="incident 7", workflow="demo.flaky")
    plan = Event.objects.filter(task_id=bulk[0].pk, kind="cancelled").get().data["plan"]

    header, *rows = export_rows(login(auditor), plan=plan)

    assert header == [
        "id", "created_at", "kind", "actor", "task_id", "step_id", "reason", "data",
        "label", "workflow", "bulk_plan_id", "chain_hash",
    ]  # fmt: skip
    assert {row[4] for row in rows} == {str(task.pk) for task in bulk}
    for row in rows:
        event = Event.objects.get(pk=row[0])
        assert row[8:] == ["Cancelled", "demo.flaky", plan, event.chain_hash]


def test_the_audit_log_shows_one_bulk_action_by_its_plan(oncall: User, auditor: User) -> None:
    bulk = [dead_task() for _ in range(2)]
    alone = dead_task()
    services.cancel(alone, actor=oncall, reason="by hand")
    confirm_bulk(login(oncall), action="cancel", reason="incident 7", workflow="demo.flaky")
    plan = Event.objects.filter(task_id=bulk[0].pk, kind="cancelled").get().data["plan"]

    page = body(login(auditor).get("/audit/", {"plan": plan}))

    assert all(f">#{task.pk}</a>" in page for task in bulk)
    assert f">#{alone.pk}</a>" not in page
    assert page.count(f'href="/audit/?plan={plan}"') == 2  # each row links to its bulk action
    refused = login(auditor).get("/audit/", {"plan": "not-hex"})
    assert refused.status_code == 400
