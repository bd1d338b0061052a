# Traces (tasks_app.observability.tracing): each task keeps the W3C traceparent of the
# span its enqueue made, so that its attempts, its effects and the people's decisions on it
# join one trace. A nullable column without a default: PostgreSQL adds it to the catalogue
# only (no rewrite, no scan), under the migration's short lock timeout; rows already there
# read NULL, as do tasks enqueued with tracing off.

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0029_programs"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="traceparent",
            field=models.CharField(blank=True, max_length=55, null=True),
        ),
    ]
