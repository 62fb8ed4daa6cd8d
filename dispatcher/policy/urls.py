from django.urls import path

from dispatcher.policy import views

app_name = "permissions"
urlpatterns = [
    path("", views.index, name="index"),
    path("analytics/", views.approval_analytics, name="analytics"),
    path("analytics/apply", views.apply_suggestion, name="apply"),
    path("analytics/activate", views.activate_rule, name="activate"),
    path("policy/", views.policy_layers, name="policy"),
    path("policy/proposals/<int:proposal_id>/accept", views.accept_proposal, name="accept"),
    path("users/<int:user_id>/", views.user_profile, name="user"),
    path("users/<int:user_id>/simulate", views.simulate, name="simulate"),
    path("users/<int:user_id>/backtest", views.backtest, name="backtest"),
    path("users/<int:user_id>/check", views.check_rules, name="check"),
    path("users/<int:user_id>/row", views.blank_row, name="row"),
    path("grants/<int:grant_id>/revoke", views.revoke, name="revoke"),
    path("sessions/<uuid:session_id>/", views.session_grants, name="session"),
]
