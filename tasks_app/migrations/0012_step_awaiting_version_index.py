# The metrics count the steps waiting for a worker that has their workflow version (a
# rolling deploy) from this small partial index: only those rows have entries.

from django.db import migrations, models

from tasks_app.db import online_migrations as online


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0011_claim_released"),
    ]

    operations = [
        online.AddIndexOnline(
            model_name="step",
            index=models.Index(
                condition=models.Q(("error_class", "awaiting_version"), ("status", "pending")),
                fields=["queue"],
                name="step_awaiting_version_idx",
            ),
        ),
    ]
