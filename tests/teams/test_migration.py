"""A database from before teams migrates to one default team: nothing changes for it
until a second team is made."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.heavy

OLD_MAIN = [("dispatcher", "0010_toolcall_history_index")]
BEFORE_TEAMS = [*OLD_MAIN, ("teams", None)]


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_teams_becomes_one_team() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_TEAMS)
    old = MigrationExecutor(connection).loader.project_state(OLD_MAIN).apps
    users = old.get_model("auth", "User").objects
    groups = old.get_model("auth", "Group").objects
    reviewer, auditor, admin, owner = (
        users.create(username=name) for name in ("rev", "aud", "adm", "own")
    )
    for user, role in ((reviewer, "reviewer"), (auditor, "auditor"), (admin, "admin")):
        groups.get_or_create(name=role)[0].user_set.add(user)
    old.get_model("dispatcher", "Agent").objects.create(
        owner=owner, name="old", token_prefix="oldagent", token_hash="0" * 64
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from django.contrib.auth.models import User

    from audit import roles
    from dispatcher.models import Agent
    from teams.models import Team
    from teams.scope import scope_of

    default = Team.objects.get(is_default=True)
    assert Agent.objects.get(name="old").team == default
    rev, aud, adm = (User.objects.get(username=n) for n in ("rev", "aud", "adm"))
    assert roles.has_role(rev, "reviewer") and roles.has_role(aud, "auditor")
    assert scope_of(rev, "reviewer").team_ids == {default.pk}
    assert scope_of(aud, "auditor").team_ids == {default.pk}
    # Admins stay organization admins: they make the second team.
    assert scope_of(adm, "admin").everything
