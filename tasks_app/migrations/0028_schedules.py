# Schedules (tasks_app.engine.schedules): the stored declarations and the slots each
# decided; five more operator event kinds (a sync's change, on-call's pause, resume,
# backfill and run now), so the partial indexes over operator events are built again with
# the longer list, each concurrently, as 0018, 0024 and 0027 did; and the permission to act
# on a schedule, given to on-call.

import importlib

from django.db import migrations, models

from tasks_app.db import online_migrations as online

before = importlib.import_module("tasks_app.migrations.0027_rewound_events")
prefixes = importlib.import_module("tasks_app.migrations.0018_editor_event_kinds")

BEFORE = before.OPERATOR_KINDS
OPERATOR_KINDS = sorted(
    [
        *BEFORE,
        "schedule_synced",
        "schedule_paused",
        "schedule_resumed",
        "schedule_backfilled",
        "schedule_run_now",
    ]
)

PERMISSION = ("manage_schedules", "Can pause, resume, backfill and run a schedule")
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
        ("tasks_app", "0027_rewound_events"),
    ]

    operations = [
        migrations.CreateModel(
            name="ScheduleRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("schedule", models.CharField(max_length=64)),
                ("slot", models.DateTimeField()),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("enqueued", "Enqueued"),
                            ("missed", "Missed"),
                            ("refused", "Refused"),
                            ("run_now", "Run now"),
                        ],
                        max_length=16,
                    ),
                ),
                ("task_id", models.BigIntegerField(blank=True, null=True)),
                ("decided_at", models.DateTimeField()),
                ("decided_by", models.CharField(max_length=200)),
                ("detail", models.TextField(blank=True)),
            ],
        ),
        migrations.CreateModel(
            name="StoredSchedule",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("spec", models.JSONField()),
                ("workflow", models.CharField(max_length=200)),
                ("next_slot", models.DateTimeField()),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("paused_by", models.CharField(blank=True, max_length=200)),
                ("paused_reason", models.TextField(blank=True)),
                ("removed_at", models.DateTimeField(blank=True, null=True)),
                ("declared_at", models.DateTimeField()),
                ("changed_at", models.DateTimeField()),
                ("last_tick_at", models.DateTimeField(blank=True, null=True)),
                ("missed_total", models.PositiveBigIntegerField(default=0)),
            ],
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
                    ("change_limits", "Can change a limit and pause its keys"),
                    ("manage_schedules", "Can pause, resume, backfill and run a schedule"),
                    ("view_audit_log", "Can read the audit log"),
                    ("export_audit_log", "Can export the audit log"),
                ],
            },
        ),
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
                    ("schedule_synced", "Schedule synced"),
                    ("schedule_paused", "Schedule paused"),
                    ("schedule_resumed", "Schedule resumed"),
                    ("schedule_backfilled", "Schedule backfilled"),
                    ("schedule_run_now", "Schedule run now"),
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
        migrations.RunPython(give_permission, take_permission),
        migrations.AddIndex(
            model_name="schedulerun",
            index=models.Index(fields=["schedule", "-slot"], name="schedulerun_recent_idx"),
        ),
        migrations.AddConstraint(
            model_name="schedulerun",
            constraint=models.UniqueConstraint(
                condition=models.Q(("outcome", "run_now"), _negated=True),
                fields=("schedule", "slot"),
                name="schedulerun_one_per_slot",
            ),
        ),
        migrations.AddIndex(
            model_name="storedschedule",
            index=models.Index(
                condition=models.Q(("paused_at__isnull", True), ("removed_at__isnull", True)),
                fields=["next_slot"],
                name="schedule_due_idx",
            ),
        ),
    ]
