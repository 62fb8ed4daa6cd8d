"""Red team rt9: device codes per network (cf91194) with an IPv4 client inside an IPv6
address. Behind a NAT64 translator (an IPv6-only Harness), every IPv4 client arrives as
64:ff9b::a.b.c.d, all in one /48: one client's codes refused every other IPv4 client. And a
6to4 address (2002:a.b.c.d::/48) is one IPv4 host's: each address of an IPv4 /24 was a
network of its own, 256 networks' worth of codes, more than the client's pending cap."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings as django_settings

from tests.agentauth.device_counts import clear_device_code_counts
from tests.agentauth.test_device_authorization_limits import ask, assert_try_again
from tests.support.oauth import harness_hook_client
from tests.support.paths import ROOT

# Documentation ranges (RFC 5737) embedded in IPv6 addresses, only these tests' own.
NAT64_FLOODER = "64:ff9b::c000:21e"  # 192.0.2.30
NAT64_OTHER = "64:ff9b::cb00:71fa"  # 203.0.113.250, another IPv4 network
SIXTOFOUR = [f"2002:c000:2{n:02x}::1" for n in (0x20, 0x21, 0x22)]  # 192.0.2.32-34
TEREDO_SAME_24 = "2001:0:4136:e378:8000:63bf:3fff:fdde"  # client 192.0.2.33
OWN_PREFIX = "2001:db8:64::/96"  # an operator's NAT64 prefix (HARNESS_NAT64_PREFIXES)
OWN_NAT64 = ["2001:db8:64::c000:223", "2001:db8:64::cb00:71fb"]  # 192.0.2.35, 203.0.113.251
EVERYONE = (NAT64_FLOODER, NAT64_OTHER, *SIXTOFOUR, TEREDO_SAME_24, *OWN_NAT64)


@pytest.fixture
def small_network_limit(settings: Any) -> Any:
    """The configured rates, scaled down (as tests/agentauth does) so the test asks for few
    codes: 10 per address, 3 per network, over a code's life."""
    life = django_settings.HARNESS_DEVICE_CODE_LIFE
    harness_hook_client()
    settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK = 3
    settings.ACCOUNT_RATE_LIMITS = {
        **settings.ACCOUNT_RATE_LIMITS,
        "harness_device_authorization": f"1000/60s/ip,10/{life}s/ip",
        "harness_device_authorization_network": f"3/{life}s/key",
    }
    clear_device_code_counts(*EVERYONE)
    yield settings
    clear_device_code_counts(*EVERYONE)


@pytest.mark.django_db
def test_through_nat64_one_ipv4_client_does_not_refuse_every_other(
    small_network_limit: Any,
) -> None:
    assert [ask(REMOTE_ADDR=NAT64_FLOODER).status_code for _ in range(3)] == [200] * 3
    other = ask(REMOTE_ADDR=NAT64_OTHER)
    assert other.status_code == 200, other.content
    assert other.json()["user_code"]
    refused = ask(REMOTE_ADDR=NAT64_FLOODER)
    assert_try_again(refused, "from this network (192.0.2.0/24)")


@pytest.mark.django_db
def test_6to4_and_teredo_addresses_of_one_ipv4_network_are_one_network(
    small_network_limit: Any,
) -> None:
    assert [ask(REMOTE_ADDR=address).status_code for address in SIXTOFOUR] == [200] * 3
    for address in (SIXTOFOUR[0], TEREDO_SAME_24):
        assert_try_again(ask(REMOTE_ADDR=address), "from this network (192.0.2.0/24)")


@pytest.mark.django_db
def test_an_operators_nat64_prefix_is_read_as_the_well_known_one(
    small_network_limit: Any,
) -> None:
    small_network_limit.HARNESS_NAT64_PREFIXES = [OWN_PREFIX]
    flooder, other = OWN_NAT64
    assert [ask(REMOTE_ADDR=flooder).status_code for _ in range(3)] == [200] * 3
    assert ask(REMOTE_ADDR=other).status_code == 200
    assert_try_again(ask(REMOTE_ADDR=flooder), "from this network (192.0.2.0/24)")


@pytest.mark.backend_independent
@pytest.mark.parametrize("value", ["2001:db8:64::/64", "2001:db8:64::1/96", "192.0.2.0/24", "x"])
def test_a_nat64_prefix_that_is_no_ipv6_96_is_refused_at_start_up(value: str) -> None:
    code = "from django.conf import settings as s; print(s.HARNESS_NAT64_PREFIXES)"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
        "HARNESS_NAT64_PREFIXES": f"{OWN_PREFIX}, {value}",
    }
    bad = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert f"HARNESS_NAT64_PREFIXES holds {value!r}: list IPv6 /96 networks" in bad.stderr
    env["HARNESS_NAT64_PREFIXES"] = f" {OWN_PREFIX} ,"
    good = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert good.stdout.strip() == "['2001:db8:64::/96']", good.stderr
