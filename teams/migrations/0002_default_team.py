"""An install from before teams becomes one team: every reviewer and auditor becomes one
of the default team (their organization-wide group is taken, so a second team is theirs
only when they are made its members); admins stay organization admins and are the
default team's admins too. Agents join the default team in dispatcher 0012."""

from django.db import migrations


def forwards(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Team = apps.get_model("teams", "Team")
    Membership = apps.get_model("teams", "Membership")
    User = apps.get_model("auth", "User")
    Agent = apps.get_model("dispatcher", "Agent")
    holders = {
        role: list(User.objects.filter(groups__name=role).values_list("pk", flat=True))
        for role in ("reviewer", "auditor", "admin")
    }
    if not any(holders.values()) and not Agent.objects.exists():
        return  # a new install: the default team is made on first use
    team, _ = Team.objects.get_or_create(is_default=True, defaults={"name": "default"})
    for role, users in holders.items():
        for user_id in users:
            Membership.objects.get_or_create(team=team, user_id=user_id, role=role)
    for role in ("reviewer", "auditor"):
        group = Group.objects.filter(name=role).first()
        if group is not None:
            group.user_set.clear()


class Migration(migrations.Migration):
    dependencies = [
        ("teams", "0001_teams"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("dispatcher", "0010_toolcall_history_index"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
