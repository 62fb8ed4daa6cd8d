"""Single sign-on from the environment: what each variable makes, and a bad value named
at start-up; `manage.py sso_setup` prints what to register at the provider."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

from identity.sso_config import form_action_origins, providers_from_env, socialaccount_providers

SAML = {
    "type": "saml",
    "id": "entra",
    "name": "Entra ID",
    "entity_id": "https://sts.windows.net/t/",
    "sso_url": "https://login.microsoftonline.com/t/saml2",
    "x509cert": "MIIC",
}


def test_nothing_set_is_no_single_sign_on() -> None:
    assert providers_from_env({}) == []
    assert socialaccount_providers([]) == {
        "openid_connect": {"APPS": [], "OAUTH_PKCE_ENABLED": True},
        "saml": {"APPS": []},
    }


def test_one_oidc_provider_and_more_by_json() -> None:
    env = {
        "HARNESS_OIDC_ISSUER": "https://corp.okta.com/",
        "HARNESS_OIDC_CLIENT_ID": "cid",
        "HARNESS_OIDC_CLIENT_SECRET": "sec",
        "HARNESS_OIDC_NAME": "Okta",
        "HARNESS_OIDC_GROUPS_CLAIM": "roles",
        "HARNESS_PUBLIC_URL": "https://harness.example.com",
        "HARNESS_SSO_PROVIDERS": json.dumps([SAML]),
    }
    okta, entra = providers_from_env(env)
    assert (okta.kind, okta.id, okta.name, okta.groups_claim) == ("oidc", "sso", "Okta", "roles")
    assert okta.config["settings"]["server_url"] == "https://corp.okta.com"
    assert "verified_email" not in okta.config["settings"]  # only the claim says so
    assert (entra.kind, entra.id, entra.groups_claim) == ("saml", "entra", "groups")
    settings = entra.config["settings"]
    assert (
        settings["sp"]["entity_id"] == "https://harness.example.com/accounts/saml/entra/metadata/"
    )
    assert settings["advanced"] == {"strict": True, "want_assertion_signed": True}
    assert form_action_origins([okta, entra]) == [
        "https://corp.okta.com",
        "https://login.microsoftonline.com",
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HARNESS_SSO_PROVIDERS": "[{"}, "HARNESS_SSO_PROVIDERS is not valid JSON"),
        ({"HARNESS_SSO_PROVIDERS": '{"type": "oidc"}'}, "must be a JSON list of objects"),
        ({"HARNESS_SSO_PROVIDERS": '[{"type": "ldap"}]'}, "'type' must be 'oidc' or 'saml'"),
        ({"HARNESS_OIDC_ISSUER": "https://x"}, "HARNESS_OIDC_*: 'client_id' is required"),
        (
            {"HARNESS_OIDC_ISSUER": "corp.okta.com", "HARNESS_OIDC_CLIENT_ID": "c"},
            "must be an http(s) URL",
        ),
        (
            {"HARNESS_SSO_PROVIDERS": json.dumps([{**SAML, "x509cert": ""}])},
            "'x509cert' is required",
        ),
        ({"HARNESS_SSO_PROVIDERS": json.dumps([SAML, SAML])}, "ids must differ"),
        ({"HARNESS_SSO_PROVIDERS": json.dumps([{**SAML, "id": "Bad Id"}])}, "lower-case letters"),
    ],
)
def test_a_bad_value_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(
        ImproperlyConfigured,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("*", r"\*")
        .replace("[", r"\["),
    ):
        providers_from_env(env)


@pytest.mark.django_db
def test_sso_setup_prints_the_redirect_uri_and_the_saml_metadata(settings: Any) -> None:
    env = {
        "HARNESS_OIDC_ISSUER": "https://corp.okta.com",
        "HARNESS_OIDC_CLIENT_ID": "cid",
        "HARNESS_PUBLIC_URL": "https://harness.example.com",
        "HARNESS_SSO_PROVIDERS": json.dumps([SAML]),
    }
    settings.HARNESS_PUBLIC_URL = "https://harness.example.com"
    settings.HARNESS_SSO = providers_from_env(env)
    settings.SOCIALACCOUNT_PROVIDERS = socialaccount_providers(settings.HARNESS_SSO)
    out = io.StringIO()
    call_command("sso_setup", stdout=out)
    text = out.getvalue()
    assert "https://harness.example.com/accounts/oidc/sso/login/callback/" in text
    assert "https://harness.example.com/accounts/saml/entra/acs/" in text
    assert 'entityID="https://harness.example.com/accounts/saml/entra/metadata/"' in text
    xml = io.StringIO()
    call_command("sso_setup", "--provider", "entra", "--metadata-only", stdout=xml)
    assert xml.getvalue().lstrip().startswith("<?xml")
