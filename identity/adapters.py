"""allauth's adapters: how Harness answers allauth's questions about people.

Nobody signs up with a password: accounts are made by admins (the admin, `manage.py
createsuperuser`) or by single sign-on, where the identity provider says who someone is.
An identity provider's person is linked to an existing account only by an email the
provider says is verified, and never a privileged one (superuser, staff, organization
or team admin, reviewer or auditor, break-glass), whose owner connects the provider
from the account itself; an
unverified one that matches an account is refused, never made into a second account
beside it nor linked to it.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.providers.base.constants import AuthProcess
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.shortcuts import render

from audit.roles import ADMIN, AUDITOR, REVIEWER
from floor import outbound

from . import services

SSO_ONLY_REFUSAL = (
    "Password sign-in is off: sign in with your organization's identity provider. "
    "(Break-glass accounts: check the username and password.)"
)


def display_name(user: Any) -> str:
    return str(user.get_username())


class AccountAdapter(DefaultAccountAdapter):  # type: ignore[misc]  # allauth is untyped
    def is_open_for_signup(self, request: HttpRequest) -> bool:
        """Closed: a password account is made by an admin, never by the person."""
        return False

    def authentication_failed(self, request: HttpRequest, **credentials: Any) -> None:
        """With single sign-on the only way in, one answer for every refused password
        (the same for a break-glass name: the list of them is not for guessing)."""
        if settings.HARNESS_SSO_ONLY:
            raise ValidationError(SSO_ONLY_REFUSAL)

    def get_client_ip(self, request: HttpRequest) -> str:
        """The client's address for allauth's per-address limits (sign-ins, device codes),
        an IPv4 client's as IPv4 (`client_address`). Raises PermissionDenied when there is
        none."""
        return client_address(str(super().get_client_ip(request)))


# NAT64's well-known prefix (RFC 6052): an IPv6-only Harness behind a translator sees every
# IPv4 client as 64:ff9b::a.b.c.d.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # ::a.b.c.d (deprecated, RFC 4291)


def _nat64_prefixes() -> list[ipaddress.IPv6Network]:
    """The well-known NAT64 prefix and the operator's (HARNESS_NAT64_PREFIXES)."""
    own = getattr(settings, "HARNESS_NAT64_PREFIXES", [])
    return [NAT64, *(ipaddress.IPv6Network(prefix) for prefix in own)]


def client_address(address: str) -> str:
    """`address` as the limits count it: an IPv6 address that carries an IPv4 client's
    address, as that IPv4 address. On a dual-stack socket (`daphne -b ::`) or behind a
    proxy that listens on one, an IPv4 client arrives as ::ffff:a.b.c.d, and through a
    NAT64 translator as 64:ff9b::a.b.c.d (or under a prefix of HARNESS_NAT64_PREFIXES): counted by its /64 (allauth) or /48 (device codes
    per network), every IPv4 client was one count, which one of them filled for all. A 6to4
    (2002:a.b.c.d::/48) or Teredo address is its IPv4 host's: counted as IPv6, one IPv4 /24
    held 256 networks' worth of device codes. Anything else is returned as it is."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if not isinstance(parsed, ipaddress.IPv6Address):
        return address
    parsed = ipaddress.IPv6Address(int(parsed))  # without a zone id
    embedded: ipaddress.IPv4Address | None = parsed.ipv4_mapped or parsed.sixtofour
    if embedded is None and parsed.teredo is not None:
        embedded = parsed.teredo[1]  # (server, client)
    if embedded is None and (
        any(parsed in network for network in _nat64_prefixes())
        or (parsed in IPV4_COMPATIBLE and int(parsed) > 1)
    ):
        embedded = ipaddress.IPv4Address(int(parsed) & 0xFFFFFFFF)
    return address if embedded is None else str(embedded)


class SocialAccountAdapter(DefaultSocialAccountAdapter):  # type: ignore[misc]
    def is_open_for_signup(self, request: HttpRequest, sociallogin: Any) -> bool:
        """Open: whoever the organization's identity provider signs in has an account."""
        return True

    def get_requests_session(self) -> Any:
        """Every request to an identity provider goes through the outbound door (an IdP
        on a private network is listed in HARNESS_OUTBOUND_ALLOW)."""
        return outbound.requests_session()

    def pre_social_login(self, request: HttpRequest, sociallogin: Any) -> None:
        """A new identity whose email is an existing account's: linked only when the
        provider says the email is verified and the account is not privileged. An
        unverified one is refused (audited), so it neither takes the account over nor gets
        a look-alike account beside it; a privileged account (a superuser, an
        organization or team admin, reviewer or auditor, a break-glass account) is
        refused too
        (audited): its owner
        signs in to it and connects the provider from there, so a provider that marks an
        attacker's address as verified cannot sign anyone in as an admin."""
        if sociallogin.account.pk is not None:  # linked before: its subject matches
            # ...unless the link was made by email and the account is privileged since.
            if services.linked_by_email(sociallogin.account.pk):
                self._refuse_privileged(request, sociallogin)
            return
        if sociallogin.is_existing:  # allauth matched an account by a verified email
            if sociallogin.state.get("process") != AuthProcess.CONNECT:
                self._refuse_privileged(request, sociallogin)
            return
        verified = {a.email.lower() for a in sociallogin.email_addresses if a.verified}
        for address in sociallogin.email_addresses:
            email = address.email.lower()
            if email in verified or not User.objects.filter(email__iexact=email).exists():
                continue
            services.refuse_unverified_email(
                provider=sociallogin.account.provider, uid=sociallogin.account.uid, email=email
            )
            raise ImmediateHttpResponse(
                render(
                    request,
                    "identity/sso_refused.html",
                    {"email": address.email},
                    status=403,
                )
            )

    def _refuse_privileged(self, request: HttpRequest, sociallogin: Any) -> None:
        user = sociallogin.user
        if not is_privileged(user):
            return
        services.refuse_privileged_link(
            provider=sociallogin.account.provider,
            uid=sociallogin.account.uid,
            email=user.email.lower(),
            user=user,
        )
        raise ImmediateHttpResponse(
            render(
                request,
                "identity/sso_link_refused.html",
                {"email": user.email, "provider": sociallogin.account.get_provider().name},
                status=403,
            )
        )


# The roles that make an account privileged, organization-wide or in any team: an admin
# changes policy, agents and people; a reviewer decides agents' calls (their approval is
# what lets a call run), so whoever signs in as them approves in their name; an auditor
# reads other people's agents' calls, their arguments and results (the whole audit log
# of the organization, or of a team), so whoever signs in as them reads all of it.
PRIVILEGED_ROLES = (ADMIN, REVIEWER, AUDITOR)


def is_privileged(user: User) -> bool:
    """An account no identity provider is linked to by email alone: a superuser, a staff
    member, anyone who can decide calls, administer or read other people's agents' calls
    (the organization's reviewer, admin or auditor role, or any of them in any team: a
    team's admin changes their team's policy layer, its agents' tokens and its people's
    rules; a reviewer's approval runs a call; an auditor reads the audit log), or a
    break-glass account (HARNESS_BREAK_GLASS_USERS)."""
    return (
        user.is_superuser
        or user.is_staff
        or user.get_username() in settings.HARNESS_BREAK_GLASS_USERS
        or user.groups.filter(name__in=PRIVILEGED_ROLES).exists()
        or user.team_memberships.filter(role__in=PRIVILEGED_ROLES).exists()
    )
