"""Each session's team: the team its agent worked for when it started. Sessions made
before this column are given their agent's team of now (the best that is known: moves
were not recorded per session before)."""

import django.db.models.deletion
from django.db import migrations, models

# A correlated subquery: the same statement on PostgreSQL and SQLite.
BACKFILL = (
    "UPDATE dispatcher_agentsession SET team_id = (SELECT a.team_id FROM dispatcher_agent a "
    "WHERE a.id = dispatcher_agentsession.agent_id)"
)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0016_agent_token_voided"),
        ("teams", "0003_team_escalation"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="team",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="sessions",
                to="teams.team",
            ),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
