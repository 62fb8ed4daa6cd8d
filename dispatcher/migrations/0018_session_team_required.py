"""The session's team required (0017 filled it), and one client session per agent, team
and client id: an agent moved to another team starts a new session for the same client
session (its calls go to its new team), while the old one stays its former team's."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0017_session_team"),
    ]

    operations = [
        migrations.AlterField(
            model_name="agentsession",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="sessions",
                to="teams.team",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="agentsession",
            name="agentsession_unique_external_id",
        ),
        migrations.AddConstraint(
            model_name="agentsession",
            constraint=models.UniqueConstraint(
                condition=models.Q(("external_id", ""), _negated=True),
                fields=("agent", "team", "client", "external_id"),
                name="agentsession_unique_external_id",
            ),
        ),
    ]
