from django.urls import path

from . import views

app_name = "audit"
urlpatterns = [
    path("sessions/", views.session_list, name="sessions"),
]
