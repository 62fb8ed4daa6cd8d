"""Red-team, round 2: attacks on the trust-boundary fixes of 72fca5e..85bc1a4 (single
sign-on's links, a leaver's agents, device codes, system workspaces, a team admin's
reading of rules). Each test is an attack; it passes when the attack fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from dispatcher import agents
from dispatcher.models import Agent
from dispatcher.policy import managed
from dispatcher.tools import sandbox
from floor.errors import ServiceError
from tests.support.factories import make_user, unique
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db


# --- A workspace that holds a system directory -------------------------------------------


def test_a_workspace_that_holds_var_is_refused() -> None:
    """/var holds /var/lib (databases, dpkg's maintainer scripts) and /var/spool (crontabs):
    a workspace inside either is refused, so one holding both must be too. As root,
    give_to_sandbox would hand every file under /var to the sandbox user."""
    for holder in ("/var", "/var/../var", "/var/lib/.."):
        reason = sandbox.exposed_state(Path(holder).resolve())
        assert reason is not None and "holds system" in reason, holder
    owner = make_user(unique("owner"))
    with pytest.raises(ServiceError, match="The workspace /var holds system"):
        agents.create_agent(owner=owner, name=unique("var"), workspace="/var/lib/..", actor="t")
    assert not Agent.objects.filter(owner=owner).exists()
    # A project of its own beside them stays a workspace.
    assert sandbox.exposed_state(Path("/var/tmp/project")) is None  # noqa: S108


# --- A team admin reads no other team's rules --------------------------------------------


def test_a_team_admin_reads_no_other_teams_policy_layer() -> None:
    """A team's layer says what its agents run and allow, as an owner's profile does: the
    policy page shows a team admin the organization's layer and their own teams', never
    another team's (its rules, its history)."""
    pay, infra = make_team("pay"), make_team("infra")
    secret = f"write_file(infra-layer-{unique('x')}.txt)"
    mine = f"write_file(pay-layer-{unique('x')}.txt)"
    managed.set_layer(team=infra.team, document={"deny": [secret]}, actor="cli")
    managed.set_layer(team=pay.team, document={"deny": [mine]}, actor="cli")
    page = pay.client("admin").get("/permissions/policy/")
    assert page.status_code == 200
    text = page.content.decode()
    assert mine in text
    assert secret not in text and infra.team.name not in text
    org = Client()
    org.force_login(make_user(unique("org-admin"), groups=("admin",)))
    assert secret in org.get("/permissions/policy/").content.decode()
