# Quorum, escalation, reminders and editors' edits (approvals.services, approvals.notices):
# a request counts distinct approvers in approval votes; it may escalate to a second group
# and remind its approvers once before it expires; an editor's edit closes it as "edited".
# The new columns have constant defaults (nothing rewritten); the status check is added
# NOT VALID and validated after, so the table keeps taking writes.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from tasks_app.db import online_migrations as online


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("approvals", "0002_editors_group"),
        ("tasks_app", "0018_editor_event_kinds"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApprovalVote",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("voter", models.CharField(max_length=150)),
                ("draft_hash", models.CharField(max_length=64)),
                ("comment", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["id"],
            },
        ),
        online.RemoveConstraintOnline(
            model_name="approvalrequest",
            name="approval_status_valid",
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="draft_author",
            field=models.CharField(blank=True, db_default="", default="", max_length=150),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="escalate_to",
            field=models.CharField(blank=True, db_default="", default="", max_length=150),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="escalated_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="escalates_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="quorum",
            field=models.PositiveSmallIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="remind_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="approvalrequest",
            name="reminded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="approvalrequest",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Waiting for a decision"),
                    ("approved", "Approved"),
                    ("rejected", "Rejected"),
                    ("changes_requested", "Sent back for changes"),
                    ("expired", "Expired"),
                    ("cancelled", "Cancelled"),
                    ("edited", "Replaced by an edit"),
                ],
                default="pending",
                max_length=20,
            ),
        ),
        online.AddConstraintOnline(
            model_name="approvalrequest",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        [
                            "pending",
                            "approved",
                            "rejected",
                            "changes_requested",
                            "expired",
                            "cancelled",
                            "edited",
                        ],
                    )
                ),
                name="approval_status_valid",
            ),
        ),
        migrations.AddField(
            model_name="approvalvote",
            name="request",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="votes",
                to="approvals.approvalrequest",
            ),
        ),
        migrations.AddField(
            model_name="approvalvote",
            name="voter_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="approvalvote",
            constraint=models.UniqueConstraint(
                fields=("request", "voter"), name="approval_vote_once"
            ),
        ),
    ]
