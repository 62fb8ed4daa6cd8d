"""People's pages, mounted at /accounts/ before allauth's: the paths Harness closes."""

from __future__ import annotations

from django.urls import path, re_path

from . import views

urlpatterns = [
    # A person's own page (their passkeys and other factors), and the second-factor
    # set-up that HARNESS_MFA_REQUIRED sends people to.
    path("me/", views.me, name="identity_me"),
    path("second-factor/", views.mfa_setup, name="identity_mfa_setup"),
    # Closed: nobody signs up, resets a password by email or changes their email here.
    path("signup/", views.not_offered),
    path("email/", views.not_offered),
    path("confirm-email/", views.not_offered),
    re_path(r"^confirm-email/(?P<key>[-:\w]+)/$", views.not_offered),
    path("password/reset/", views.not_offered),
    path("password/reset/done/", views.not_offered),
    path("password/reset/key/done/", views.not_offered),
    re_path(r"^password/reset/key/(?P<uidb36>[0-9A-Za-z]+)-(?P<key>.+)/$", views.not_offered),
]
