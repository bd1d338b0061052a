# The claim under limits (migration 0031's function) locks the steps it admitted by their
# primary key alone. Its one plan a session (plan_cache_mode) is made from the statistics of
# the moment: made while the steps' table was nearly empty, it joined the admitted steps to
# a scan of every pending step (the index their status names), so a burst after a quiet
# hour cost each claim the backlog. The rest is as 0031 installed it:
# its text with that one part replaced.
#
# Installing a function takes no lock on the tables; going back reinstalls 0031's.

from importlib import import_module

from django.db import migrations

EARLIER = import_module("tasks_app.migrations.0031_limited_claim_function").FUNCTION

PICKED_BY_JOIN = """    ), picked AS (
        -- (Arrays, not joins, for the few rows these hold: the planner cannot count the
        -- rows of a WITH and would scan the table for them.)
        SELECT s.id FROM unnest(ARRAY(SELECT a.id FROM admitted a)) AS a(id)
        JOIN tasks_app_step s ON s.id = a.id JOIN tasks_app_task t ON t.id = s.task_id
        WHERE s.status = 'pending'
        FOR UPDATE OF s, t SKIP LOCKED
"""

PICKED_BY_KEY = """    ), locked AS MATERIALIZED (
        -- (Arrays, not joins, for the few rows these hold: the planner cannot count the
        -- rows of a WITH and would scan the table for them.) The steps by their key and no
        -- status, so that no plan reads them through an index of every pending step; the
        -- status is the one of the row as locked, which a change committed since this
        -- statement began has moved on.
        SELECT s.id, s.status FROM tasks_app_step s JOIN tasks_app_task t ON t.id = s.task_id
        WHERE s.id = ANY (ARRAY(SELECT a.id FROM admitted a))
        FOR UPDATE OF s, t SKIP LOCKED
    ), picked AS (
        SELECT l.id FROM locked l WHERE l.status = 'pending'
"""

assert EARLIER.count(PICKED_BY_JOIN) == 1
FUNCTION = EARLIER.replace(PICKED_BY_JOIN, PICKED_BY_KEY)


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FUNCTION)


def reinstall_0031(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(EARLIER)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks_app", "0031_limited_claim_function"),
    ]

    operations = [
        migrations.RunPython(install, reinstall_0031),
    ]
