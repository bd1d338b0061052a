# An attempt's Lease row keeps the step's attempt count, so the row records its claim
# (DESIGN rule 8) and the claim needs no event of its own. A column with a constant default
# is added without rewriting the table.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0021_live_lease_on_the_step"),
    ]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="attempt",
            field=models.IntegerField(db_default=0, default=0),
        ),
    ]
