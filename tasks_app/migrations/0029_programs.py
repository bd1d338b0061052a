# Programs (tasks_app.models.programs): each person's API tokens and the plans programs
# propose for a person to sign; five more operator event kinds (a token made or revoked, a
# plan proposed, applied or declined), so the partial indexes over operator events are
# built again with the longer list, each concurrently, as 0018, 0024, 0027 and 0028 did;
# and the group ``producers`` (enqueue, read tasks) a producing program's token takes.

import importlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from tasks_app.db import online_migrations as online

before = importlib.import_module("tasks_app.migrations.0028_schedules")
prefixes = importlib.import_module("tasks_app.migrations.0018_editor_event_kinds")

BEFORE = before.OPERATOR_KINDS
OPERATOR_KINDS = sorted(
    [
        *BEFORE,
        "token_created",
        "token_revoked",
        "plan_proposed",
        "plan_applied",
        "plan_declined",
    ]
)


# The group a producing program's token takes: enqueue, and read the tasks it made.
PRODUCERS = "producers"
PRODUCER_PERMISSIONS = [("add_task", "Can add task"), ("view_task", "Can view task")]


def create_producers(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="tasks_app", model="task")
    group, _ = Group.objects.get_or_create(name=PRODUCERS)
    for codename, name in PRODUCER_PERMISSIONS:
        permission, _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
        group.permissions.add(permission)


def remove_producers(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=PRODUCERS).delete()


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("tasks_app", "0028_schedules"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=64)),
                ("prefix", models.CharField(max_length=16, unique=True)),
                ("digest", models.CharField(max_length=64)),
                (
                    "auto_apply",
                    models.CharField(
                        choices=[
                            ("never", "None: every plan waits for a person"),
                            ("one_task", "A plan on one task with no write in doubt"),
                            ("any", "Any plan its permissions allow"),
                        ],
                        default="never",
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("expires_at", models.DateTimeField()),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_by", models.CharField(blank=True, max_length=200)),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("last_used_address", models.GenericIPAddressField(blank=True, null=True)),
            ],
            options={
                "ordering": ["-id"],
            },
        ),
        migrations.CreateModel(
            name="ProposedPlan",
            fields=[
                ("id", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("action", models.CharField(max_length=40)),
                ("filters", models.JSONField(blank=True, default=dict)),
                ("task_ids", models.JSONField(blank=True, default=list)),
                ("matched", models.PositiveIntegerField(default=0)),
                ("limit", models.PositiveIntegerField(default=0)),
                ("queue", models.CharField(blank=True, max_length=64)),
                ("params", models.JSONField(blank=True, default=dict)),
                ("in_doubt", models.PositiveIntegerField(default=0)),
                ("reason", models.TextField()),
                ("proposed_by", models.CharField(max_length=200)),
                ("proposed_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("proposed", "Awaiting a signature"),
                            ("applied", "Applied"),
                            ("declined", "Declined"),
                        ],
                        default="proposed",
                        max_length=16,
                    ),
                ),
                ("decided_by", models.CharField(blank=True, max_length=200)),
                ("decided_at", models.DateTimeField(blank=True, null=True)),
                ("decision_reason", models.TextField(blank=True)),
                ("outcome", models.JSONField(blank=True, default=dict)),
            ],
            options={
                "ordering": ["-proposed_at"],
            },
        ),
        online.RemoveIndexOnline(model_name="event", name="event_audit_created_idx"),
        online.RemoveIndexOnline(model_name="event", name="event_operator_idx"),
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
                    ("token_created", "API token created"),
                    ("token_revoked", "API token revoked"),
                    ("plan_proposed", "Plan proposed"),
                    ("plan_applied", "Plan applied"),
                    ("plan_declined", "Plan declined"),
                ],
                max_length=40,
            ),
        ),
        online.AddIndexOnline(
            model_name="event",
            index=models.Index(
                condition=models.Q(("kind__in", OPERATOR_KINDS)),
                fields=["created_at"],
                name="event_audit_created_idx",
            ),
        ),
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
        migrations.RunPython(create_producers, remove_producers),
        migrations.AddField(
            model_name="apitoken",
            name="group",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="auth.group"
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="user",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="api_tokens",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="proposedplan",
            name="decided_by_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="proposedplan",
            name="proposed_by_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="proposedplan",
            name="token",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="plans",
                to="tasks_app.apitoken",
            ),
        ),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.UniqueConstraint(
                condition=models.Q(("revoked_at__isnull", True)),
                fields=("user", "name"),
                name="api_token_name_per_user",
            ),
        ),
        migrations.AddIndex(
            model_name="proposedplan",
            index=models.Index(
                condition=models.Q(("status", "proposed")),
                fields=["proposed_at"],
                name="plan_awaiting_idx",
            ),
        ),
    ]
