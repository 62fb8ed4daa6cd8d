"""The counts of device codes asked for per address (agentauth.views, allauth's rate
limiter in Django's cache), cleared for named addresses: a test that asks for codes starts
and ends with none counted at its addresses, so no test is refused for another's codes."""

from __future__ import annotations

from allauth.core import ratelimit
from django.test import RequestFactory, override_settings

from agentauth.views import DEVICE_AUTHORIZATION_ACTION, DEVICE_NETWORK_ACTION, device_network

# Every test client's address (Django's RequestFactory), where most tests ask from.
TEST_CLIENT_ADDRESS = "127.0.0.1"


def clear_device_code_counts(*addresses: str) -> None:
    """Forget the codes asked for from each address and its network (only these actions'
    keys, at the rates configured now: the cache holds other counts, other tests' sign-ins
    among them)."""
    with override_settings(ALLAUTH_TRUSTED_PROXY_COUNT=0, ALLAUTH_TRUSTED_CLIENT_IP_HEADER=None):
        for address in addresses:
            request = RequestFactory().post("/oauth/device-authorization/", REMOTE_ADDR=address)
            ratelimit.clear(request, action=DEVICE_AUTHORIZATION_ACTION)
            ratelimit.clear(request, action=DEVICE_NETWORK_ACTION, key=device_network(address))
