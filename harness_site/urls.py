from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from dispatcher.gateways.api import api

urlpatterns = [
    path("", RedirectView.as_view(url="/approvals/", permanent=False)),
    path("api/v1/", api.urls),
    path("approvals/", include("approvals.urls")),
    path("audit/", include("audit.urls")),
    path("permissions/", include("dispatcher.policy.urls")),
    path("tools/", include("dispatcher.tools.sources.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
