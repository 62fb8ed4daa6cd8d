from django.db import migrations


def forwards(apps, schema_editor):
    Agent = apps.get_model("dispatcher", "Agent")
    Team = apps.get_model("teams", "Team")
    if not Agent.objects.filter(team__isnull=True).exists():
        return
    team, _ = Team.objects.get_or_create(is_default=True, defaults={"name": "default"})
    Agent.objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0011_agent_team_and_sponsor"),
        ("teams", "0002_default_team"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
