# A tamper-evident audit history (tasks_app.operations.audit_chain, docs/audit.md): each operator
# event carries the hash of its canonical form chained over the one before; retention
# writes a checkpoint before it deletes chained events; TRUNCATE of the history is refused
# as UPDATE and DELETE are. The audit log's actor filter becomes a prefix in any case.
#
# The big event table only gains two nullable columns (no rewrite), a statement trigger
# (a brief lock, under the migration's lock timeout) and indexes built concurrently.
# Events from before stay outside the chain: it begins with the first operator event
# written after this release.

import django.utils.timezone
from django.db import migrations, models

from tasks_app.db import online_migrations as online

OPERATOR_KINDS = [
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

# A TRUNCATE fires no row trigger, so the append-only trigger of 0002 never saw one: it
# emptied the history in one statement. Refused now, unless the session set
# tasks_app.allow_truncate: nothing in the application does; the test suite sets it on
# its own disposable database (tests/conftest.py), whose flushes truncate every table.
HISTORY_TRIGGERS = """
CREATE OR REPLACE FUNCTION tasks_app_history_no_truncate() RETURNS trigger AS $$
BEGIN
    IF current_setting('tasks_app.allow_truncate', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '%% is append-only: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION tasks_app_checkpoint_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'tasks_app_auditcheckpoint is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tasks_app_event_no_truncate
    BEFORE TRUNCATE ON tasks_app_event
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_history_no_truncate();
CREATE TRIGGER tasks_app_auditcheckpoint_no_truncate
    BEFORE TRUNCATE ON tasks_app_auditcheckpoint
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_history_no_truncate();
CREATE TRIGGER tasks_app_auditcheckpoint_append_only
    BEFORE UPDATE OR DELETE ON tasks_app_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION tasks_app_checkpoint_append_only();
"""

DROP_HISTORY_TRIGGERS = """
DROP TRIGGER IF EXISTS tasks_app_event_no_truncate ON tasks_app_event;
DROP TRIGGER IF EXISTS tasks_app_auditcheckpoint_no_truncate ON tasks_app_auditcheckpoint;
DROP TRIGGER IF EXISTS tasks_app_auditcheckpoint_append_only ON tasks_app_auditcheckpoint;
DROP FUNCTION IF EXISTS tasks_app_history_no_truncate();
DROP FUNCTION IF EXISTS tasks_app_checkpoint_append_only();
"""


def install_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(HISTORY_TRIGGERS)


def remove_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_HISTORY_TRIGGERS)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0015_dead_letter_causes"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="chain_previous",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="event",
            name="chain_hash",
            field=models.CharField(blank=True, editable=False, max_length=64, null=True),
        ),
        # Python-side only: the chain sets the moment it hashes (no SQL on either database).
        migrations.AlterField(
            model_name="event",
            name="created_at",
            field=models.DateTimeField(
                blank=True, default=django.utils.timezone.now, editable=False
            ),
        ),
        # The labels the audit log shows (no SQL).
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
        migrations.CreateModel(
            name="AuditCheckpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("last_event_id", models.BigIntegerField()),
                ("last_hash", models.CharField(max_length=64)),
                ("kept", models.JSONField(blank=True, default=list)),
                ("pruned_count", models.PositiveIntegerField()),
                (
                    "created_at",
                    models.DateTimeField(
                        blank=True, default=django.utils.timezone.now, editable=False
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        migrations.RunPython(install_triggers, remove_triggers),
        # The chain's head and walk: operator events in id order.
        online.AddIndexOnline(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", OPERATOR_KINDS)),
                fields=["id"],
                name="event_operator_idx",
            ),
        ),
        # The actor filter is a prefix in any case now: the exact (actor, created_at) index
        # served nothing else.
        online.PostgresIndexOnline(
            name="event_audit_actor_prefix_idx",
            table="tasks_app_event",
            definition=(
                "USING btree (upper((actor)::text) text_pattern_ops) WHERE kind IN ("
                + ", ".join(f"'{kind}'" for kind in OPERATOR_KINDS)
                + ")"
            ),
        ),
        online.RemoveIndexOnline(
            model_name="event",
            name="event_audit_actor_idx",
        ),
    ]
