"""Management commands: create_agent, revoke_agent, set_mode."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from dispatcher.models import Agent
from dispatcher.policy.models import PermissionProfile
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db


def test_create_agent_prints_the_token_alone_on_the_last_line(client: Client) -> None:
    make_user("olga")
    out = StringIO()
    call_command("create_agent", "builder", "--owner", "olga", stdout=out)
    token = out.getvalue().strip().splitlines()[-1]
    agent = Agent.objects.get(name="builder")
    assert token.startswith(f"hrn_{agent.token_prefix}_")
    assert token not in agent.token_hash
    assert (
        client.get("/api/v1/tools", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    )
    call_command("revoke_agent", agent.token_prefix, stdout=StringIO())
    assert (
        client.get("/api/v1/tools", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    )


def test_create_agent_with_a_fixed_workspace(tmp_path: object) -> None:
    make_user("olga")
    call_command(
        "create_agent", "fixed", "--owner", "olga", "--workspace", str(tmp_path), stdout=StringIO()
    )
    assert Agent.objects.get(name="fixed").workspace == str(tmp_path)


def test_create_agent_for_an_unknown_owner_fails_clearly() -> None:
    with pytest.raises(CommandError, match="No user named 'ghost'"):
        call_command("create_agent", "x", "--owner", "ghost")


def test_set_mode_changes_the_profile_and_its_version() -> None:
    user = make_user("uma")
    out = StringIO()
    call_command("set_mode", "uma", "trusted", stdout=out)
    profile = PermissionProfile.objects.get(user=user)
    assert profile.mode == "trusted" and "trusted mode" in out.getvalue()
    with pytest.raises(CommandError):
        call_command("set_mode", "uma", "yolo")
