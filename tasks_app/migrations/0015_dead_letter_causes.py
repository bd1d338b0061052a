# Dead letters grouped by cause: each dead step stores its cause's fingerprint
# (tasks_app.engine.fingerprints) and its task's workflow, and a partial index holds only the dead
# rows, newest task first, with what the list's pages and the grouping read. Adding a
# column with a constant default rewrites nothing on PostgreSQL 11 and later.
#
# The steps already dead get theirs here, in batches, each its own transaction; the
# masking is the module's, so these rows group with the ones that die after the release.

from django.db import migrations, models

from tasks_app.db import online_migrations as online
from tasks_app.engine.fingerprints import fingerprint

BATCH = 1_000


def backfill(apps, schema_editor):
    Step = apps.get_model("tasks_app", "Step")
    last = 0
    while True:
        rows = list(
            Step.objects.filter(status="dead", pk__gt=last)
            .order_by("pk")
            .values_list("pk", "error_class", "last_error", "task__workflow")[:BATCH]
        )
        if not rows:
            return
        for pk, error_class, last_error, workflow in rows:
            Step.objects.filter(pk=pk).update(
                error_fingerprint=fingerprint(error_class, last_error), dead_workflow=workflow
            )
        last = rows[-1][0]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0014_payload_search"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="error_fingerprint",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
        migrations.AddField(
            model_name="step",
            name="dead_workflow",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
        online.AddIndexOnline(
            model_name="step",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["-task"],
                include=(
                    "error_fingerprint",
                    "dead_workflow",
                    "finished_at",
                    "queue",
                    "error_class",
                ),
                name="step_dead_letters_idx",
            ),
        ),
    ]
