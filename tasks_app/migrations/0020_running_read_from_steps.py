# A claim no longer rewrites its task's row (DESIGN rule 11): a task reads as running from
# its running step, and stores what it stored before the claim, pending. The rows stored as
# running by an earlier release are set back to pending here. They are few (at most the
# steps running right now, found through the active tasks' partial index), so one UPDATE
# does it without a long lock. Code of this release reads a row still stored as running
# (one written by a worker of the earlier release during a rolling deploy) the same way,
# and its next transition stores it in the new form.

from django.db import migrations
from django.db.models import Exists, OuterRef


def running_to_pending(apps, schema_editor):
    Task = apps.get_model("tasks_app", "Task")
    Task.objects.filter(status="running").update(status="pending")


def pending_to_running(apps, schema_editor):
    Task = apps.get_model("tasks_app", "Task")
    Step = apps.get_model("tasks_app", "Step")
    running = Step.objects.filter(task=OuterRef("pk"), status="running")
    Task.objects.filter(status="pending").filter(Exists(running)).update(status="running")


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0019_history_only_retention_deletes")]

    operations = [migrations.RunPython(running_to_pending, pending_to_running, elidable=True)]
