"""A session its agent's move to another team left (AgentSession.left_at) takes no call
again, even once the agent is back in that team; one client session per agent, team and
client id among the sessions not left. Sessions of a team their agent is not in now were
left at some move already: they are marked left here."""

from typing import Any

from django.db import migrations, models
from django.db.models import F
from django.utils import timezone


def mark_left(apps: Any, schema_editor: Any) -> None:
    AgentSession = apps.get_model("dispatcher", "AgentSession")
    AgentSession.objects.exclude(team_id=F("agent__team_id")).update(left_at=timezone.now())


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0018_session_team_required"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentsession",
            name="left_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(mark_left, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name="agentsession",
            name="agentsession_unique_external_id",
        ),
        migrations.AddConstraint(
            model_name="agentsession",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    models.Q(("external_id", ""), _negated=True), ("left_at__isnull", True)
                ),
                fields=("agent", "team", "client", "external_id"),
                name="agentsession_unique_external_id",
            ),
        ),
    ]
