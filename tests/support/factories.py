"""Test personas and agents: users with roles and modes, agents with tokens, one call
admitted through the service."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User

from audit import roles
from dispatcher import admission, agents
from dispatcher.models import Agent
from dispatcher.policy import profiles


def make_user(username: str, *, groups: tuple[str, ...] = (), mode: str | None = None) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username)
    for name in groups:
        roles.grant_role(user=user, role=name, actor="test")
    if mode:
        profiles.set_mode(user=user, mode=mode, actor="test")
    return user


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class AgentFixture:
    agent: Agent
    token: str
    owner: User

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_agent(
    *, mode: str = "standard", workspace: str = "", owner: User | None = None
) -> AgentFixture:
    owner = owner or make_user(unique("owner"), mode=mode)
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), workspace=workspace, actor="test"
    )
    return AgentFixture(agent, token, owner)


def submit_one(session: Any, name: str, arguments: dict[str, Any], tool_use_id: str = "w") -> Any:
    """Admit one native-dialect call in `session` through the service (no HTTP); the call."""
    from dispatcher.gateways.dialects import ProposedCall, canonical_json

    proposed = [ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)]
    [call] = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    return call
