# Flow control (tasks_app.engine.limits): each limit's state and each partition key's, and
# on every step the limits it runs under with its turn. The step's two columns have no
# default, so adding them rewrites nothing; the index of due steps under limits is built
# concurrently and has entries for those steps alone.

from django.db import migrations, models

from tasks_app.db import online_migrations as online


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0022_lease_attempt"),
    ]

    operations = [
        migrations.CreateModel(
            name="LimitKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("limit", models.CharField(max_length=64)),
                ("key", models.CharField(blank=True, max_length=200)),
                ("last_turn", models.BigIntegerField(default=0)),
                ("window", models.JSONField(blank=True, default=dict)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("paused_by", models.CharField(blank=True, max_length=200)),
                ("paused_reason", models.TextField(blank=True)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("limit", "key"), name="limitkey_limit_key")
                ],
            },
        ),
        migrations.CreateModel(
            name="LimitState",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("overridden", models.BooleanField(default=False)),
                ("concurrency", models.PositiveIntegerField(blank=True, null=True)),
                ("rate", models.CharField(blank=True, max_length=32)),
                ("turn", models.BigIntegerField(default=0)),
                ("changed_by", models.CharField(blank=True, max_length=200)),
                ("changed_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.AddField(
            model_name="step",
            name="limits",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="step",
            name="limit_turn",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        online.AddIndexOnline(
            model_name="step",
            index=models.Index(
                condition=models.Q(("limit_turn__isnull", False), ("status", "pending")),
                fields=["queue", "-priority", "limit_turn", "available_at"],
                name="step_limited_due_idx",
            ),
        ),
    ]
