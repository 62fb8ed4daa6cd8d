"""The admin's page of OAuth clients, django-oauth-toolkit's, with its deletions through
agentauth.services.delete_client: each agent a person approved for a client is revoked
with it, audited under the admin's name (one client, or many selected at once)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from oauth2_provider.models import get_application_admin_class, get_application_model

from agentauth import services

Application = get_application_model()
_Base: Any = get_application_admin_class()


# The token models django-oauth-toolkit's admin lets no one delete one by one (a deleted
# access token left its refresh token, which could mint another).
_TOKEN_MODELS = ("access token", "refresh token")


class ApplicationAdmin(_Base):  # type: ignore[misc]
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
