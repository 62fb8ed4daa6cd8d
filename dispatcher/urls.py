from django.urls import path

from dispatcher import views

app_name = "agents"
urlpatterns = [
    path("", views.agent_list, name="index"),
    path("<int:agent_id>/", views.agent_detail, name="detail"),
    path("<int:agent_id>/rotate", views.agent_rotate, name="rotate"),
    path("<int:agent_id>/revoke", views.agent_revoke, name="revoke"),
]
