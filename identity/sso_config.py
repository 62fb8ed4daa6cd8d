"""Single sign-on from environment variables: allauth's SOCIALACCOUNT_PROVIDERS, built once
by settings.py (docs/identity.md, "Single sign-on").

One OIDC provider by its own variables (HARNESS_OIDC_ISSUER, _CLIENT_ID, _CLIENT_SECRET,
_NAME); any number more, OIDC or SAML, as a JSON list in HARNESS_SSO_PROVIDERS:

    [{"type": "oidc", "id": "okta", "name": "Okta", "issuer": "https://corp.okta.com",
      "client_id": "...", "client_secret": "...", "groups_claim": "groups"},
     {"type": "saml", "id": "entra", "name": "Entra ID", "entity_id": "https://sts...",
      "sso_url": "https://login.microsoftonline.com/.../saml2", "x509cert": "MIIC...",
      "groups_attribute": "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups"}]

A provider's emails link to an existing account only when the provider says they are
verified (OIDC `email_verified`, or `"trust_emails": true` for an IdP that only issues
addresses it owns, e.g. SAML from the organization's directory).

Imported by settings: the standard library and Django's ImproperlyConfigured only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

DEFAULT_GROUPS_CLAIM = "groups"
# Attribute names a SAML IdP commonly sends, in the order tried (allauth's own mapping
# covers the rest of a person: uid, email, names).
SAML_EMAIL_ATTRIBUTES = [
    "email",
    "mail",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress",
    "urn:oid:0.9.2342.19200300.100.1.3",
]
SAML_UID_ATTRIBUTES = [
    "uid",
    "http://schemas.microsoft.com/identity/claims/objectidentifier",
    "urn:oid:0.9.2342.19200300.100.1.1",
]
SAML_USERNAME_ATTRIBUTES = ["username", "preferred_username", *SAML_UID_ATTRIBUTES]
_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


@dataclass(frozen=True)
class Provider:
    """One identity provider as Harness understands it."""

    kind: str  # "oidc" or "saml"
    id: str
    name: str
    groups_claim: str
    trust_emails: bool
    config: dict[str, Any] = field(default_factory=dict)  # the allauth app entry
    # Where "Sign in with ..." sends the browser (the CSP's form-action must name it).
    origins: tuple[str, ...] = ()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def form_action_origins(providers: list[Provider]) -> list[str]:
    """The identity providers' origins, for SECURE_CSP's form-action: pressing "Sign in
    with ..." posts to Harness, which redirects the browser there."""
    return sorted({origin for p in providers for origin in p.origins})


def _required(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ImproperlyConfigured(f"{where}: '{key}' is required (a non-empty string).")
    return value.strip()


def _trust_emails(entry: Mapping[str, Any], where: str) -> bool:
    """`trust_emails`: a JSON true or false (absent: false). Anything else ("false" in
    quotes, 0, "no") is refused at start-up: read as truthy it would link any account
    whose email an IdP names, verified or not."""
    value = entry.get("trust_emails", False)
    if not isinstance(value, bool):
        raise ImproperlyConfigured(
            f"{where}: 'trust_emails' must be true or false (JSON, unquoted), not {value!r}."
        )
    return value


def _oidc(entry: Mapping[str, Any], where: str, groups_claim: str) -> Provider:
    pid = _required(entry, "id", where)
    issuer = _required(entry, "issuer", where).rstrip("/")
    if not issuer.startswith(("https://", "http://")):
        raise ImproperlyConfigured(f"{where}: 'issuer' must be an http(s) URL, not {issuer!r}.")
    claim = str(entry.get("groups_claim") or groups_claim)
    scopes = entry.get("scopes") or ["openid", "profile", "email"]
    if not isinstance(scopes, list) or "openid" not in scopes:
        raise ImproperlyConfigured(f"{where}: 'scopes' must be a list that includes 'openid'.")
    trust = _trust_emails(entry, where)
    name = str(entry.get("name") or pid)
    config: dict[str, Any] = {
        "provider_id": pid,
        "name": name,
        "client_id": _required(entry, "client_id", where),
        "secret": str(entry.get("client_secret") or ""),
        "settings": {
            "server_url": issuer,
            "scope": scopes,
            "oauth_pkce_enabled": True,
            "fetch_userinfo": True,
            **({"verified_email": True} if trust else {}),
        },
    }
    extra = entry.get("form_action") or []
    return Provider(
        "oidc", pid, name, claim, trust, config, (_origin(issuer), *map(_origin, extra))
    )


def _saml(entry: Mapping[str, Any], where: str, public_url: str) -> Provider:
    pid = _required(entry, "id", where)
    # The service provider's entity ID stays what the IdP registered, whatever Host a
    # request names: the metadata URL under HARNESS_PUBLIC_URL unless given.
    sp_entity_id = str(entry.get("sp_entity_id") or f"{public_url}/accounts/saml/{pid}/metadata/")
    idp = {
        "entity_id": _required(entry, "entity_id", where),
        "sso_url": _required(entry, "sso_url", where),
        "x509cert": _required(entry, "x509cert", where),
    }
    if entry.get("slo_url"):
        idp["slo_url"] = str(entry["slo_url"])
    claim = str(entry.get("groups_attribute") or DEFAULT_GROUPS_CLAIM)
    trust = _trust_emails(entry, where)
    mapping = {
        "uid": entry.get("uid_attribute") or SAML_UID_ATTRIBUTES,
        "email": entry.get("email_attribute") or SAML_EMAIL_ATTRIBUTES,
        "email_verified": ["email_verified", "http://schemas.auth0.com/email_verified"],
        "username": SAML_USERNAME_ATTRIBUTES,
        "first_name": ["first_name", "givenName", "urn:oid:2.5.4.42"],
        "last_name": ["last_name", "sn", "urn:oid:2.5.4.4"],
    }
    name = str(entry.get("name") or pid)
    config: dict[str, Any] = {
        "provider_id": pid,
        "client_id": pid,  # allauth's organization slug: /accounts/saml/<id>/...
        "name": name,
        "settings": {
            "idp": idp,
            "attribute_mapping": mapping,
            # Signed assertions only; python3-saml checks them against the pinned cert.
            "advanced": {"strict": True, "want_assertion_signed": True},
            "sp": {"entity_id": sp_entity_id},
            **({"verified_email": True} if trust else {}),
        },
    }
    return Provider("saml", pid, name, claim, trust, config, (_origin(idp["sso_url"]),))


def providers_from_env(environ: Mapping[str, str]) -> list[Provider]:
    """Every configured provider; raises ImproperlyConfigured naming the bad variable."""
    groups_claim = environ.get("HARNESS_OIDC_GROUPS_CLAIM", "").strip() or DEFAULT_GROUPS_CLAIM
    public_url = (environ.get("HARNESS_PUBLIC_URL", "").strip() or "http://localhost:8000").rstrip(
        "/"
    )
    found: list[Provider] = []
    if environ.get("HARNESS_OIDC_ISSUER", "").strip():
        entry = {
            "id": environ.get("HARNESS_OIDC_ID", "").strip() or "sso",
            "name": environ.get("HARNESS_OIDC_NAME", "").strip() or "single sign-on",
            "issuer": environ.get("HARNESS_OIDC_ISSUER", ""),
            "client_id": environ.get("HARNESS_OIDC_CLIENT_ID", ""),
            "client_secret": environ.get("HARNESS_OIDC_CLIENT_SECRET", ""),
            "trust_emails": environ.get("HARNESS_OIDC_TRUST_EMAILS", "").lower()
            in {"1", "true", "yes", "on"},
        }
        found.append(_oidc(entry, "HARNESS_OIDC_*", groups_claim))
    raw = environ.get("HARNESS_SSO_PROVIDERS", "").strip()
    if raw:
        try:
            entries = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ImproperlyConfigured(f"HARNESS_SSO_PROVIDERS is not valid JSON: {exc}") from None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ImproperlyConfigured(
                'HARNESS_SSO_PROVIDERS must be a JSON list of objects: [{"type": "oidc", ...}].'
            )
        for n, entry in enumerate(entries):
            where = f"HARNESS_SSO_PROVIDERS[{n}]"
            kind = entry.get("type")
            if kind == "oidc":
                found.append(_oidc(entry, where, groups_claim))
            elif kind == "saml":
                found.append(_saml(entry, where, public_url))
            else:
                raise ImproperlyConfigured(
                    f"{where}: 'type' must be 'oidc' or 'saml', not {kind!r}."
                )
    ids = [p.id for p in found]
    for pid in ids:
        if not _ID.match(pid):
            raise ImproperlyConfigured(
                f"SSO provider id {pid!r}: lower-case letters, digits, '-' and '_' only "
                "(it is part of the redirect URI)."
            )
    if len(set(ids)) != len(ids):
        raise ImproperlyConfigured(f"SSO provider ids must differ: {', '.join(ids)}.")
    return found


def socialaccount_providers(providers: list[Provider]) -> dict[str, Any]:
    """allauth's SOCIALACCOUNT_PROVIDERS for `providers`."""
    oidc = [p.config for p in providers if p.kind == "oidc"]
    saml = [p.config for p in providers if p.kind == "saml"]
    return {
        "openid_connect": {"APPS": oidc, "OAUTH_PKCE_ENABLED": True},
        "saml": {"APPS": saml},
    }
