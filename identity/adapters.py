"""allauth's adapters: how Harness answers allauth's questions about people.

Nobody signs up with a password: accounts are made by admins (the admin, `manage.py
createsuperuser`) or by single sign-on, where the identity provider says who someone is.
"""

from __future__ import annotations

from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.http import HttpRequest


def display_name(user: Any) -> str:
    return str(user.get_username())


class AccountAdapter(DefaultAccountAdapter):  # type: ignore[misc]  # allauth is untyped
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        """Closed: a password account is made by an admin, never by the person."""
        return False


class SocialAccountAdapter(DefaultSocialAccountAdapter):  # type: ignore[misc]
    def is_open_for_signup(self, request: HttpRequest, sociallogin: Any) -> bool:
        """Open: whoever the organization's identity provider signs in has an account."""
        return True
