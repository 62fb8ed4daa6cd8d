"""What an identity provider's admin registers for Harness: the OIDC redirect URIs and
the SAML service provider's entity ID, ACS URL and metadata, all under HARNESS_PUBLIC_URL
(the address people reach Harness at)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest
from django.urls import reverse

from .sso_config import Provider


class PublicRequest(HttpRequest):
    """A request as if made to HARNESS_PUBLIC_URL: allauth builds absolute URLs from it."""

    def __init__(self, public_url: str) -> None:
        super().__init__()
        parts = urlsplit(public_url)
        self._public_scheme = parts.scheme or "http"
        self._public_host = parts.netloc
        self.META = {"HTTP_HOST": parts.netloc, "SERVER_NAME": parts.hostname or ""}
        self.path = self.path_info = "/"

    def _get_scheme(self) -> str:
        return self._public_scheme

    def get_host(self) -> str:
        return self._public_host


@dataclass(frozen=True)
class Registration:
    provider: Provider
    lines: list[tuple[str, str]]  # (what, value) to enter at the IdP
    metadata: str = ""  # SAML: the service provider's metadata XML


def registration(provider: Provider, public_url: str | None = None) -> Registration:
    request = PublicRequest(public_url or settings.HARNESS_PUBLIC_URL)
    if provider.kind == "oidc":
        callback = reverse("openid_connect_callback", kwargs={"provider_id": provider.id})
        return Registration(
            provider,
            [
                (
                    "Redirect URI (sign-in redirect, callback URL)",
                    request.build_absolute_uri(callback),
                ),
                ("Scopes", " ".join(provider.config["settings"]["scope"])),
                ("Groups claim", provider.groups_claim),
            ],
        )
    from allauth.socialaccount.adapter import get_adapter
    from allauth.socialaccount.providers.saml.utils import build_saml_config
    from onelogin.saml2.settings import OneLogin_Saml2_Settings

    app = get_adapter().get_app(request, provider="saml", client_id=provider.id)
    config = build_saml_config(request, app.settings, provider.id)
    metadata = OneLogin_Saml2_Settings(settings=config, sp_validation_only=True).get_sp_metadata()
    sp = config["sp"]
    return Registration(
        provider,
        [
            ("SP entity ID (audience)", sp["entityId"]),
            ("ACS URL (single sign-on URL, reply URL)", sp["assertionConsumerService"]["url"]),
            (
                "Metadata URL",
                request.build_absolute_uri(reverse("saml_metadata", args=[provider.id])),
            ),
            ("NameID format", "persistent (or emailAddress)"),
            ("Attributes", f"email, first_name, last_name; groups as '{provider.groups_claim}'"),
        ],
        metadata.decode() if isinstance(metadata, bytes) else str(metadata),
    )
