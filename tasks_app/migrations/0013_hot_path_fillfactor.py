from django.db import migrations

# Every step is claimed and finished, and its task with it: two updates of each row, which
# change its status and so are never heap-only updates. When the new version fits in the
# row's page, PostgreSQL logs only the bytes that changed (the payload and the keys before
# the status are not written again) and needs no extra lock record for moving the row to
# another page. A fillfactor of 70 leaves that room in the pages new rows fill. Measured on a
# drain of 10,000 one-step tasks (the database's own WAL per executed step, the payload's GIN
# index already off the task row): 3,758 B at 100, 3,551 at 70, 3,440 at 50 (with the two
# tables twice their size).
FILLFACTOR = 70
TABLES = ("tasks_app_task", "tasks_app_step")


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0012_step_awaiting_version_index"),
    ]

    operations = [
        migrations.RunPython(set_fillfactor, reset_fillfactor),
    ]
