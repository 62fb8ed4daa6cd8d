"""Red team of the lean upstream call (rt3h1): `upstream.lean_call`'s POST sent by
httpcore2 on the session client's pool (`outbound.exchange`), against the hostile server
(tests/support/mcp_lean_hostile.py), each case run both ways (`upstream.LEAN_CALLS`)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx2
import pytest

from dispatcher.tools.base import ToolError
from dispatcher.tools.sources import upstream
from floor import outbound
from tests.mcp.test_upstream_lean import both_ways, outcomes
from tests.mcp.test_upstream_lean_hostile import lean_hostile  # noqa: F401 - a fixture

__all__ = ["lean_hostile"]


def test_credentials_in_the_servers_url_are_sent_both_ways(
    lean_hostile: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An endpoint registered as http://user:secret@host/mcp: httpx2's client sends the
    URL's userinfo as Basic credentials with every request; the lean call sent none, so
    every tool call of such a server met its 401 (or reached it unauthenticated)."""
    url = lean_hostile.replace("http://", "http://agent:secret@")
    calls: list[tuple[str, dict[str, Any]]] = [("echo", {"text": "a"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(url, calls, timeout=5))
    assert lean == sdk
    assert lean[0] == "False echo: a (basic agent)", lean


def test_many_headers_of_one_name_end_the_same_both_ways(
    lean_hostile: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """24,000 headers of one name (within h11's 100 KiB), joined by the lean call's
    `outbound._decoded` as httpx2's `Headers` join them: the same answer both ways, and
    the next call its own. (Measured: h11's parsing holds the loop some 0.4 s either way;
    the lean call's joining, 0.03 s of CPU.)"""
    calls: list[tuple[str, dict[str, Any]]] = [("many_headers", {}), ("echo", {"text": "b"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=10))
    assert lean == sdk
    assert lean[::2] == ["False many headers", "False echo: b"], lean


def test_headers_read_as_httpx2_reads_them() -> None:
    """`outbound._decoded` gives each name what httpx2's `Headers.get` gives (a repeated
    header's values joined with ", ", in order; one encoding for all)."""
    raw = [(b"A", b"1"), (b"b", b"\xe9"), (b"a", b""), (b"A", b"3"), (b"c", b"x")]
    expected = httpx2.Headers(raw)
    assert outbound._decoded(raw) == {name: expected[name] for name in ("a", "b", "c")}


def test_a_closed_clients_pool_sends_nothing(lean_hostile: str, tmp_path: Path) -> None:  # noqa: F811
    """A lean call racing its session's end (the session's client closed under it):
    httpx2's client refuses to send on a closed client; `exchange`, which goes to the
    pool itself, opened a new connection on the closed pool (never closed again) and sent
    the request."""

    async def scenario() -> str:
        client = outbound.async_client()
        await client.aclose()
        try:
            async with outbound.exchange(
                client, "POST", httpx2.URL(lean_hostile), [(b"Host", b"x")], b""
            ):
                pass
        except RuntimeError as exc:
            return str(exc)
        return "sent"

    assert asyncio.run(scenario()) == "Cannot send a request, as the client has been closed."


# What the hostile answers below give the lean call, the same as the SDK's way (checked).
HELD = {
    "early_hints": "False hinted",
    "trailers": "False trailed",
    "two_types": "False typed twice",
    "late_answer": "False on time",
}
# (an answer written before the next request was read is that request's answer, both
# ways: the server's to give, as it could give it anyway; the connection is its session's
# own, never another server's, nor another session's)
AFTER = {"late_answer": "False late"}


@pytest.mark.parametrize(
    "tool",
    [
        "early_hints", "switching", "trailers", "two_types", "late_answer", "redirect_loop",
        "redirect_userinfo", "redirect_file", "redirect_metadata",
    ],
)  # fmt: skip
def test_more_hostile_answers_end_the_same_both_ways(
    lean_hostile: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
) -> None:
    """Informational answers before the answer, a 101 holding one, trailers (a session id
    among them), two content types, an answer nobody asked for arriving on the kept
    connection, redirects without end, to another user, another scheme, the metadata
    address: each ends the lean call as it ends the SDK's, and the call after it gets
    its own answer (never the late one)."""
    calls: list[tuple[str, dict[str, Any]]] = [(tool, {}), ("echo", {"text": "next"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=3))
    assert lean == sdk
    assert lean[2] == AFTER.get(tool, "False echo: next"), lean
    if tool in HELD:
        assert lean[0] == HELD[tool], lean


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("2002:7f00:1::1", "a loopback address"),
        ("2002:a9fe:a9fe::1", "a cloud metadata address"),
        ("2002:a00:1::1", "a private address"),
    ],
)
def test_a_6to4_address_of_a_refused_ipv4_address_is_refused(
    address: str, kind: str, settings: Any
) -> None:
    """An upstream's name resolving to 2002:a.b.c.d:: (6to4), which a host with a 6to4
    interface or relay sends to a.b.c.d: the door read it as a public IPv6 address."""
    settings.HARNESS_OUTBOUND_ALLOW = []
    with pytest.raises(outbound.OutboundRefused) as refused:
        outbound.checked_addresses(address, 80)
    assert str(refused.value) == f"refused: {kind} ({address})"


@pytest.mark.parametrize("name", ["Host", "host", "Content-Length", "Accept-Encoding"])
def test_a_configured_header_httpx2_sets_itself_is_sent_once_both_ways(
    lean_hostile: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    """An admin's header for the server (McpServer.headers) named as one httpx2 writes
    itself (a Host for a virtual host reached by address, say): httpx2's client sends
    one; `_Sent` put its own Host (or Content-Length) beside the configured one, two of
    them, which h11 refuses to send, so every lean call failed."""
    value = {"content-length": "0", "accept-encoding": "gzip"}.get(name.lower(), "virtual.test")

    async def scenario() -> list[str]:
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=lean_hostile,
            headers=((name, value),), timeout=5,
        )  # fmt: skip
        seen: list[str] = []
        try:
            with contextlib.suppress(upstream.DefinitionChanged):  # (the session, opened)
                await pool.call_async(endpoint, "echo", "", {"text": ""})
            definitions = pool._on_this_loop()[endpoint.key].definitions
            try:
                result = await pool.call_async(
                    endpoint, "echo", definitions["echo"].fingerprint, {"text": "a"}
                )
                seen.append(upstream.result_text(result))
            except (upstream.UpstreamError, ToolError) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the session did not open: said as such
            seen.append(f"{type(exc).__name__}")
        finally:
            for held in list(pool._on_this_loop().values()):
                await held.close()
        return seen

    lean, sdk = both_ways(monkeypatch, lambda: asyncio.run(scenario()))
    assert lean == sdk
    assert lean == ["echo: a"] or name.lower() != "host", lean
