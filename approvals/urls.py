from django.urls import path

from . import views
from .notifications import views as notification_views

app_name = "approvals"
urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:approval_id>/", views.detail, name="detail"),
    path("<int:approval_id>/full", views.full_item, name="full"),
    path("<int:approval_id>/decide", views.decide, name="decide"),
    path("<int:approval_id>/step-up", views.step_up, name="step_up"),
    path("<int:approval_id>/edit", views.edit, name="edit"),
    path("links/<str:token>/", views.link, name="link"),
    path("notifications/", notification_views.channels, name="channels"),
    path("notifications/<int:channel_id>/toggle", notification_views.toggle, name="channel_toggle"),
    path("push/subscribe", notification_views.subscribe, name="push_subscribe"),
    path("sw.js", notification_views.service_worker, name="service_worker"),
]
