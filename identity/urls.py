"""People's pages, mounted at /accounts/ before allauth's: the paths Harness closes."""

from __future__ import annotations

from django.urls import path, re_path

from . import views

urlpatterns = [
    # A person's own page (their passkeys and other factors), and the second-factor
    # set-up that HARNESS_MFA_REQUIRED sends people to.
    path("me/", views.me, name="identity_me"),
    path("second-factor/", views.mfa_setup, name="identity_mfa_setup"),
    # The person's own sign-ins (in place of allauth's list: ending one here is audited
    # and closes its sockets).
    path("sessions/", views.sessions, name="identity_sessions"),
    path("sessions/<int:sign_in_id>/end/", views.end_sign_in, name="identity_end_sign_in"),
    path("sessions/everywhere/", views.sign_out_everywhere, name="identity_sign_out_everywhere"),
    # The identity provider says a person is gone (signed; no session).
    path("deprovision/", views.deprovision, name="identity_deprovision"),
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
