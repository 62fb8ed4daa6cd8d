from django.urls import path

from dispatcher.tools.sources import views

app_name = "sources"
urlpatterns = [
    path("", views.index, name="index"),
    path("servers/add", views.add, name="add"),
    path("servers/<str:name>/refresh", views.refresh, name="refresh"),
    path("servers/<str:name>/remove", views.remove, name="remove"),
    path("review/<str:exposed>/", views.review, name="review"),
]
