"""django-oauth-toolkit's endpoints Harness serves, in its namespace (its views reverse
`oauth2_provider:...`), with Harness's consent and device pages. The metadata documents
sit at the root, where MCP clients look (RFC 8414, RFC 9728)."""

from django.conf import settings
from django.urls import path
from oauth2_provider import views as oauth

from agentauth import views

app_name = "oauth2_provider"

urlpatterns = [
    path(
        ".well-known/oauth-authorization-server",
        oauth.OAuthServerMetadataView.as_view(),
        name="oauth-server-metadata",
    ),
    path(
        ".well-known/oauth-protected-resource",
        views.resource_metadata,
        name="oauth-resource-metadata",
    ),
    path(
        ".well-known/oauth-protected-resource/mcp/",
        views.resource_metadata,
        name="oauth-resource-metadata-mcp",
    ),
    path(
        ".well-known/oauth-protected-resource/mcp",
        views.resource_metadata,
        name="oauth-resource-metadata-mcp-bare",
    ),
    path("oauth/authorize/", views.consent, name="authorize"),
    path("oauth/token/", views.token, name="token"),
    path("oauth/revoke/", views.revoke_token, name="revoke-token"),
    path(
        "oauth/device-authorization/",
        views.device_authorization,
        name="device-authorization",
    ),
    path("oauth/device/", views.device, name="device"),
]
if settings.HARNESS_OAUTH_DYNAMIC_REGISTRATION:
    urlpatterns += [
        path("oauth/register/", views.client_registration, name="dcr-register"),
        # (named in every registration's answer: registration_client_uri)
        path(
            "oauth/register/<str:client_id>/",
            views.client_configuration,
            name="dcr-register-management",
        ),
    ]

# A person's own agents (namespace "agentauth", mounted at /account/agents/).
account_urlpatterns = [
    path("", views.my_agents, name="mine"),
    path("<int:agent_id>/sign-out", views.sign_out, name="sign-out"),
    path("<int:agent_id>/revoke", views.revoke, name="revoke"),
]
