# Fan-outs (tasks_app.engine.fan_outs): a step of a workflow may become several rows at
# one position, told apart by ``item``. Every row there is has item 0, the database's
# default, so adding the column rewrites nothing. The unique constraint that says one row
# per position and revision takes the item in: the new one is built concurrently and
# attached before the old one is dropped, so a row is never left unguarded and nobody
# waits on a lock meanwhile. Both lead with the task, which every read of a task's steps
# uses.

from django.db import migrations, models

from tasks_app.db import online_migrations as online


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0025_step_graph"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="item",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.AlterModelOptions(
            name="step",
            options={"ordering": ["task_id", "revision", "position", "item"]},
        ),
        online.AddConstraintOnline(
            model_name="step",
            constraint=models.UniqueConstraint(
                fields=("task", "position", "revision", "item"),
                name="step_task_position_revision_item",
            ),
        ),
        online.RemoveConstraintOnline(
            model_name="step",
            name="step_task_position_revision",
        ),
    ]
