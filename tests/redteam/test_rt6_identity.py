"""rt6, the people side: an identity provider's verified email never links a team
admin's account (a team admin changes their team's policy layer, its agents' tokens and
its people's rules: privileged, as an organization admin is), through the real OpenID
provider on loopback."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from teams.services import add_member, create_team
from tests.support import oidc
from tests.support.factories import make_user, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


@pytest.fixture
def provider(settings: Any) -> Any:
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def test_a_verified_email_never_links_a_team_admins_account(provider: oidc.Provider) -> None:
    team = create_team(name=unique("pay"), actor="test")
    admin = make_user(unique("teamadmin"))
    admin.email = f"{admin.username}@corp.test"
    admin.save()
    add_member(team=team, user=admin, role="admin", actor="test")
    sub = unique("mallory")
    provider.set_person(sub, email=admin.email, email_verified=True, preferred_username="m")
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 403
    assert "holds administrative rights" in response.content.decode()
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert client.get(f"/teams/{team.pk}/").status_code == 302  # to the login page
    assert not admin.socialaccount_set.exists()
    refused = AuditEvent.objects.filter(kind="sso.link_refused", subject=f"user:{admin.username}")
    assert refused.get().payload["uid"] == sub


@pytest.mark.parametrize("factor", ["totp", "none"])
def test_the_admin_sign_in_never_skips_the_second_factor(factor: str) -> None:
    """Django admin's own /admin/login/ signed a superuser in with the password alone:
    their authenticator app (allauth's second step) was never asked for, and the session
    opened every page (the queue, decisions, permissions). It now sends the person to the
    one sign-in page, which asks for the factor."""
    from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret

    root = make_user(unique("root"))
    root.is_staff = root.is_superuser = True
    root.save()
    if factor == "totp":
        TOTP.activate(root, generate_totp_secret())
    client = Client()
    password = {"username": root.username, "password": "pw-" + root.username}
    posted = client.post("/admin/login/?next=/admin/", password)
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert client.get("/approvals/").status_code == 302  # to the login page
    assert posted.status_code == 302 and posted["Location"].startswith("/accounts/login/")
    page = client.get("/admin/login/?next=/admin/")
    assert page.status_code == 302
    assert page["Location"].startswith("/accounts/login/?next=")
    signed = client.post(
        "/accounts/login/", {"login": root.username, "password": "pw-" + root.username}
    )
    if factor == "totp":
        assert signed["Location"] == "/accounts/2fa/authenticate/"
        assert client.get("/admin/").status_code == 302  # not signed in yet
    else:
        assert client.get("/admin/").status_code == 200  # the same sign-in opens the admin


def test_a_team_admin_the_provider_made_signs_in_again(
    provider: oidc.Provider, settings: Any
) -> None:
    """What the provider made (an account at first sign-in, its team admin role by the
    group map) is matched by its subject after: not refused as a link by email."""
    import json

    from identity.group_map import parse_group_map
    from teams.scope import scope_of

    team = unique("sre")
    settings.HARNESS_SSO_GROUP_MAP = parse_group_map(json.dumps({"leads": f"team:{team}:admin"}))
    sub = unique("lead")
    provider.set_person(sub, email=f"{sub}@corp.test", email_verified=True, groups=["leads"])
    for _ in range(2):
        client = Client()
        assert oidc.sign_in(client, provider, sub).status_code == 302
        person = client.get("/").wsgi_request.user
        assert person.is_authenticated
        assert not scope_of(person, "admin").empty
