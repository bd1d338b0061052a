from __future__ import annotations

from django.db import migrations

APPEND_ONLY = """
CREATE OR REPLACE FUNCTION tasks_app_event_append_only() RETURNS trigger AS $$
BEGIN
    -- The retention service deletes inside a transaction that set this flag locally.
    IF TG_OP = 'DELETE' AND current_setting('tasks_app.operations.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'tasks_app_event is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER tasks_app_event_append_only
    BEFORE UPDATE OR DELETE ON tasks_app_event
    FOR EACH ROW EXECUTE FUNCTION tasks_app_event_append_only();
"""

DROP_APPEND_ONLY = """
DROP TRIGGER IF EXISTS tasks_app_event_append_only ON tasks_app_event;
DROP FUNCTION IF EXISTS tasks_app_event_append_only();
"""

# Model permissions are created by post_migrate, which on a fresh database runs after this
# migration, so the rows the groups need are made here.
PERMISSIONS = {
    "task": [
        ("view_task", "Can view task"),
        ("redrive_task", "Can redrive a dead task"),
        ("resolve_task", "Can resolve a dead task by hand"),
        ("cancel_task", "Can cancel a task"),
        ("pause_queue", "Can pause and resume a queue"),
        ("view_audit_log", "Can read the audit log"),
        ("export_audit_log", "Can export the audit log"),
    ],
    "step": [("view_step", "Can view step")],
    "lease": [("view_lease", "Can view lease")],
    "event": [("view_event", "Can view event")],
    "effect": [("view_effect", "Can view effect")],
}

GROUPS = {
    "oncall": [
        "view_task",
        "view_step",
        "view_lease",
        "view_event",
        "view_effect",
        "redrive_task",
        "resolve_task",
        "cancel_task",
        "pause_queue",
    ],
    "auditors": ["view_task", "view_step", "view_event", "view_audit_log", "export_audit_log"],
}


def install_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(APPEND_ONLY)


def remove_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_APPEND_ONLY)


def create_groups(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    by_codename = {}
    for model, perms in PERMISSIONS.items():
        content_type, _ = ContentType.objects.get_or_create(app_label="tasks_app", model=model)
        for codename, name in perms:
            permission, _ = Permission.objects.get_or_create(
                content_type=content_type, codename=codename, defaults={"name": name}
            )
            by_codename[codename] = permission
    for group_name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(*(by_codename[codename] for codename in codenames))


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(install_trigger, remove_trigger),
        migrations.RunPython(create_groups, remove_groups),
    ]
