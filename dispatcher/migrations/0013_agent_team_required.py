import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0012_agents_join_default_team"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agent",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="agents",
                to="teams.team",
            ),
        ),
    ]
