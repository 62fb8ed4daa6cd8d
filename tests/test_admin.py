"""The admin shows everything and changes nothing (every change has one audited path)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dispatcher.policy.models import PermissionProfile
from tests.support.factories import make_agent

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "model",
    [
        "dispatcher/agent",
        "policy/permissionprofile",
        "policy/policylayer",
        "policy/layerproposal",
        "approvals/approvalrequest",
        "sources/mcpserver",
        "sources/mcptool",
        "audit/checkpointrun",
        # allauth's own models (identity/admin.py): passkeys, emails, providers, sign-ins
        "mfa/authenticator",
        "account/emailaddress",
        "socialaccount/socialaccount",
        "socialaccount/socialapp",
        "socialaccount/socialtoken",
        "usersessions/usersession",
    ],
)
def test_admin_cannot_change_or_add(client: Client, model: str) -> None:
    User.objects.create_superuser("root", password="pw-root")
    client.login(username="root", password="pw-root")
    assert client.get(f"/admin/{model}/").status_code == 200
    assert client.get(f"/admin/{model}/add/").status_code == 403


def test_admin_cannot_edit_a_profile(client: Client) -> None:
    fx = make_agent(mode="standard")
    profile = PermissionProfile.objects.get(user=fx.owner)
    User.objects.create_superuser("root", password="pw-root")
    client.login(username="root", password="pw-root")
    url = f"/admin/policy/permissionprofile/{profile.pk}/change/"
    response = client.post(url, {"user": fx.owner.pk, "mode": "trusted", "version": 99})
    assert response.status_code == 403
    profile.refresh_from_db()
    assert profile.mode == "standard"
