from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/approvals/", consumers.ApprovalQueueConsumer.as_asgi()),
]
