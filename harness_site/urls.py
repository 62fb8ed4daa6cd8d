from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.urls import include, path

from agentauth.urls import account_urlpatterns
from dispatcher.gateways import claude_code, codex, gemini
from dispatcher.gateways.api import api

from . import views

# The coding agents' hooks, on the agent API (same token, same error handling).
api.add_router("/hooks", claude_code.router)
api.add_router("/hooks", codex.router)
api.add_router("/hooks", gemini.router)

# The admin's own sign-in form would sign a person in with the password alone (allauth's
# second factor, rate limits and sign-in rules are on /accounts/login/): it sends them there.
admin.site.login = secure_admin_login(admin.site.login)  # type: ignore[method-assign]

urlpatterns = [
    path("", views.home, name="home"),
    path("api/v1/", api.urls),
    path("approvals/", include("approvals.urls")),
    path("audit/", include("audit.urls")),
    path("permissions/", include("dispatcher.policy.urls")),
    path("agents/", include("dispatcher.urls")),
    path("tools/", include("dispatcher.tools.sources.urls")),
    # Signing in and out, single sign-on and second factors: allauth (docs/identity.md).
    path("accounts/", include("identity.urls")),
    path("accounts/", include("allauth.urls")),
    path("teams/", include("teams.urls")),
    # OAuth for agents: metadata, authorize (consent), token, device (agentauth/).
    path("", include("agentauth.urls")),
    path("account/agents/", include((account_urlpatterns, "agentauth"))),
    path("admin/", admin.site.urls),
]
