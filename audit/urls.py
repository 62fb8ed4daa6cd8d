from django.urls import path

from . import views

app_name = "audit"
urlpatterns = [
    path("sessions/", views.session_list, name="sessions"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("sessions/<uuid:session_id>/replay/", views.session_replay, name="replay"),
    path("sessions/<uuid:session_id>/transcript/", views.session_transcript, name="transcript"),
    path(
        "sessions/<uuid:session_id>/export.<str:fmt>", views.session_export, name="session_export"
    ),
    path("export/", views.filtered_export, name="export"),
]
