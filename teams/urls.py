from django.urls import path

from . import views

app_name = "teams"
urlpatterns = [
    path("", views.index, name="index"),
    path("create", views.create, name="create"),
    path("<int:team_id>/", views.detail, name="detail"),
    path("<int:team_id>/members/add", views.add_member, name="add_member"),
    path("<int:team_id>/members/remove", views.remove_member, name="remove_member"),
]
