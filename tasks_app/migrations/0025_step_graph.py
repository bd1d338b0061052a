# Workflows as graphs (tasks_app.models.graphs): each step stores the positions it waits
# for. The column has no default, so adding it rewrites nothing; a line's rows leave it
# empty.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0024_limit_actions"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="after",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
