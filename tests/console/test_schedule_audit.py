"""What the audit log and its export show of schedules: each sync's change and each
on-call action with who and why, and never a secret the schedule's payload holds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from tasks_app.engine.schedules import Schedule
from tasks_app.operations import schedule_sync
from tasks_app.operations import schedules as actions
from tests.console_support import body, export_rows, login
from tests.schedule_support import registry_of, store

pytestmark = pytest.mark.django_db

SECRET = "sk-live-schedule-secret"
SYNC = Schedule(
    name="test.sync",
    workflow="demo.noop",
    every=timedelta(hours=1),
    payload={"api_token": SECRET, "target": "crm"},
)


def test_the_export_lists_schedule_changes_and_actions_without_the_payloads_secret(
    auditor: User, oncall: User
) -> None:
    store(SYNC)
    changed = Schedule(**{**SYNC.__dict__, "payload": {"api_token": SECRET, "target": "erp"}})
    schedule_sync.sync(actor="system:release", reason="v2", registry=registry_of(changed))
    actions.pause(SYNC.name, actor=oncall, reason="crm migration")
    client = login(auditor)
    header, *rows = export_rows(client)
    events = [dict(zip(header, row, strict=False)) for row in rows]
    # Newest first, as the log reads.
    assert [(e["kind"], e["actor"], e["reason"]) for e in events] == [
        ("schedule_paused", "olivia-oncall", "crm migration"),
        ("schedule_synced", "system:release", "v2"),
        ("schedule_synced", "cli:test", "deploy"),
    ]
    text = "\n".join(",".join(row) for row in rows)
    assert SECRET not in text
    assert "erp" in events[1]["data"]  # the change itself is shown, its secret is not
    page = body(client.get("/audit/"))
    assert SECRET not in page and "crm migration" in page
