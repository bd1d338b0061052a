# History that only retention may delete (docs/audit.md, "What append-only means"):
#
# - Events are deleted through one function, tasks_app_prune_events, that runs as the
#   tables' owner (SECURITY DEFINER) and deletes only the history retention may take: events
#   of finished tasks or of tasks already gone, and chained operator events only once a
#   checkpoint sealed the chain past them. The row trigger lets a DELETE through only when
#   it runs as the owner inside that function: neither can a session fake with SET.
# - TRUNCATE of the history is refused unless the database itself allows it (ALTER
#   DATABASE ... SET tasks_app.allow_truncate = 'on', which only its owner may run: the
#   test suite's disposable databases do); a session's own SET counts for nothing.
#
# Every trigger function is installed again here, whatever the database's history: a
# database migrated before this release may hold older versions of them under the same
# names. Replacing a function takes no lock on the tables; each trigger is (re)attached
# with CREATE OR REPLACE TRIGGER, a brief lock under the migration's lock timeout.

from django.db import migrations

FUNCTIONS = """
CREATE OR REPLACE FUNCTION tasks_app_event_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    calls text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        GET DIAGNOSTICS calls = PG_CONTEXT;
        IF current_user = (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = TG_RELID)
           AND position('function tasks_app_prune_events(' IN calls) > 0 THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'tasks_app_event is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE OR REPLACE FUNCTION tasks_app_history_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1
        FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
        WHERE d.datname = current_database() AND s.setrole = 0
          AND 'tasks_app.allow_truncate=on' = ANY (s.setconfig)
    ) THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '%% is append-only: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE OR REPLACE FUNCTION tasks_app_checkpoint_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tasks_app_auditcheckpoint is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE OR REPLACE FUNCTION tasks_app_prune_events(event_ids bigint[])
RETURNS TABLE (event_kind varchar)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    RETURN QUERY
    DELETE FROM tasks_app_event AS e
    WHERE e.id = ANY (event_ids)
      AND NOT EXISTS (
          SELECT 1 FROM tasks_app_task AS t
          WHERE t.id = e.task_id AND t.status NOT IN ('succeeded', 'cancelled')
      )
      AND (
          e.chain_hash IS NULL
          OR e.id <= (SELECT max(c.last_event_id) FROM tasks_app_auditcheckpoint AS c)
      )
    RETURNING e.kind;
END;
$$;
REVOKE ALL ON FUNCTION tasks_app_prune_events(bigint[]) FROM PUBLIC;
"""

TRIGGERS = """
CREATE OR REPLACE TRIGGER tasks_app_event_append_only
    BEFORE UPDATE OR DELETE ON tasks_app_event
    FOR EACH ROW EXECUTE FUNCTION tasks_app_event_append_only();
CREATE OR REPLACE TRIGGER tasks_app_event_no_truncate
    BEFORE TRUNCATE ON tasks_app_event
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_history_no_truncate();
CREATE OR REPLACE TRIGGER tasks_app_auditcheckpoint_no_truncate
    BEFORE TRUNCATE ON tasks_app_auditcheckpoint
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_app_history_no_truncate();
CREATE OR REPLACE TRIGGER tasks_app_auditcheckpoint_append_only
    BEFORE UPDATE OR DELETE ON tasks_app_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION tasks_app_checkpoint_append_only();
"""

# Back to what 0016 installed (and 0002's event trigger as a database migrated at the same
# time as this release's code expects it).
PREVIOUS_FUNCTIONS = """
DROP FUNCTION IF EXISTS tasks_app_prune_events(bigint[]);
CREATE OR REPLACE FUNCTION tasks_app_event_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('tasks_app.operations.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'tasks_app_event is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION tasks_app_history_no_truncate() RETURNS trigger AS $$
BEGIN
    IF current_setting('tasks_app.allow_truncate', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '%% is append-only: TRUNCATE refused', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    quoted = schema_editor.connection.ops.quote_name(schema)
    schema_editor.execute(FUNCTIONS.replace("{schema}", quoted))
    schema_editor.execute(TRIGGERS)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PREVIOUS_FUNCTIONS)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0018_editor_event_kinds"),
    ]

    operations = [
        migrations.RunPython(install, uninstall),
    ]
