"""The admin's page of OAuth clients, django-oauth-toolkit's, with its deletions through
agentauth.services.delete_client: each agent a person approved for a client is revoked
with it, audited under the admin's name (one client, or many selected at once). A stored
client is not changed here (ApplicationAdmin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from oauth2_provider.models import (
    get_access_token_model,
    get_application_admin_class,
    get_application_model,
    get_grant_model,
    get_id_token_model,
    get_refresh_token_model,
)

from agentauth import services
from harness_site.admin import ReadOnlyAdmin

Application = get_application_model()
_Base: Any = get_application_admin_class()


# The token models django-oauth-toolkit's admin lets no one delete one by one (a deleted
# access token left its refresh token, which could mint another).
_TOKEN_MODELS = ("access token", "refresh token")


class _NewClientForm(_Base.form):  # type: ignore[misc]
    """The admin's form of a new client: its client_id is not a URL. A URL is a client
    metadata document's (CIMD): Harness fetches it on the first consent and keeps the
    client to its document; one an admin typed was never fetched, so a consent page showed
    a trusted host's address ("Identified by") for redirect URIs the admin chose."""

    def clean_client_id(self) -> Any:
        value = self.cleaned_data.get("client_id")
        text = str(value or "")
        # Not a URL, nor text that reads as one on the consent page's "Identified by"
        # line: a fullwidth colon or division slashes (`https：//...`, `https:∕∕...`),
        # an invisible character, a scheme-relative `//host/...`. A client_id is
        # printable ASCII (RFC 6749's VSCHAR) with no `//`.
        if "//" in text or not all(" " <= c <= "~" for c in text):
            raise ValidationError(
                "A client_id that is a URL names a client metadata document: Harness reads "
                "that client from its document when someone first signs in with it. Give "
                "a client you register here an id that is not a URL."
            )
        return value


class ApplicationAdmin(_Base):  # type: ignore[misc]
    """Clients are added here (a client "registered by an admin") and deleted here, each
    deletion through services.delete_client; a client once stored is not changed here.
    Its change page let a staff session rewrite the redirect URIs (or the secret) of a
    client people already approve, unaudited: the next person to approve it, shown the
    client's name and address as always (the new URI under "Returns to"), sent their
    agent's code to the staff session's URI, which exchanged it for their agent's token.
    Registered metadata is not rewritten by RFC 7592 either (ClientConfigurationView, PUT
    refused): register the client again instead. The page shows no secret (a secret
    stored unhashed was shown)."""

    form = _NewClientForm

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # (a new client: the admin gives it its secret, as registered)
            return super().get_exclude(request, obj)
        return [*(super().get_exclude(request, obj) or ()), "client_secret"]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """A client is deleted with its tokens, although its tokens cannot be deleted one
        by one: they all go, access and refresh alike (both cascade from the client), and
        its agents are revoked; an admin who cuts a client off must not have to wait for
        its tokens to expire first."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(perms_needed) - set(_TOKEN_MODELS), protected

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        services.delete_client(application=obj, actor=f"user:{request.user.get_username()}")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        with transaction.atomic():
            for application in queryset.order_by("pk"):
                services.delete_client(
                    application=application, actor=f"user:{request.user.get_username()}"
                )


# (oauth2_provider's admin registered the model first: its app comes before this one.)
if admin.site.is_registered(Application):
    admin.site.unregister(Application)
admin.site.register(Application, ApplicationAdmin)


# django-oauth-toolkit's admins of tokens and codes, read-only. Their change pages let a
# staff session set an access token's checksum (how agentauth.tokens finds a token) to
# that of a string of its choice, which then worked as the agent's credential: an agent's
# token in a person's hands without the consent flow, unaudited. Tokens are issued by the
# OAuth flows and ended by Harness's own paths (revoking or signing out an agent, deleting
# its client), each audited; these pages show the rows, without token, code or checksum.
class _TokenAdmin(ReadOnlyAdmin):
    actions = None  # (django-oauth-toolkit's unaudited "revoke selected")


class AccessTokenAdmin(_TokenAdmin):
    list_display = ["pk", "user", "application", "expires"]
    list_filter = ["application"]
    exclude = ["token", "token_checksum"]


class RefreshTokenAdmin(_TokenAdmin):
    list_display = ["pk", "user", "application", "revoked"]
    list_filter = ["application"]
    exclude = ["token", "token_checksum"]


class GrantAdmin(_TokenAdmin):
    list_display = ["pk", "application", "user", "expires"]
    exclude = ["code", "code_challenge", "nonce"]


class IDTokenAdmin(_TokenAdmin):
    list_display = ["jti", "user", "application", "expires"]
    list_filter = ["application"]


for _model, _admin in (
    (get_access_token_model(), AccessTokenAdmin),
    (get_refresh_token_model(), RefreshTokenAdmin),
    (get_grant_model(), GrantAdmin),
    (get_id_token_model(), IDTokenAdmin),
):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
