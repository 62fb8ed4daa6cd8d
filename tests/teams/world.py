"""Two teams, each with an agent that asked, a session grant and an MCP server of its own,
and a reviewer, an auditor and an admin; and the organization's reviewer, auditor and
admin. What one team's people must never see of the other is `Team.markers`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import Agent, AgentSession
from dispatcher.policy.models import SessionGrant
from dispatcher.tools.sources import services as sources
from dispatcher.tools.sources.models import McpServer, McpTool
from teams.models import Team
from teams.services import add_member, create_team
from tests.support.factories import AgentFixture, make_user, submit_one, unique

TEAM_ROLES = ("reviewer", "auditor", "admin")


@dataclass
class TeamWorld:
    team: Team
    agent: AgentFixture
    session: AgentSession
    approval: ApprovalRequest
    grant: SessionGrant
    server: McpServer
    tool: McpTool
    secret: str  # a path only this team's ask names
    members: dict[str, User] = field(default_factory=dict)

    @property
    def markers(self) -> list[str]:
        """Text that shows something of this team: its agent, its ask, its session, its
        grant, its server."""
        return [
            self.agent.agent.name,
            self.secret,
            str(self.session.pk),
            self.approval.digest,
            self.grant.rule,
            self.server.name,
        ]

    def client(self, role: str) -> Client:
        client = Client()
        client.force_login(self.members[role])
        return client


def make_team(prefix: str) -> TeamWorld:
    team = create_team(name=unique(prefix), actor="test")
    owner = make_user(unique(f"{prefix}-owner"), mode="standard")
    agent, token = agents.create_agent(
        owner=owner, name=unique(f"{prefix}-agent"), actor="test", team=team
    )
    fx = AgentFixture(agent, token, owner)
    session = agents.start_session(agent=agent)
    secret = f"{prefix}-secret-{uuid.uuid4().hex[:8]}.txt"
    call = submit_one(session, "write_file", {"path": secret, "content": "x"})
    approval = ApprovalRequest.objects.select_related("call").get(call=call)
    grant = SessionGrant.objects.create(
        session=session,
        rule=f"write_file({prefix}-granted-{uuid.uuid4().hex[:6]}.txt)",
        tool="write_file",
    )
    server = McpServer.objects.create(
        name=unique(f"{prefix}srv")[:32].replace("-", "_"),
        transport="stdio",
        command=["true"],
        created_by="test",
        team=team,
    )
    tool = McpTool.objects.create(
        server=server,
        name="echo",
        exposed_name=f"{server.name}__echo",
        state="active",
        description=f"Echo for {prefix}.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        fingerprint="f" * 64,
    )
    sources._bump_generation()
    world = TeamWorld(team, fx, session, approval, grant, server, tool, secret)
    for role in TEAM_ROLES:
        user = make_user(unique(f"{prefix}-{role}"))
        add_member(team=team, user=user, role=role, actor="test")
        world.members[role] = user
    return world


def org_client(role: str) -> Client:
    client = Client()
    client.force_login(make_user(unique(f"org-{role}"), groups=(role,)))
    return client


def unchanged(world: TeamWorld) -> list[str]:
    """What changed of `world` since it was made (empty: nothing)."""
    changes = []
    approval = ApprovalRequest.objects.select_related("call").get(pk=world.approval.pk)
    if approval.decision or approval.call.status != "pending_approval":
        changes.append(f"the ask is {approval.call.status} ({approval.decision})")
    agent = Agent.objects.get(pk=world.agent.agent.pk)
    if not agent.is_active or agents.authenticate_token(world.agent.token) is None:
        changes.append("the agent was revoked or its token rotated")
    if SessionGrant.objects.get(pk=world.grant.pk).revoked_at is not None:
        changes.append("the grant was revoked")
    if not McpServer.objects.filter(pk=world.server.pk).exists():
        changes.append("the server was removed")
    roles = set(world.team.memberships.values_list("user__username", "role"))
    expected = {(user.username, role) for role, user in world.members.items()}
    if roles != expected:
        changes.append(f"the members changed: {roles ^ expected}")
    return changes
