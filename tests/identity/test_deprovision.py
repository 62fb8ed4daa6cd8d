"""The identity provider says a person is gone: a signed POST deactivates the account
linked to its subject (sockets, votes, links, agents), in the provider's name."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from dispatcher import agents
from tests.support import oidc
from tests.support.factories import make_agent, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]

SECRET = "a-deprovisioning-secret-of-some-length"


@pytest.fixture
def provider(settings: Any) -> Any:
    settings.HARNESS_DEPROVISION_SECRET = SECRET
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def post(body: Any, *, secret: str = SECRET, at: float | None = None) -> Any:
    raw = json.dumps(body).encode()
    stamp = str(int(at if at is not None else time.time()))
    mac = hmac.new(secret.encode(), stamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
    return Client().post(
        "/accounts/deprovision/",
        raw,
        content_type="application/json",
        headers={"X-Harness-Timestamp": stamp, "X-Harness-Signature": "sha256=" + mac},
    )


def signed_in_person(provider: oidc.Provider) -> tuple[str, User, Client]:
    sub = unique("gone")
    provider.set_person(sub, email=f"{sub}@corp.test", email_verified=True, preferred_username=sub)
    client = Client()
    assert oidc.sign_in(client, provider, sub).status_code == 302
    return sub, User.objects.get(username=sub), client


def test_the_provider_deactivates_its_person(provider: oidc.Provider) -> None:
    sub, user, client = signed_in_person(provider)
    fx = make_agent(owner=user)
    response = post({"provider": "sso", "subject": sub})
    assert response.status_code == 200
    assert response.json() == {"user": user.username, "deactivated": True}
    assert not User.objects.get(pk=user.pk).is_active
    assert agents.authenticate_token(fx.token) is None
    event = AuditEvent.objects.get(kind="user.deactivated", subject=f"user:{user.username}")
    assert event.actor == "sso:sso" and event.payload["agents_revoked"] == [fx.agent.name]
    assert client.get("/").wsgi_request.user.is_authenticated is False
    assert post({"provider": "sso", "subject": sub}).json()["deactivated"] is False


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"secret": "another-secret-entirely"}, 401),
        ({"at": time.time() - 3600}, 401),
    ],
    ids=["bad-signature", "stale"],
)
def test_an_unsigned_or_stale_request_deactivates_nobody(
    provider: oidc.Provider, change: dict[str, Any], status: int
) -> None:
    sub, user, _ = signed_in_person(provider)
    assert post({"provider": "sso", "subject": sub}, **change).status_code == status
    assert User.objects.get(pk=user.pk).is_active


def test_unknown_subjects_and_providers_are_named(provider: oidc.Provider) -> None:
    response = post({"provider": "sso", "subject": "nobody"})
    assert (
        response.status_code == 404
        and "Nobody has signed in as 'nobody'" in response.json()["error"]
    )
    assert post({"provider": "other", "subject": "x"}).status_code == 404
    assert post({"provider": "sso"}).status_code == 400


def test_without_a_secret_the_endpoint_is_off(settings: Any) -> None:
    settings.HARNESS_DEPROVISION_SECRET = ""
    assert post({"provider": "sso", "subject": "x"}).status_code == 404
