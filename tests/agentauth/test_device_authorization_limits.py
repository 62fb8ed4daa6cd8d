"""Device codes are asked for with no one signed in, and each one is a row pending for 30
minutes: they are bounded per address (allauth's rate limiter, the address read through
the proxy Harness is told about) and per client in the database (however many addresses
ask), each refusal a 429 with an OAuth error body saying when to try again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from allauth.core.internal.ratelimit import parse_rates
from django.conf import settings
from django.test import Client
from django.utils import timezone
from oauth2_provider.models import DeviceGrant, get_application_model

from tests.agentauth.device_counts import clear_device_code_counts
from tests.support.factories import unique
from tests.support.oauth import HOOKS, harness_hook_client
from tests.support.paths import ROOT

# Addresses of the documentation ranges (RFC 5737), only these tests' own.
FLOODER, NEIGHBOUR = "203.0.113.70", "203.0.113.71"
PROXY = "10.0.0.2"
SPREAD = [f"198.51.100.{n}" for n in range(1, 6)]


@pytest.fixture
def own_counts() -> Iterator[None]:
    """These tests' addresses start and end with no codes counted."""
    addresses = (FLOODER, NEIGHBOUR, PROXY, *SPREAD)
    clear_device_code_counts(*addresses)
    yield
    clear_device_code_counts(*addresses)


def ask(client_id: str = "harness-hook", **meta: Any) -> Any:
    """A device code asked for as `harness-hook login` asks, with the request's META."""
    return Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": client_id, "resource": HOOKS}),
        content_type="application/x-www-form-urlencoded",
        **meta,
    )


def through_proxy(address: str) -> dict[str, str]:
    """A request that came through one reverse proxy, which added the client's address."""
    return {"REMOTE_ADDR": PROXY, "HTTP_X_FORWARDED_FOR": address}


def assert_try_again(answer: Any, says: str) -> None:
    assert answer.status_code == 429, answer.content
    assert answer["Content-Type"] == "application/json"
    assert int(answer["Retry-After"]) >= 1
    body = answer.json()
    assert body["error"] == "too_many_requests"
    assert says in body["error_description"]
    assert "try again in" in body["error_description"].lower()


@pytest.mark.django_db
def test_a_flood_from_one_address_is_refused_and_another_behind_the_proxy_gets_codes(
    own_counts: None, settings: Any
) -> None:
    """Behind one proxy (HARNESS_TRUSTED_PROXY_COUNT=1), every request reaches Harness from
    the proxy's address: the limit falls on the address the proxy names, so one machine
    that floods the endpoint is refused and its neighbour still signs in."""
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1
    harness_hook_client()
    for _ in range(settings.HARNESS_DEVICE_AUTHORIZATIONS):
        assert ask(**through_proxy(FLOODER)).status_code == 200
    before = DeviceGrant.objects.count()
    refused = ask(**through_proxy(FLOODER))
    assert_try_again(refused, "Too many device codes asked for from this address")
    assert refused["Retry-After"] == str(settings.HARNESS_DEVICE_AUTHORIZATION_WINDOW)
    assert DeviceGrant.objects.count() == before  # no row for the refused request
    # A forged X-Forwarded-For entry before the proxy's does not change the address.
    forged = ask(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"192.0.2.9, {FLOODER}")
    assert forged.status_code == 429
    neighbour = ask(**through_proxy(NEIGHBOUR))
    assert neighbour.status_code == 200, neighbour.content
    assert neighbour.json()["user_code"]


@pytest.mark.django_db
def test_one_address_cannot_keep_the_clients_cap_full(own_counts: None, settings: Any) -> None:
    """Per address only 30 a minute were counted, and a code lives 30 minutes: one
    machine filled the client's pending cap (300) in 10 minutes and refilled each slot
    as a code expired, so every new `harness-hook login` anywhere was refused for as long
    as it kept asking. An address may now hold HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE
    codes over a code's life, a small share of the cap (the rates below are the
    configured ones, scaled down so the test needs no half hour)."""
    rates = parse_rates(settings.ACCOUNT_RATE_LIMITS["harness_device_authorization"])
    life = settings.HARNESS_DEVICE_CODE_LIFE
    [per_life] = [rate for rate in rates if rate.duration >= life]
    assert per_life.amount == settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE
    assert per_life.amount * 10 <= settings.HARNESS_DEVICE_PENDING_MAX
    harness_hook_client()
    settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE = 4
    settings.HARNESS_DEVICE_PENDING_MAX = 40
    settings.ACCOUNT_RATE_LIMITS = {
        **settings.ACCOUNT_RATE_LIMITS,
        "harness_device_authorization": f"1000/60s/ip,4/{life}s/ip",
    }
    for _ in range(4):
        assert ask(REMOTE_ADDR=FLOODER).status_code == 200
    refused = ask(REMOTE_ADDR=FLOODER)
    assert_try_again(refused, "4 in 30 minutes (a code's life)")
    # The codes live as long as the window counts them: none of the address's is dropped
    # from the count while it is still pending.
    grant = DeviceGrant.objects.order_by("-pk").first()
    assert grant is not None
    left = (grant.expires - timezone.now()).total_seconds()
    assert life - 60 <= left <= life, left
    assert ask(REMOTE_ADDR=NEIGHBOUR).status_code == 200


@pytest.mark.django_db
def test_a_trusted_client_ip_header_names_the_address(own_counts: None, settings: Any) -> None:
    settings.ALLAUTH_TRUSTED_CLIENT_IP_HEADER = "X-Real-IP"
    harness_hook_client()
    for _ in range(settings.HARNESS_DEVICE_AUTHORIZATIONS):
        assert ask(REMOTE_ADDR=PROXY, HTTP_X_REAL_IP=FLOODER).status_code == 200
    assert ask(REMOTE_ADDR=PROXY, HTTP_X_REAL_IP=FLOODER).status_code == 429
    assert ask(REMOTE_ADDR=PROXY, HTTP_X_REAL_IP=NEIGHBOUR).status_code == 200


@pytest.mark.django_db
def test_a_request_that_did_not_come_through_the_proxy_is_a_400_not_a_500(
    own_counts: None, settings: Any
) -> None:
    """Told of two proxies, a request with one X-Forwarded-For entry (allauth raises
    ImproperlyConfigured), or told of a header, a request without it (PermissionDenied):
    Harness cannot tell the address, and says so."""
    harness_hook_client()
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 2
    short = ask(**through_proxy(FLOODER))
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 0
    settings.ALLAUTH_TRUSTED_CLIENT_IP_HEADER = "X-Real-IP"
    headless = ask(REMOTE_ADDR=PROXY)
    for answer in (short, headless):
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"] == "invalid_request"
        assert "cannot tell this request's address" in answer.json()["error_description"]


def device_client() -> str:
    """A device client of this test's own (no other test's codes pending for it)."""
    client_id = unique("device")
    get_application_model().objects.create(
        client_id=client_id,
        name=client_id,
        client_type="public",
        authorization_grant_type="urn:ietf:params:oauth:grant-type:device_code",
        redirect_uris="",
        client_secret="",
        hash_client_secret=False,
    )
    return client_id


@pytest.mark.django_db
def test_pending_codes_per_client_are_capped_whatever_the_address(
    own_counts: None, settings: Any
) -> None:
    """HARNESS_DEVICE_PENDING_MAX bounds the rows without any address: codes asked for
    from many addresses stop at the cap; one approved, denied or expired frees a place."""
    settings.HARNESS_DEVICE_PENDING_MAX = 3
    client_id = device_client()
    for address in SPREAD[:3]:
        assert ask(client_id, REMOTE_ADDR=address).status_code == 200
    refused = ask(client_id, REMOTE_ADDR=SPREAD[3])
    assert_try_again(refused, "Too many device codes of this client are waiting")
    assert 1700 <= int(refused["Retry-After"]) <= 1801  # when the oldest expires (30 min)
    assert DeviceGrant.objects.filter(client_id=client_id).count() == 3
    # Another client's codes are not this one's.
    harness_hook_client()
    assert ask(REMOTE_ADDR=SPREAD[3]).status_code == 200

    grants = list(DeviceGrant.objects.filter(client_id=client_id).order_by("pk"))
    DeviceGrant.objects.filter(pk=grants[0].pk).update(status=DeviceGrant.DENIED)
    assert ask(client_id, REMOTE_ADDR=SPREAD[3]).status_code == 200
    DeviceGrant.objects.filter(pk=grants[1].pk).update(expires=timezone.now() - timedelta(1))
    assert ask(client_id, REMOTE_ADDR=SPREAD[4]).status_code == 200
    assert ask(client_id, REMOTE_ADDR=SPREAD[4]).status_code == 429


@pytest.mark.django_db
def test_device_codes_long_expired_are_cleared_by_the_hourly_task() -> None:
    """Every request to the endpoint left a row for ever (cleartokens leaves device codes):
    the beat's hourly task deletes those expired for over an hour, whatever their status,
    and keeps the rest (a login still polling an expired code is told it expired)."""
    from agentauth import services
    from harness_site.celery import app

    now = timezone.now()
    client_id = device_client()

    def grant(expires_in: timedelta, status: str = DeviceGrant.AUTHORIZATION_PENDING) -> int:
        return DeviceGrant.objects.create(
            client_id=client_id,
            device_code=unique("device"),
            user_code=unique("user")[-8:],
            expires=now + expires_in,
            status=status,
        ).pk

    waiting, just_expired = grant(timedelta(minutes=20)), grant(-timedelta(minutes=30))
    old = [grant(-timedelta(hours=2)), grant(-timedelta(days=3), DeviceGrant.AUTHORIZED)]
    assert services.clear_device_codes(now) == 2
    left = set(DeviceGrant.objects.filter(client_id=client_id).values_list("pk", flat=True))
    assert left == {waiting, just_expired} and not left & set(old)
    schedule = settings.CELERY_BEAT_SCHEDULE["clear-device-codes"]
    assert schedule == {"task": "agentauth.tasks.clear_device_codes", "schedule": 3600.0}
    app.loader.import_default_modules()  # (what a worker does at start: autodiscovery)
    assert "agentauth.tasks.clear_device_codes" in app.tasks


@pytest.mark.backend_independent
def test_the_proxy_settings_are_allauths() -> None:
    """HARNESS_TRUSTED_PROXY_COUNT and HARNESS_TRUSTED_CLIENT_IP_HEADER are what allauth
    reads for every per-address limit (people's sign-ins too); a negative count is refused
    at start-up."""
    code = (
        "from django.conf import settings as s; "
        "print(s.ALLAUTH_TRUSTED_PROXY_COUNT, s.ALLAUTH_TRUSTED_CLIENT_IP_HEADER)"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "harness_site.settings",
        "HARNESS_TRUSTED_PROXY_COUNT": "2",
        "HARNESS_TRUSTED_CLIENT_IP_HEADER": "X-Real-IP",
    }
    read = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert read.stdout.split() == ["2", "X-Real-IP"], read.stderr
    env["HARNESS_TRUSTED_PROXY_COUNT"] = "-1"
    bad = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "HARNESS_TRUSTED_PROXY_COUNT is -1" in bad.stderr
    assert settings.ALLAUTH_TRUSTED_PROXY_COUNT == settings.HARNESS_TRUSTED_PROXY_COUNT


# One IPv4 /24 and one IPv6 /48 (documentation ranges), each address of them in another
# /64 for IPv6, so allauth counts each as its own address.
NETWORK_V4 = [f"192.0.2.{n}" for n in (10, 11, 12)]
NETWORK_V6 = [f"2001:db8:77:{n:x}::1" for n in (1, 2, 0xFF)]
OTHER_NETWORKS = ["192.0.3.10", "2001:db8:78::1"]


@pytest.mark.django_db
def test_one_network_cannot_fill_the_clients_cap_from_many_addresses(settings: Any) -> None:
    """Counted per address alone (IPv6 by /64), 17 IPv4 addresses or the /64s of one IPv6
    /56 filled the client's pending cap, and every `harness-hook login` got 429. A network
    (IPv4 /24, IPv6 /48) may now ask for HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK codes
    over a code's life, a few addresses' worth and at most a fifth of the cap (the rates
    below are the configured ones scaled down, as above); another network still gets
    codes."""
    rates = parse_rates(settings.ACCOUNT_RATE_LIMITS["harness_device_authorization_network"])
    life = settings.HARNESS_DEVICE_CODE_LIFE
    assert [(rate.amount, rate.duration, rate.per) for rate in rates] == [
        (settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK, life, "key")
    ]
    per_network = settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK
    assert per_network > settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE
    assert per_network * 5 <= settings.HARNESS_DEVICE_PENDING_MAX
    harness_hook_client()
    settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK = 5
    settings.ACCOUNT_RATE_LIMITS = {
        **settings.ACCOUNT_RATE_LIMITS,
        "harness_device_authorization": f"1000/60s/ip,3/{life}s/ip",
        "harness_device_authorization_network": f"5/{life}s/key",
    }
    everyone = (*NETWORK_V4, *NETWORK_V6, *OTHER_NETWORKS)
    clear_device_code_counts(*everyone)
    try:
        for network in (NETWORK_V4, NETWORK_V6):
            first, second, third = network
            assert [ask(REMOTE_ADDR=first).status_code for _ in range(3)] == [200] * 3
            assert_try_again(ask(REMOTE_ADDR=first), "from this address")
            assert [ask(REMOTE_ADDR=second).status_code for _ in range(2)] == [200] * 2
            before = DeviceGrant.objects.count()
            for address in (second, third):
                refused = ask(REMOTE_ADDR=address)
                assert_try_again(refused, "Too many device codes asked for from this network")
                assert "at most 5 in 30 minutes" in refused.json()["error_description"]
            assert DeviceGrant.objects.count() == before  # nothing stored for the refused
        for address in OTHER_NETWORKS:
            assert ask(REMOTE_ADDR=address).status_code == 200
    finally:
        clear_device_code_counts(*everyone)  # at the scaled rates (their own cache keys)


# Networks of the benchmarking range (RFC 2544, 198.18.0.0/15), one /24 each: a flood
# from eight of them, and someone else's.
FLOOD_NETWORKS = [f"198.18.{n}.1" for n in range(1, 9)]
SOMEONE_ELSE = "198.18.100.1"


def _scaled_pending(settings: Any, *, per_network: int) -> None:
    """harness-hook's client, its pending cap scaled down to 12 and a network's share to 1;
    an address asks without limit, a network `per_network` codes over a code's life."""
    life = settings.HARNESS_DEVICE_CODE_LIFE
    harness_hook_client()
    settings.HARNESS_DEVICE_PENDING_MAX = 12
    settings.HARNESS_DEVICE_PENDING_SHARE = 1
    settings.ACCOUNT_RATE_LIMITS = {
        **settings.ACCOUNT_RATE_LIMITS,
        "harness_device_authorization": f"1000/60s/ip,1000/{life}s/ip",
        "harness_device_authorization_network": f"{per_network}/{life}s/key",
    }


@pytest.mark.django_db
def test_a_few_networks_cannot_keep_the_clients_pending_codes_full(settings: Any) -> None:
    """harness-hook's client is everyone's, and one cap counted its pending codes over all
    networks: six networks, each within its own limit (180 in a code's life, against a cap
    of 1000), kept the cap full and nobody's `harness-hook login` got a code. Once half
    the cap is pending, a network holding HARNESS_DEVICE_PENDING_SHARE of the codes now
    gets no more, so another network still gets one; the cap itself stays a hard ceiling
    (scaled down: a cap of 12, 3 codes a network, a share of 1)."""
    settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK = 3
    _scaled_pending(settings, per_network=3)
    everyone = (*FLOOD_NETWORKS, SOMEONE_ELSE)
    clear_device_code_counts(*everyone)
    try:
        # The first two networks take half the places, within their own limit.
        for address in FLOOD_NETWORKS[:2]:
            assert [ask(REMOTE_ADDR=address).status_code for _ in range(3)] == [200] * 3
            assert_try_again(ask(REMOTE_ADDR=address), "from this network")
        # From then on a network holding one code gets no more.
        for held, address in enumerate(FLOOD_NETWORKS[2:4], 7):
            assert ask(REMOTE_ADDR=address).status_code == 200
            refused = ask(REMOTE_ADDR=address)
            assert_try_again(refused, f"this network ({address.rsplit('.', 1)[0]}.0/24) holds 1")
            said = refused.json()["error_description"]
            assert f"waiting for approval ({held}, of at most 12)" in said
            assert "a network holding 1 gets no more" in said
            assert 1700 <= int(refused["Retry-After"]) <= 1801  # its oldest code's expiry
        assert ask(REMOTE_ADDR=SOMEONE_ELSE).status_code == 200
        pending = DeviceGrant.objects.filter(client_id="harness-hook")
        mine = pending.filter(harness_resource__network="198.18.100.0/24")
        assert mine.count() == 1 and pending.count() == 9
        # The cap is still a ceiling, whoever asks.
        for address in FLOOD_NETWORKS[4:7]:
            assert ask(REMOTE_ADDR=address).status_code == 200
        assert_try_again(
            ask(REMOTE_ADDR=FLOOD_NETWORKS[7]),
            "Too many device codes of this client are waiting for approval: 12 at once",
        )
        assert pending.count() == 12
    finally:
        clear_device_code_counts(*everyone)  # at the scaled rates (their own cache keys)


# One holder's /48s, all of one IPv6 /32 (RFC 3849's), and someone else's /32 (RFC 9637's).
ONE_HOLDERS_NETWORKS = [f"2001:db8:{n:x}::1" for n in range(1, 13)]
ANOTHER_BLOCK = "3fff:1::1"


@pytest.mark.django_db
def test_one_holder_of_many_networks_cannot_fill_the_clients_pending_codes(
    settings: Any,
) -> None:
    """A network's share (IPv6 /48) let one holder of many of them (an IPv6 /32 holds
    65,536) ask from a new /48 each time, each holding none: it filled the client's pending
    cap and nobody's `harness-hook login` got a code. Once half the cap is pending, a
    block of networks (IPv6 /32, IPv4 /16) holding HARNESS_DEVICE_PENDING_AGGREGATE_SHARE
    gets no more either; another block still gets codes (scaled down: a cap of 12, a
    network's share 1, a block's 3)."""
    settings.HARNESS_DEVICE_PENDING_AGGREGATE_SHARE = 3
    _scaled_pending(settings, per_network=1000)
    everyone = (*ONE_HOLDERS_NETWORKS, ANOTHER_BLOCK)
    clear_device_code_counts(*everyone)
    try:
        # Half the places, from six of the holder's networks: no share counts yet.
        for address in ONE_HOLDERS_NETWORKS[:6]:
            assert ask(REMOTE_ADDR=address).status_code == 200
        # From then on a new /48 of the same /32 gets none (before: each did, to the cap).
        for address in ONE_HOLDERS_NETWORKS[6:]:
            refused = ask(REMOTE_ADDR=address)
            assert_try_again(refused, "this block of networks (2001:db8::/32) holds 3")
            said = refused.json()["error_description"]
            assert "waiting for approval (6, of at most 12)" in said
            assert 1700 <= int(refused["Retry-After"]) <= 1801  # its oldest code's expiry
        assert ask(REMOTE_ADDR=ANOTHER_BLOCK).status_code == 200
        pending = DeviceGrant.objects.filter(client_id="harness-hook")
        assert pending.count() == 7
        assert pending.filter(harness_resource__aggregate="3fff:1::/32").count() == 1
    finally:
        clear_device_code_counts(*everyone)  # at the scaled rates (their own cache keys)
