"""dispatcher.0017 gives each session made before it its agent's team of then, and 0018
makes the column required and keys a client session by agent, team, client and id: on
PostgreSQL and on SQLite (the same statement on both)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.heavy

BEFORE = [("dispatcher", "0016_agent_token_voided")]


@pytest.mark.django_db(transaction=True)
def test_sessions_from_before_the_column_get_their_agents_team() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    Team = old.get_model("teams", "Team")
    Agent = old.get_model("dispatcher", "Agent")
    Session = old.get_model("dispatcher", "AgentSession")
    owner = old.get_model("auth", "User").objects.create(username="rtxfer-owner")
    pay = Team.objects.create(name="rtxfer-pay")
    infra = Team.objects.create(name="rtxfer-infra")
    made = {}
    for team, prefix in ((pay, "rtxferpa"), (infra, "rtxferin")):
        agent = Agent.objects.create(
            owner=owner, name=prefix, token_prefix=prefix, token_hash="0" * 64, team=team
        )
        for external in ("", "same-id"):
            session = Session.objects.create(
                agent=agent,
                mode="standard",
                workspace="/work/project",
                client="claude-code",
                external_id=external,
            )
            made[session.pk] = team.pk

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from dispatcher.models import AgentSession

    got = dict(AgentSession.objects.filter(pk__in=made).values_list("pk", "team_id"))
    assert got == made
    assert not AgentSession._meta.get_field("team").null
