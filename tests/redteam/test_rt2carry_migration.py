"""Red team of dispatcher.0019 (AgentSession.left_at): the sessions of a team their agent
left before the upgrade and is back in now. 0019 marked left only the sessions of a team
the agent is not in at the upgrade, so such a session, which the agent left at a move,
still took calls (under the grants a reviewer gave "for this session" before the move),
the very thing left_at closes. The audit log holds every move (agent.transferred, with
the team before and after): a session started before a move of its agent to another team
was left at that move."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dispatcher import agents
from dispatcher.models import AgentSession
from teams.services import create_team
from tests.support.factories import make_agent, unique

pytestmark = pytest.mark.heavy

BEFORE = [("dispatcher", "0018_session_team_required")]


@pytest.mark.django_db(transaction=True)
def test_a_session_of_a_team_the_agent_left_and_is_back_in_is_marked_left() -> None:
    fx = make_agent()
    home, away = fx.agent.team, create_team(name=unique("away"), actor="test")
    left = agents.start_session(agent=fx.agent, client="mcp", external_id=unique("mcp"))
    other_owner = agents.start_session(agent=fx.agent, client="mcp", external_id=unique("mcp"))
    assert agents.transfer_agent(agent=fx.agent, team=away, actor="test")
    assert agents.transfer_agent(agent=fx.agent, team=home, actor="test")
    fresh = agents.start_session(agent=fx.agent, client="mcp", external_id=unique("mcp"))
    # As the rows were before 0019 (which added the column): no session marked.
    AgentSession.objects.filter(pk__in=[left.pk, other_owner.pk]).update(left_at=None)

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    got = dict(
        AgentSession.objects.filter(pk__in=[left.pk, other_owner.pk, fresh.pk]).values_list(
            "pk", "left_at"
        )
    )
    assert got[left.pk] is not None, "a session left at a move takes calls again"
    assert got[other_owner.pk] is not None
    assert got[fresh.pk] is None  # (started after the agent was back)
