# Two more operator actions, both an editor's: one approval of several a quorum needs
# (approval_recorded) and an editor's own revision of a draft (draft_edited). The partial
# indexes over operator events name the operator kinds, so the three are built again with
# the longer list, each concurrently: the audit log reads without them for a moment, more
# slowly but correctly.

from django.db import migrations, models

from tasks_app.db import online_migrations as online

BEFORE = [
    "approved",
    "cancel_requested",
    "cancelled",
    "changes_requested",
    "queue_paused",
    "queue_resumed",
    "redriven",
    "rejected",
    "resolved",
]
OPERATOR_KINDS = sorted([*BEFORE, "approval_recorded", "draft_edited"])


def _prefix(kinds):
    return online.PostgresIndexOnline(
        name="event_audit_actor_prefix_idx",
        table="tasks_app_event",
        definition=(
            "USING btree (upper((actor)::text) text_pattern_ops) WHERE kind IN ("
            + ", ".join(f"'{kind}'" for kind in kinds)
            + ")"
        ),
    )


def _remove_prefix(kinds):
    added = _prefix(kinds)
    return online.RemovePostgresIndexOnline(
        name=added.name, table=added.table, definition=added.definition
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0017_workflow_figures"),
    ]

    operations = [
        # Choices only: nothing in the database changes.
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
        _remove_prefix(BEFORE),
        _prefix(OPERATOR_KINDS),
    ]
