"""The ``editors`` group: may decide approval requests and read the tasks behind them."""

from django.db import migrations

# Model permissions are created by post_migrate, which on a fresh database runs after this
# migration, so the rows the group needs are made here.
PERMISSIONS = {
    ("approvals", "approvalrequest"): [
        ("view_approvalrequest", "Can view approval request"),
        ("decide_approvalrequest", "Can approve, reject or send back a draft"),
    ],
    ("tasks_app", "task"): [("view_task", "Can view task")],
    ("tasks_app", "step"): [("view_step", "Can view step")],
    ("tasks_app", "event"): [("view_event", "Can view event")],
}

GROUP = "editors"


def create_group(apps, schema_editor, name=GROUP):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    permissions = []
    for (app_label, model), perms in PERMISSIONS.items():
        content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
        for codename, label in perms:
            permission, _ = Permission.objects.get_or_create(
                content_type=content_type, codename=codename, defaults={"name": label}
            )
            permissions.append(permission)
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.add(*permissions)


def remove_group(apps, schema_editor, name=GROUP):
    apps.get_model("auth", "Group").objects.filter(name=name).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0001_initial"),
        ("tasks_app", "0002_event_append_only_and_groups"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
