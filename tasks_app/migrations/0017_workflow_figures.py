# The workflow figures' roll-up (tasks_app.observability.workflow_figures): a small table of its own,
# written by the sweeper once a minute; no big table is touched.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0016_event_chain"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowSample",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("workflow", models.CharField(max_length=100)),
                ("taken_at", models.DateTimeField()),
                ("hourly", models.BooleanField(default=False)),
                ("enqueued", models.PositiveBigIntegerField(default=0)),
                ("succeeded", models.PositiveBigIntegerField(default=0)),
                ("retried", models.PositiveBigIntegerField(default=0)),
                ("dead_lettered", models.PositiveBigIntegerField(default=0)),
                ("run_buckets", models.JSONField(blank=True, default=dict)),
                ("run_ms", models.PositiveBigIntegerField(default=0)),
            ],
            options={
                "ordering": ["workflow", "taken_at"],
                "indexes": [
                    models.Index(fields=["workflow", "taken_at"], name="workflow_sample_idx"),
                    models.Index(fields=["taken_at"], name="workflow_sample_time_idx"),
                ],
            },
        ),
    ]
