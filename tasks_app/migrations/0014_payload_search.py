import django.db.models.deletion
from django.db import migrations, models

from tasks_app.db import online_migrations as online

# The payload filter's GIN index moves from the task row, which every transition rewrites
# (each rewrite added a GIN entry: 336 B of WAL per executed step, measured), to a row
# written once per task (models.PayloadSearch). Triggers keep that row in step with the
# task, whatever writes the task: this release's code, the one it replaces during a
# rolling deploy, a COPY. The column-specific UPDATE trigger fires only for a statement
# that sets the payload (a redrive that edits it), never on the workers' transitions.
TRIGGERS = """
CREATE OR REPLACE FUNCTION tasks_app_payload_search_insert() RETURNS trigger AS $$
BEGIN
    INSERT INTO tasks_app_payloadsearch (task_id, payload) SELECT id, payload FROM new_tasks;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION tasks_app_payload_search_update() RETURNS trigger AS $$
BEGIN
    INSERT INTO tasks_app_payloadsearch (task_id, payload) VALUES (NEW.id, NEW.payload)
    ON CONFLICT (task_id) DO UPDATE SET payload = excluded.payload;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION tasks_app_payload_search_delete() RETURNS trigger AS $$
BEGIN
    DELETE FROM tasks_app_payloadsearch p USING old_tasks o WHERE p.task_id = o.id;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tasks_app_payload_search_insert AFTER INSERT ON tasks_app_task
    REFERENCING NEW TABLE AS new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_payload_search_insert();
CREATE TRIGGER tasks_app_payload_search_update AFTER UPDATE OF payload ON tasks_app_task
    FOR EACH ROW WHEN (OLD.payload IS DISTINCT FROM NEW.payload)
    EXECUTE FUNCTION tasks_app_payload_search_update();
CREATE TRIGGER tasks_app_payload_search_delete AFTER DELETE ON tasks_app_task
    REFERENCING OLD TABLE AS old_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_payload_search_delete();
"""

DROP_TRIGGERS = """
DROP TRIGGER IF EXISTS tasks_app_payload_search_insert ON tasks_app_task;
DROP TRIGGER IF EXISTS tasks_app_payload_search_update ON tasks_app_task;
DROP TRIGGER IF EXISTS tasks_app_payload_search_delete ON tasks_app_task;
DROP FUNCTION IF EXISTS tasks_app_payload_search_insert();
DROP FUNCTION IF EXISTS tasks_app_payload_search_update();
DROP FUNCTION IF EXISTS tasks_app_payload_search_delete();
"""

# The tasks from before the triggers, in batches of this many, each its own transaction.
BATCH = 10_000
BACKFILL = """
WITH batch AS (
    SELECT id, payload FROM tasks_app_task WHERE id > %s ORDER BY id LIMIT %s
), copied AS (
    INSERT INTO tasks_app_payloadsearch (task_id, payload)
    SELECT id, payload FROM batch ON CONFLICT (task_id) DO NOTHING
)
SELECT max(id) FROM batch
"""


def install_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGERS)


def remove_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_TRIGGERS)


def backfill(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    last = 0
    with schema_editor.connection.cursor() as cursor:
        while True:
            cursor.execute(BACKFILL, [last, BATCH])
            row = cursor.fetchone()
            if row is None or row[0] is None:
                return
            last = row[0]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0013_hot_path_fillfactor"),
    ]

    operations = [
        migrations.CreateModel(
            name="PayloadSearch",
            fields=[
                (
                    "task",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="tasks_app.task",
                    ),
                ),
                ("payload", models.JSONField()),
            ],
        ),
        migrations.RunPython(install_triggers, remove_triggers),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        online.PostgresIndexOnline(
            name="payload_search_gin",
            table="tasks_app_payloadsearch",
            definition="USING gin (payload jsonb_path_ops)",
        ),
        online.RemovePostgresIndexOnline(
            name="task_payload_gin",
            table="tasks_app_task",
            definition="USING gin (payload jsonb_path_ops)",
        ),
    ]
