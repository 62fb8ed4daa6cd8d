"""Start-up checks that name every setting weakening one of Harness's promises (DESIGN
principle 13): a warning each, an error where the setting cannot be run at all. No
database access. Registered by dispatcher.apps."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from floor import outbound
from harness_site.secret_key import weak_secret_key


@register()
def check_outbound(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """HARNESS_OUTBOUND_ALLOW must parse; its inward entries are named."""
    try:
        allowed = outbound.parse_allow(settings.HARNESS_OUTBOUND_ALLOW)
    except ValueError as error:
        return [
            Error(
                f"HARNESS_OUTBOUND_ALLOW: {error}.",
                hint="List hosts, host:port pairs, addresses or networks, comma-separated, "
                "e.g. 'hooks.internal,127.0.0.1:8025,10.1.0.0/16'.",
                id="harness.E001",
            )
        ]
    problems: list[CheckMessage] = []
    if settings.HARNESS_OUTBOUND_TIMEOUT <= 0 or settings.HARNESS_OUTBOUND_MAX_BYTES <= 0:
        problems.append(
            Error(
                "HARNESS_OUTBOUND_TIMEOUT and HARNESS_OUTBOUND_MAX_BYTES must be positive.",
                id="harness.E002",
            )
        )
    inward = [str(n) for n in allowed.networks if _inward(n)]
    inward += [
        f"{n.network_address if n.num_addresses == 1 else n}:{p}"
        for n, p in allowed.network_ports
        if _inward(n)
    ]
    inward += sorted(allowed.hosts) + sorted(f"{h}:{p}" for h, p in allowed.host_ports)
    if inward:
        problems.append(
            Warning(
                "HARNESS_OUTBOUND_ALLOW lets Harness's requests (webhooks, Web Push, MCP "
                f"servers, ...) reach {', '.join(inward)}: names are trusted whatever they "
                "resolve to, and these addresses may be internal.",
                hint="List only the destinations Harness must reach, as host:port where you can.",
                id="harness.W003",
            )
        )
    return problems


def _inward(network: outbound.Network) -> bool:
    return bool(outbound.kind_of(network.network_address)) or network.prefixlen < (
        8 if isinstance(network, ipaddress.IPv4Network) else 16
    )


@register()
def check_weakened_promises(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every other setting that weakens a promise, named."""
    problems: list[CheckMessage] = []
    weak = weak_secret_key(settings.SECRET_KEY)
    if weak and not settings.HARNESS_LINKS_REQUIRE_LOGIN:
        # settings.py already refuses to start; kept for settings changed in a process.
        problems.append(
            Error(
                f"HARNESS_LINKS_REQUIRE_LOGIN is false and the secret key {weak}: anyone "
                "who knows the key can sign a link that decides.",
                hint="Set HARNESS_SECRET_KEY to a long random string.",
                id="harness.E003",
            )
        )
    elif weak:
        problems.append(
            Warning(
                f"HARNESS_SECRET_KEY {weak}: sessions, CSRF tokens and links can be forged.",
                hint="Set a long random string, or unset it on the embedded default.",
                id="harness.W001",
            )
        )
    for check_id, name, weakened, what in _switches():
        if weakened:
            problems.append(Warning(f"{name}: {what}.", id=check_id))
    return problems


@register()
def check_device_network_cap(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """One network's share of a client's pending device codes must stay well under the
    half of HARNESS_DEVICE_PENDING_MAX kept for networks that hold few
    (agentauth.views._pending_full): a network with its share may fill no more than that
    share of it. At or above that half, one network fills it, and no one else can sign in
    until those codes expire; above a fiftieth of it, fewer than fifty networks do."""
    cap = settings.HARNESS_DEVICE_PENDING_MAX
    share = settings.HARNESS_DEVICE_PENDING_SHARE
    if cap == 0:  # no cap: nothing to fill
        return []
    kept = cap - cap // 2
    said = (
        f"HARNESS_DEVICE_PENDING_SHARE ({share}) is {{}} half of HARNESS_DEVICE_PENDING_MAX "
        f"({cap}), the places kept for networks that hold few codes"
    )
    hint = (
        f"Set HARNESS_DEVICE_PENDING_SHARE to at most {max(kept // 50, 1)} (a fiftieth of "
        "half of HARNESS_DEVICE_PENDING_MAX), or raise HARNESS_DEVICE_PENDING_MAX."
    )
    if share >= kept:
        return [
            Error(
                said.format("not below")
                + ": one network can fill every pending device code of the client, and no "
                "one else can sign in until those codes expire.",
                hint=hint,
                id="harness.E004",
            )
        ]
    if share * 50 > kept:
        return [
            Warning(
                said.format("more than a fiftieth of")
                + ": fewer than fifty networks can fill every pending device code of the "
                "client, and no one else can sign in until those codes expire.",
                hint=hint,
                id="harness.W016",
            )
        ]
    return []


@register()
def check_device_block_cap(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """A block of networks' share of a client's pending device codes (an IPv4 /16, an IPv6
    /32: agentauth.views._pending_full) must stay below the half of
    HARNESS_DEVICE_PENDING_MAX kept for networks that hold few: at or above it, one holder
    of a block's many networks fills it, and no one else can sign in until those codes
    expire."""
    cap = settings.HARNESS_DEVICE_PENDING_MAX
    share = settings.HARNESS_DEVICE_PENDING_AGGREGATE_SHARE
    kept = cap - cap // 2
    if cap == 0 or share < kept:
        return []
    return [
        Error(
            f"HARNESS_DEVICE_PENDING_AGGREGATE_SHARE ({share}) is not below half of "
            f"HARNESS_DEVICE_PENDING_MAX ({cap}), the places kept for networks that hold few "
            "codes: one block of networks (an IPv4 /16, an IPv6 /32) can fill every pending "
            "device code of the client, and no one else can sign in until those codes expire.",
            hint=f"Set HARNESS_DEVICE_PENDING_AGGREGATE_SHARE to at most {max(kept // 10, 1)} "
            "(a tenth of half of HARNESS_DEVICE_PENDING_MAX), or raise "
            "HARNESS_DEVICE_PENDING_MAX.",
            id="harness.E005",
        )
    ]


@register(deploy=True)
def check_self_approval(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Before going live (`check --deploy`): the default lets one person be an agent's owner
    and the reviewer of its calls. Right for one developer on their own machine, so it
    is named only here, not at every start."""
    if settings.HARNESS_FORBID_SELF_APPROVAL:
        return []
    return [
        Warning(
            "HARNESS_FORBID_SELF_APPROVAL=false: an agent's owner (its sponsor, the person "
            "whose sign-in started its sessions) may approve that agent's calls.",
            hint="Set HARNESS_FORBID_SELF_APPROVAL=true where a second person must decide.",
            id="harness.W015",
        )
    ]


def _switches() -> list[tuple[str, str, bool, str]]:
    """(check id, setting, whether it is set so, what it weakens)."""
    return [
        (
            "harness.W010",
            "HARNESS_LINKS_REQUIRE_LOGIN=false",
            not settings.HARNESS_LINKS_REQUIRE_LOGIN,
            "whoever holds a one-tap link decides as its recipient, without signing in",
        ),
        (
            "harness.W011",
            "HARNESS_SANDBOX=off",
            settings.HARNESS_SANDBOX == "off",
            "programs tools start run without the sandbox, with Harness's own access",
        ),
        (
            "harness.W012",
            "HARNESS_SANDBOX_NETWORK=true",
            settings.HARNESS_SANDBOX_NETWORK,
            "sandboxed programs can reach the network",
        ),
        (
            "harness.W013",
            "HARNESS_DEBUG=true",
            settings.DEBUG,
            "error pages show settings and code to anyone",
        ),
        (
            "harness.W014",
            "HARNESS_ALLOW_DESTRUCTIVE=true",
            settings.HARNESS_ALLOW_DESTRUCTIVE,
            "the standard mode asks for destructive tools instead of denying them",
        ),
    ]
