"""The ``senior_editors`` group: the editors' permissions, for the requests that escalate
to it (the demo's ``press_release`` names it)."""

import importlib

from django.db import migrations

editors = importlib.import_module("approvals.migrations.0002_editors_group")

GROUP = "senior_editors"


def create_group(apps, schema_editor):
    editors.create_group(apps, schema_editor, name=GROUP)


def remove_group(apps, schema_editor):
    editors.remove_group(apps, schema_editor, name=GROUP)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_quorum_edits_and_notices"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
