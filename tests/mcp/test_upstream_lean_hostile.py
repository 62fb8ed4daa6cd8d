"""`upstream.lean_call` against a hostile HTTP server (tests/support/mcp_lean_hostile.py):
every way it misbehaves in answering a call ends the call as the SDK's
`ClientSession.call_tool` ends it (`upstream.LEAN_CALLS` off): the same text or error for
the model, the same session kept or replaced."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from dispatcher.tools.base import ToolError
from dispatcher.tools.sources import upstream
from floor import outbound
from tests.mcp.test_upstream_lean import both_ways, outcomes, serve
from tests.support.live import free_port, stop
from tests.support.paths import ROOT

LEAN_HOSTILE = ROOT / "tests" / "support" / "mcp_lean_hostile.py"


@pytest.fixture
def lean_hostile(tmp_path: Path, settings: Any) -> Iterator[str]:
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}", f"127.0.0.2:{port}"]
    argv = [sys.executable, str(LEAN_HOSTILE), str(port), str(tmp_path / "calls.txt")]
    proc = serve(argv, port, tmp_path / "up.log")
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.fixture
def lean_hostile_tls(tmp_path: Path, settings: Any) -> Iterator[str]:
    """The hostile server over TLS, its certificate (for 127.0.0.1) issued by a private
    authority the door is given (HARNESS_OUTBOUND_CA_FILE)."""
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    settings.HARNESS_OUTBOUND_CA_FILE = str(tmp_path / "ca.pem")
    pem = tmp_path / "server.pem"
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    argv = [sys.executable, str(LEAN_HOSTILE), str(port), str(tmp_path / "calls.txt"), str(pem)]
    proc = serve(argv, port, tmp_path / "up.log")
    try:
        yield f"https://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "tool",
    [
        "other_id", "numeric_id", "json_request", "batch", "sse_other_id", "sampling",
        "elicit", "roots", "endless", "big_event", "flood", "extra", "failing",
        "typed", "accepted", "redirect", "json_error", "forget",
    ],
)  # fmt: skip
def test_a_hostile_answer_ends_the_call_the_same_both_ways(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    monkeypatch.setattr(upstream, "ANSWER_BYTES", 4 << 20)  # (the flood's cap, sooner)
    calls: list[tuple[str, dict[str, Any]]] = [(tool, {}), ("echo", {"text": "next"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=3))
    assert lean == sdk
    # (a forgetful server's next call finds its session unknown, both ways, and the one
    # after it a new session)
    assert lean[2] == "False echo: next" or tool == "forget", lean


def test_calls_sharing_a_session_never_take_each_others_answer(lean_hostile: str) -> None:
    """Two calls in flight at once on one session (of two agents, say), the server
    answering each under the other's id (a JSON body's id is the server's to write): a
    lean call takes only an answer under its own id, so neither takes the other's; each
    ends at its timeout, as a call of the SDK's whose answer never comes. (The SDK's
    dispatcher routes a JSON answer by its id: there, each would be given the other's.)"""

    async def scenario() -> list[str]:
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=lean_hostile, timeout=3
        )
        with contextlib.suppress(upstream.DefinitionChanged):  # (the session, opened)
            await pool.call_async(endpoint, "echo", "", {"text": ""})
        connection = pool._on_this_loop()[endpoint.key]
        assert connection.transport is not None and connection.session is not None
        assert upstream.lean_ready(connection.session, connection.transport)
        fingerprint = connection.definitions["swap"].fingerprint
        seen = []
        try:
            for got in await asyncio.gather(
                pool.call_async(endpoint, "swap", fingerprint, {"text": "agent a"}),
                pool.call_async(endpoint, "swap", fingerprint, {"text": "agent b"}),
                return_exceptions=True,
            ):
                if isinstance(got, BaseException):
                    seen.append(f"{type(got).__name__}: {got}")
                else:
                    seen.append(upstream.result_text(got))
        finally:
            for held in list(pool._on_this_loop().values()):
                await held.close()
        return seen

    assert asyncio.run(scenario()) == ["TimeoutError: no answer within its timeout"] * 2


def test_a_stream_of_many_messages_before_the_answer_ends_the_same_both_ways(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3000 log notifications on the call's SSE stream, then its result: each goes on to
    the session, and the call gets its result, both ways."""
    calls: list[tuple[str, dict[str, Any]]] = [("many", {}), ("echo", {"text": "next"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=20))
    assert lean == sdk
    assert lean[0] == "False after many" and lean[2] == "False echo: next", lean


def test_many_calls_on_one_session_with_some_cancelled_mid_answer_get_their_own_answers(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """48 calls at once on one kept session (of as many agents), 8 more cancelled by their
    callers while their SSE answers stream in: each call that ends gets its own answer,
    and the next call on the session too, both ways; the session is kept."""

    calls_file = tmp_path / "calls.txt"

    async def scenario() -> list[str]:
        calls_file.unlink(missing_ok=True)
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=lean_hostile, timeout=20
        )
        with contextlib.suppress(upstream.DefinitionChanged):  # (the session, opened)
            await pool.call_async(endpoint, "echo", "", {"text": ""})
        connection = pool._on_this_loop()[endpoint.key]
        definitions = connection.definitions
        endless = [
            asyncio.create_task(
                pool.call_async(endpoint, "endless", definitions["endless"].fingerprint, {})
            )
            for _ in range(8)
        ]
        echo = definitions["echo"].fingerprint
        calls = [pool.call_async(endpoint, "echo", echo, {"text": f"agent {n}"}) for n in range(48)]
        try:
            # (the endless calls' answers streaming: each has begun its SSE answer)
            while not calls_file.exists() or calls_file.read_text().count("endless") < 8:
                await asyncio.sleep(0.02)
            got = asyncio.gather(*calls)
            for task in endless:
                task.cancel()
            seen = [upstream.result_text(result) for result in await got]
            for task in endless:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            after = await pool.call_async(endpoint, "echo", echo, {"text": "after"})
            seen.append(upstream.result_text(after))
            seen.append(f"kept: {pool._on_this_loop().get(endpoint.key) is connection}")
        finally:
            for held in list(pool._on_this_loop().values()):
                await held.close()
        return seen

    lean, sdk = both_ways(monkeypatch, lambda: asyncio.run(scenario()))
    assert lean == sdk
    assert lean == [f"echo: agent {n}" for n in range(48)] + ["echo: after", "kept: True"]


# What the call after each malformed answer gets (the session kept, its connection not
# reused when bytes came after the answer's end), where it is not "False echo: next".
AFTER = {"set_cookie": "False echo: next (cookie a=b)"}


@pytest.mark.parametrize(
    "tool",
    [
        "bad_status", "bad_version", "huge_header", "endless_header", "hang", "bad_chunk",
        "bad_chunk_sse", "chunked", "short_body", "long_body", "http10", "conn_close", "gzip",
        "sse_cut", "sse_latin1", "redirect_here", "set_cookie",
    ],
)  # fmt: skip
def test_malformed_http_ends_the_call_the_same_both_ways(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """Each answer that breaks HTTP/1.1 (or bends it) ends the lean call as it ends the
    SDK's: a bad status line, version, chunk size or length; headers too large or without
    end, a body that never comes (the call's bound), a second answer smuggled after the
    first; and the call after it, on a connection of its own, gets its own answer."""
    calls: list[tuple[str, dict[str, Any]]] = [(tool, {}), ("echo", {"text": "next"})]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=3))
    assert lean == sdk
    assert lean[2] == AFTER.get(tool, "False echo: next"), lean


def test_a_malformed_answer_is_refused_with_a_clear_error(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the model is told of each (lean; the SDK's way tells the same: above): the
    server stopped mid-call, not known whether the call took effect; nothing the server
    sent is quoted; the answer smuggled behind another's end is given to no call."""
    tools = ("bad_status", "huge_header", "bad_chunk", "short_body", "gzip", "long_body")
    calls: list[tuple[str, dict[str, Any]]] = [(tool, {}) for tool in tools]
    monkeypatch.setattr(upstream, "LEAN_CALLS", True)
    seen = outcomes(lean_hostile, calls, timeout=3)[::2]
    for tool, line in zip(tools[:-1], seen, strict=False):
        assert line == (
            f"ToolError: The MCP server 'lean' stopped while running '{tool}', so it is not "
            "known whether the call took effect. The server is started again for the next "
            "call; check the state before trying again."
        )
    assert seen[-1] == "False long"


def test_a_session_id_with_a_tab_and_a_space_is_sent_back_as_it_was_given(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session id holding a tab and a space (as a header's value may) is sent back the
    same both ways; a header line of its own can never be put in it (h11 reads none)."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("odd_session", {}),
        ("echo", {"text": "forgotten"}),
        ("echo", {"text": "odd"}),
        ("echo", {"text": "again"}),
    ]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile, calls, timeout=3))
    assert lean == sdk
    assert lean[2:] == [
        "UpstreamError: Session terminated (MCP error -32600)",
        "replaced: True",
        "False echo: odd",  # (the new session's, its id sent back whole: the server knew it)
        "replaced: False",
        "False echo: again",
        "replaced: False",
    ]


def test_an_https_upstream_is_called_the_same_both_ways(
    lean_hostile_tls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over TLS (the door's context: its private authority), a JSON answer, an SSE one and
    one with a second answer smuggled behind it (in a record not yet decrypted when the
    connection goes back to the pool) end the same both ways, each call its own answer."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"text": "a"}),
        ("sse_latin1", {}),
        ("long_body", {}),
        ("echo", {"text": "next"}),
    ]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(lean_hostile_tls, calls, timeout=3))
    assert lean == sdk
    assert lean[::2] == ["False echo: a", "False caf\xe9", "False long", "False echo: next"]


def test_a_new_connection_of_a_lean_call_passes_the_door(
    lean_hostile: str, monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path
) -> None:
    """A lean call's new connection is made through the door: once the server's address
    is no longer allowed, the call is refused there, both ways (no connection kept idle
    here, so that each call makes its own)."""
    monkeypatch.setattr(outbound, "KEEPALIVE_SECONDS", 0)

    async def scenario() -> list[str]:
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=lean_hostile, timeout=3
        )
        with contextlib.suppress(upstream.DefinitionChanged):  # (the session, opened)
            await pool.call_async(endpoint, "echo", "", {"text": ""})
        definitions = pool._on_this_loop()[endpoint.key].definitions
        seen = []
        try:
            first = await pool.call_async(
                endpoint, "echo", definitions["echo"].fingerprint, {"text": "allowed"}
            )
            seen.append(upstream.result_text(first))
            allowed = settings.HARNESS_OUTBOUND_ALLOW
            settings.HARNESS_OUTBOUND_ALLOW = []
            try:
                await pool.call_async(endpoint, "echo", definitions["echo"].fingerprint, {})
            except (upstream.UpstreamError, ToolError) as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
            settings.HARNESS_OUTBOUND_ALLOW = allowed
        finally:
            for held in list(pool._on_this_loop().values()):
                await held.close()
        return seen

    lean, sdk = both_ways(monkeypatch, lambda: asyncio.run(scenario()))
    assert lean == sdk
    assert lean[0] == "echo: allowed" and "stopped while running 'echo'" in lean[1], lean
    # (the server got each way's first call, never its second: refused at the door)
    assert (tmp_path / "calls.txt").read_text().split() == ["echo"] * 2
