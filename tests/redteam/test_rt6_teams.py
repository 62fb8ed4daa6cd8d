"""rt6, the people side: team boundaries and roles, through real requests (Django's test
client over the real URLconf, PostgreSQL or SQLite as configured)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from dispatcher.tools.sources.models import McpServer, McpTool
from teams.models import Membership
from tests.support.factories import unique
from tests.teams.world import TeamWorld, make_team
from tests.tools.support import require_bwrap

db = pytest.mark.django_db


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


@db
@pytest.mark.parametrize("role", ["reviewer", "auditor", "admin"])
def test_a_team_admin_gives_no_role_to_themselves(pay: TeamWorld, role: str) -> None:
    """A team admin who made themselves their team's reviewer would approve the calls of
    the agents they manage (and whose tokens they made), past the organization's ask
    rules: their own roles are given by an organization admin."""
    admin = pay.members["admin"]
    held = set(Membership.objects.filter(user=admin).values_list("team_id", "role"))
    events = AuditEvent.objects.filter(kind="team.member_added").count()
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/add", {"user": admin.username, "role": role}
    )
    assert response.status_code == 403
    assert "give yourself a role" in response.content.decode()
    assert set(Membership.objects.filter(user=admin).values_list("team_id", "role")) == held
    assert AuditEvent.objects.filter(kind="team.member_added").count() == events
    if role == "reviewer":
        assert pay.client("admin").get("/approvals/").status_code == 403


@db
def test_a_team_admin_still_adds_others_and_leaves_a_role_and_an_org_admin_adds_themselves(
    pay: TeamWorld,
) -> None:
    admin = pay.members["admin"]
    other = User.objects.create_user("rt6-" + pay.team.name)
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/add", {"user": other.username, "role": "reviewer"}
    )
    assert response.status_code == 302
    assert Membership.objects.filter(team=pay.team, user=other, role="reviewer").exists()
    org = User.objects.create_user("rt6-org-" + pay.team.name, is_superuser=True)
    client = Client()
    client.force_login(org)
    response = client.post(
        f"/teams/{pay.team.pk}/members/add", {"user": org.username, "role": "reviewer"}
    )
    assert response.status_code == 302
    assert Membership.objects.filter(team=pay.team, user=org, role="reviewer").exists()
    # Lowering one's own roles stays allowed.
    Membership.objects.create(team=pay.team, user=admin, role="auditor")
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/remove", {"user": admin.username, "role": "auditor"}
    )
    assert response.status_code == 302
    assert not Membership.objects.filter(team=pay.team, user=admin, role="auditor").exists()


# An MCP server in one line of Python: its one tool's description lists the directory it
# starts in (the first configured path), as a team admin's own server would read it.
PEEK = (
    "import json,os,sys\n"
    "for line in sys.stdin:\n"
    " m=json.loads(line)\n"
    " if 'id' not in m: continue\n"
    " if m['method']=='initialize': r={'protocolVersion':m['params']['protocolVersion'],"
    "'capabilities':{'tools':{}},'serverInfo':{'name':'peek','version':'1'}}\n"
    " elif m['method']=='tools/list': r={'tools':[{'name':'look','description':"
    "' '.join(sorted(os.listdir('.'))),'inputSchema':{'type':'object'}}]}\n"
    " else: r={}\n"
    " print(json.dumps({'jsonrpc':'2.0','id':m['id'],'result':r}),flush=True)\n"
)


@db
@pytest.mark.parametrize("writable", [True, False])
def test_a_team_admin_gives_a_server_no_path_on_the_host(
    pay: TeamWorld, writable: bool, tmp_path: Path
) -> None:
    """A stdio server sees its configured paths read-write (or :ro): a team admin bound
    another team's fixed workspace (or any host directory the sandbox user reads) into a
    server of their own team, and read it (here, in its tool's description). Where a
    server may look on the host is the organization's to choose, as an agent's fixed
    workspace is."""
    require_bwrap()
    target = tmp_path / "another-teams-ci"
    target.mkdir()
    target.chmod(0o755)
    tmp_path.chmod(0o755)
    (target / "payroll-secret.csv").write_text("x")
    (target / "payroll-secret.csv").chmod(0o644)
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "peek",
            "transport": "stdio",
            "command": shlex.join(["/usr/bin/python3", "-c", PEEK]),
            "paths": str(target) if writable else f"{target}:ro",
            "team": pay.team.name,
        },
    )
    assert not McpTool.objects.filter(description__contains="payroll-secret").exists()
    assert not McpServer.objects.filter(name="peek").exists()
    assert answer.status_code == 200
    assert "Only an organization admin gives a server paths on the host" in answer.content.decode()


@db
def test_with_the_sandbox_off_a_team_admin_registers_no_stdio_server(
    pay: TeamWorld, settings: Any, tmp_path: Path
) -> None:
    """With HARNESS_SANDBOX=off a stdio server's command runs as Harness on the host, at
    registration, reviewed by no one: a team admin's command would read the secret key and
    the database. They register streamable HTTP servers (or an organization admin does)."""
    settings.HARNESS_SANDBOX = "off"
    marker = tmp_path / "ran"
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "run",
            "transport": "stdio",
            "command": f"/usr/bin/touch {marker}",
            "team": pay.team.name,
        },
    )
    assert not marker.exists()
    assert answer.status_code == 200
    assert "only an organization admin registers one" in answer.content.decode()
    assert not McpServer.objects.filter(name="run").exists()


@db
@pytest.mark.parametrize("elsewhere", ["member of another team", "organization reviewer"])
def test_a_team_admin_rotates_no_token_of_an_agent_whose_owner_they_do_not_manage(
    pay: TeamWorld, elsewhere: str
) -> None:
    """A team admin makes no agent owned by a person beyond their teams (their rules are
    not the team admin's); rotating the token of such a person's agent (one an
    organization admin made in the team) handed them the same: a credential that acts as
    that person's agent, under that person's rules, in their name."""
    from audit.roles import grant_role
    from teams.services import add_member, create_team

    owner = pay.agent.owner
    if elsewhere == "organization reviewer":
        grant_role(user=owner, role="reviewer", actor="test")
    else:
        add_member(
            team=create_team(name=unique("infra"), actor="test"),
            user=owner,
            role="auditor",
            actor="test",
        )
    answer = pay.client("admin").post(f"/agents/{pay.agent.agent.pk}/rotate")
    assert answer.status_code == 403
    assert "only an organization admin" in answer.content.decode()
    assert not re.search(r"hrn_[0-9a-f]{8}_", answer.content.decode())
    assert not AuditEvent.objects.filter(kind="agent.token_rotated").exists()
    started = Client().post(
        "/api/v1/sessions", data="{}", content_type="application/json", headers=pay.agent.headers
    )
    assert started.status_code == 201  # the old token still works


@db
def test_a_team_admin_still_rotates_the_token_of_an_agent_of_their_own_people(
    pay: TeamWorld,
) -> None:
    answer = pay.client("admin").post(f"/agents/{pay.agent.agent.pk}/rotate")
    assert answer.status_code == 200
    assert re.search(r"hrn_[0-9a-f]{8}_", answer.content.decode())
