# Flow control's operator actions: a limit changed live, a key of a limit paused or resumed
# (three more operator event kinds, so the partial indexes over operator events are built
# again with the longer list, each concurrently, as 0018 did), the permission to take them
# (given to on-call), and a key's hold after a remote's "too many requests" (two columns
# without a default: adding them rewrites nothing).

import importlib

from django.db import migrations, models

from tasks_app.db import online_migrations as online

before = importlib.import_module("tasks_app.migrations.0018_editor_event_kinds")

BEFORE = before.OPERATOR_KINDS
OPERATOR_KINDS = sorted([*BEFORE, "limit_changed", "limit_key_paused", "limit_key_resumed"])

PERMISSION = ("change_limits", "Can change a limit and pause its keys")
GROUP = "oncall"


def give_permission(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="tasks_app", model="task")
    codename, name = PERMISSION
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type, codename=codename, defaults={"name": name}
    )
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(permission)


def take_permission(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    Permission.objects.filter(content_type__app_label="tasks_app", codename=PERMISSION[0]).delete()


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0023_flow_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="limitkey",
            name="held_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="limitkey",
            name="held_reason",
            field=models.TextField(blank=True),
        ),
        migrations.AlterModelOptions(
            name="task",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("redrive_task", "Can redrive a dead task"),
                    ("resolve_task", "Can resolve a dead task by hand"),
                    ("cancel_task", "Can cancel a task"),
                    ("pause_queue", "Can pause and resume a queue"),
                    PERMISSION,
                    ("view_audit_log", "Can read the audit log"),
                    ("export_audit_log", "Can export the audit log"),
                ],
            },
        ),
        migrations.RunPython(give_permission, take_permission),
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
                    ("limit_changed", "Limit changed"),
                    ("limit_key_paused", "Limit key paused"),
                    ("limit_key_resumed", "Limit key resumed"),
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
        before._remove_prefix(BEFORE),
        before._prefix(OPERATOR_KINDS),
    ]
