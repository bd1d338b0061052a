# Rewind (tasks_app.operations.rewinds): one more operator event kind, ``rewound``, so the
# partial indexes over operator events are built again with the longer list, each
# concurrently, as 0018 and 0024 did.

import importlib

from django.db import migrations, models

from tasks_app.db import online_migrations as online

before = importlib.import_module("tasks_app.migrations.0024_limit_actions")
prefixes = importlib.import_module("tasks_app.migrations.0018_editor_event_kinds")

BEFORE = before.OPERATOR_KINDS
OPERATOR_KINDS = sorted([*BEFORE, "rewound"])


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0026_step_fan_out_items"),
    ]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="kind",
            field=models.CharField(
                choices=[
                    ("enqueued", "Enqueued"),
                    ("claimed", "Claimed"),
                    ("succeeded", "Succeeded"),
                    ("retry_scheduled", "Retry scheduled"),
                    ("lease_expired", "Lease expired"),
                    ("claim_released", "Claim released"),
                    ("stale_write_rejected", "Stale write rejected"),
                    ("dead_lettered", "Dead-lettered"),
                    ("approval_requested", "Approval requested"),
                    ("approved", "Approved"),
                    ("approval_recorded", "Approval recorded"),
                    ("draft_edited", "Draft edited"),
                    ("approval_escalated", "Approval escalated"),
                    ("rejected", "Rejected"),
                    ("changes_requested", "Changes requested"),
                    ("approval_expired", "Approval expired"),
                    ("redriven", "Redriven"),
                    ("resolved", "Marked resolved"),
                    ("cancel_requested", "Cancel requested"),
                    ("cancelled", "Cancelled"),
                    ("queue_paused", "Queue paused"),
                    ("queue_resumed", "Queue resumed"),
                    ("limit_changed", "Limit changed"),
                    ("limit_key_paused", "Limit key paused"),
                    ("limit_key_resumed", "Limit key resumed"),
                    ("rewound", "Rewound"),
                ],
                max_length=40,
            ),
        ),
        online.RemoveIndexOnline(model_name="event", name="event_audit_created_idx"),
        online.AddIndexOnline(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", OPERATOR_KINDS)),
                fields=["created_at"],
                name="event_audit_created_idx",
            ),
        ),
        online.RemoveIndexOnline(model_name="event", name="event_operator_idx"),
        online.AddIndexOnline(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", OPERATOR_KINDS)),
                fields=["id"],
                name="event_operator_idx",
            ),
        ),
        prefixes._remove_prefix(BEFORE),
        prefixes._prefix(OPERATOR_KINDS),
    ]
