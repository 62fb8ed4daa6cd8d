"""The real URLconf plus bench-only baseline views.

/api/bench/... is served by the agent-API handler (same async-native middleware as
/api/v1/); /bare/... by bench.asgi's handler with no middleware at all.
"""

from django.urls import path

from harness_site.urls import urlpatterns as real_urlpatterns

from . import views

urlpatterns = [
    path("api/bench/insert", views.insert),
    path("api/bench/trivial", views.trivial),
    path("api/bench/push", views.push),
    path("bare/trivial", views.trivial),
    *real_urlpatterns,
]
