from django.urls import path

from agentauth import views

app_name = "agentauth"
urlpatterns = [
    path("", views.my_agents, name="mine"),
    path("<int:agent_id>/sign-out", views.sign_out, name="sign-out"),
    path("<int:agent_id>/revoke", views.revoke, name="revoke"),
]
