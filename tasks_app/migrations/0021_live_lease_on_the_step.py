# The live lease sits on the step row (DESIGN rule 2): the claim sets its holder beside its
# token and expiry, and the attempt's Lease row is written once, when the attempt ends, so an
# execution writes one row version fewer. A column with a constant default is added without
# rewriting the table. Leases an earlier release opened as rows at their claim are closed by
# the new code as they end (an insert that conflicts on (step, token) updates the row).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0020_running_read_from_steps"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="lease_worker",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
    ]
