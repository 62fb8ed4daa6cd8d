"""A real OpenID provider on loopback (oidc-provider-mock: authlib behind Flask), and
signing in through it with Django's test client as a browser would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.test import Client

from identity.sso_config import providers_from_env, socialaccount_providers

CLIENT_ID = "harness-test"
CLIENT_SECRET = "harness-test-secret"


@dataclass
class Provider:
    issuer: str

    @property
    def host_port(self) -> str:
        return urlsplit(self.issuer).netloc

    def set_person(self, sub: str, **claims: Any) -> None:
        """What the provider says about `sub` (its next sign-in's ID token and userinfo)."""
        response = httpx.put(f"{self.issuer}/users/{sub}", json=claims)
        assert response.status_code == 204, response.text

    def approve(self, authorize_url: str, sub: str) -> str:
        """The person `sub` signs in at the provider: the redirect back to Harness."""
        response = httpx.post(authorize_url, data={"sub": sub})
        assert response.status_code == 302, response.text
        return str(response.headers["location"])


@contextmanager
def oidc_provider() -> Iterator[Provider]:
    from oidc_provider_mock import run_server_in_thread

    with run_server_in_thread() as server:
        yield Provider(f"http://127.0.0.1:{server.server_port}")


def environ(provider: Provider, name: str = "Test IdP", **more: str) -> dict[str, str]:
    """The environment variables a deployment sets for this provider."""
    return {
        "HARNESS_OIDC_ISSUER": provider.issuer,
        "HARNESS_OIDC_CLIENT_ID": CLIENT_ID,
        "HARNESS_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "HARNESS_OIDC_NAME": name,
        "HARNESS_OUTBOUND_ALLOW": provider.host_port,
        **more,
    }


def configure(settings: Any, provider: Provider, **more: str) -> None:
    """pytest-django's `settings` as settings.py would make them from environ()."""
    env = environ(provider, **more)
    settings.HARNESS_SSO = providers_from_env(env)
    settings.SOCIALACCOUNT_PROVIDERS = socialaccount_providers(settings.HARNESS_SSO)
    settings.HARNESS_OUTBOUND_ALLOW = [provider.host_port]


def sign_in(
    client: Client, provider: Provider, sub: str, provider_id: str = "sso", process: str = "login"
) -> Any:
    """Press "Sign in with ..." (or, with process "connect", connect the provider to the
    signed-in account) and sign in at the provider as `sub`; Harness's answer to the
    redirect back (a 302 home when signed in)."""
    start = client.post(f"/accounts/oidc/{provider_id}/login/", {"process": process})
    assert start.status_code == 302, start.content
    assert start["Location"].startswith(provider.issuer), start["Location"]
    back = urlsplit(provider.approve(start["Location"], sub))
    return client.get(f"{back.path}?{back.query}")
