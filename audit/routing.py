from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/audit/sessions/<uuid:session_id>/", consumers.SessionTimelineConsumer.as_asgi()),
]
