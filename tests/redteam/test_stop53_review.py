"""Second red-team of the stop-53 security fixes (device authorization bounds, the audit
log, the agent entry points), diff by diff. Each test is an attack; it passes when the
attack fails.

- Served on a dual-stack socket (`daphne -b ::`), every IPv4 client's address arrives as
  an IPv4-mapped IPv6 address (::ffff:203.0.113.9), which allauth counts by its /64: every
  IPv4 client shared one count ("::"), so one machine asking for device codes (or typing
  wrong passwords) refused everyone's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.agentauth.device_counts import clear_device_code_counts
from tests.agentauth.test_device_authorization_limits import ask
from tests.support.oauth import harness_hook_client

# IPv4 clients as a dual-stack socket shows them (RFC 5737 addresses, these tests' own).
MAPPED_FLOODER, MAPPED_NEIGHBOUR = "::ffff:203.0.113.80", "::ffff:198.51.100.81"


@pytest.fixture
def own_counts() -> Iterator[None]:
    addresses = (MAPPED_FLOODER, MAPPED_NEIGHBOUR, "203.0.113.80", "198.51.100.81", "::")
    clear_device_code_counts(*addresses)
    yield
    clear_device_code_counts(*addresses)


@pytest.mark.django_db
def test_ipv4_clients_on_a_dual_stack_socket_are_counted_apart(own_counts: None) -> None:
    """`daphne -b ::` shows an IPv4 client as ::ffff:a.b.c.d: one flooding IPv4 client is
    refused, another IPv4 client still gets a code (they were one count, "::")."""
    harness_hook_client()
    from django.conf import settings

    for _ in range(settings.HARNESS_DEVICE_AUTHORIZATIONS):
        assert ask(REMOTE_ADDR=MAPPED_FLOODER).status_code == 200
    assert ask(REMOTE_ADDR=MAPPED_FLOODER).status_code == 429
    # The same client over IPv4 is the same count.
    assert ask(REMOTE_ADDR="203.0.113.80").status_code == 429
    neighbour = ask(REMOTE_ADDR=MAPPED_NEIGHBOUR)
    assert neighbour.status_code == 200, neighbour.content
