from django.urls import path

from . import views

app_name = "approvals"
urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:approval_id>/", views.detail, name="detail"),
    path("<int:approval_id>/decide", views.decide, name="decide"),
    path("<int:approval_id>/edit", views.edit, name="edit"),
    path("links/<str:token>/", views.link, name="link"),
]
