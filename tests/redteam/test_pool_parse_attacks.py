"""Red-team of two changes: the upstream pool's refusal of a call resolved before its
server's configuration changed (`upstream.Pool._connection`: each loop's memo of the
configurations it saw replaced, and the (server id, version) ordering rule), and the MCP
gateway's body read once as the SDK's transport reads it (`mcp_http.parse_messages`,
shared with the fast path). Each test is an attack through the pool's lanes against the
hostile upstream process (tests/support/mcp_hostile_upstream.py) or through the real
gateway (/mcp/) in this process; it passes when the attack fails.

Found and fixed: a call resolved before a change, arriving on a loop after the process's
catalog rebuild retired the old session there (`Pool.keep_only`) but before any call of
the new configuration, opened a session of the OLD configuration again (its header used
after the change), which then retired the new one's: the rebuild's retirement now
remembers a configuration replaced by a newer one of its server in the catalog.

And the same stale call of a server REMOVED (not registered again) reopened the removed
server's session after the rebuild retired it, kept until the next rebuild: the rebuild
now tells the pool which servers it held a session of no longer exist."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.models import Status
from dispatcher.tools.sources import catalog, services
from dispatcher.tools.sources import upstream as upstream_module
from tests.mcp.test_fast_path import Gateway, call, gateway, pending_in
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import Hostile, ServingLoop, register, register_as
from tests.redteam.test_session_retire_attacks import (
    connections_of,
    lines,
    probe_on,
    target,
)
from tests.support.factories import AgentFixture, make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

gateway = gateway  # (the gateway in this process: tests/mcp/test_fast_path.py)
hostile = loop_attacks.hostile
serving = loop_attacks.serving

REFUSED = f"UpstreamError: {upstream_module.SUPERSEDED}"


def until_no_session(loop: Any, name: str) -> None:
    """Until the rebuild's retirement (posted to the loop) has run there."""
    deadline = time.monotonic() + 10
    while connections_of(loop, name):
        assert time.monotonic() < deadline, "the rebuild did not retire the old session"
        time.sleep(0.05)


def opened_after(hostile: Hostile, since: float) -> list[str]:
    return [probe["probe"] for at, probe in lines(hostile, "initialize") if at > since]


def test_a_stale_call_after_the_rebuild_retired_its_session_never_reopens_the_old(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The server is registered again under its name with another header; the process's
    catalog is rebuilt (its retirement of the old session runs on the serving loop), and a
    call looked up before the change arrives there before any call of the new
    configuration. It must be refused, not open a session with the old header; and the
    new configuration's first call must then be served on a session of its own, kept."""
    name = register(hostile.url, "--header", "X-Probe=old")
    old, old_fingerprint = target(name, "probe")
    assert probe_on(serving.loop, old, old_fingerprint) == "old"
    Path(f"{hostile.calls_file}.initialize-log").write_text("")  # (initializes logged)
    services.remove_server(name=name, actor="rtparse")
    register_as(name, hostile.url, "--header", "X-Probe=new")
    new, fingerprint = target(name, "probe")  # (the rebuild: keep_only)
    until_no_session(serving.loop, name)
    changed_at = time.time()
    refused = probe_on(serving.loop, old, old_fingerprint)
    assert refused == REFUSED, refused  # (before the fix: "old", its header used again)
    assert probe_on(serving.loop, new, fingerprint) == "new"
    [session] = connections_of(serving.loop, name)
    assert probe_on(serving.loop, old, old_fingerprint) == REFUSED
    assert probe_on(serving.loop, new, fingerprint) == "new"
    assert opened_after(hostile, changed_at) == ["new"], hostile.calls()
    assert connections_of(serving.loop, name) == [session]
    services.remove_server(name=name, actor="rtparse")


def test_a_stale_worker_call_after_the_rebuild_never_reopens_the_old(hostile: Hostile) -> None:
    """The same on the worker lane (`Pool.call` from a thread, onto the pool's own loop)."""
    pool = upstream_module.POOL
    name = register(hostile.url, "--header", "X-Probe=old")
    old, old_fingerprint = target(name, "probe")
    first = pool.call(old, "probe", old_fingerprint, {})
    assert upstream_module.result_text(first).split("\n")[0] == "old"
    Path(f"{hostile.calls_file}.initialize-log").write_text("")  # (initializes logged)
    services.remove_server(name=name, actor="rtparse")
    register_as(name, hostile.url, "--header", "X-Probe=new")
    new, fingerprint = target(name, "probe")
    until_no_session(pool.loop(), name)
    changed_at = time.time()
    with pytest.raises(upstream_module.UpstreamError, match="configuration changed"):
        pool.call(old, "probe", old_fingerprint, {})
    again = pool.call(new, "probe", fingerprint, {})
    assert upstream_module.result_text(again).split("\n")[0] == "new"
    assert opened_after(hostile, changed_at) == ["new"], hostile.calls()
    services.remove_server(name=name, actor="rtparse")


def test_a_configuration_a_rebuild_did_not_replace_is_not_refused() -> None:
    """No false refusal: a rebuild that no longer offers a configuration without a newer
    one of its server, its server still registered (its tools awaiting review), remembers
    nothing, and one that
    offers an older configuration than the open one (a rebuild behind another) never makes
    the newer refused; checked on the pool's bookkeeping (port 9: nothing answers)."""
    pool = upstream_module.Pool()
    v2 = upstream_module.Endpoint(
        server_id=7, version=2, name="v", transport="http", url="http://127.0.0.1:9/a"
    )
    v1 = upstream_module.Endpoint(
        server_id=7, version=1, name="v", transport="http", url="http://127.0.0.1:9/b"
    )

    async def scenario() -> dict[upstream_module.Endpoint, None]:
        pool._on_this_loop()[v2] = upstream_module.Connection(v2)
        pool._retire_all_but(frozenset({v1}))  # (a rebuild that read older rows)
        pool._retire_all_but(frozenset())  # (nothing offered)
        await asyncio.sleep(0)
        with pytest.raises(upstream_module.UpstreamError) as refused:
            await pool._connection(v2)  # (its start fails: port 9; not SUPERSEDED)
        assert upstream_module.SUPERSEDED not in str(refused.value)
        return pool._superseded.get(asyncio.get_running_loop(), {})

    assert asyncio.run(scenario()) == {}


@pytest.mark.parametrize(("held_here", "other_loop"), [(True, False), (True, True), (False, True)])
def test_a_stale_call_of_a_removed_server_never_reopens_its_session(
    hostile: Hostile, serving: ServingLoop, held_here: bool, other_loop: bool
) -> None:
    """The server is removed (not registered again) and the catalog rebuilt: its session
    on the serving loop (`held_here`) is retired. A call looked up before the removal then
    arrives, on that loop or on another of the process that never held a session of it:
    it must not open a session of the removed registration (its URL and headers used
    after the removal, the session then kept open until the next rebuild)."""
    name = register(hostile.url, "--header", "X-Probe=old")
    old, old_fingerprint = target(name, "probe")
    other = ServingLoop() if other_loop else serving
    try:
        if held_here:
            assert probe_on(serving.loop, old, old_fingerprint) == "old"
        Path(f"{hostile.calls_file}.initialize-log").write_text("")  # (initializes logged)
        services.remove_server(name=name, actor="rtparse")
        catalog.upstream_tools()  # (the rebuild: keep_only)
        until_no_session(serving.loop, name)
        removed_at = time.time()
        answered = probe_on(other.loop, old, old_fingerprint)
        assert opened_after(hostile, removed_at) == [], (answered, hostile.calls())
        assert connections_of(other.loop, name) == []
        assert answered == f"UpstreamError: {upstream_module.SUPERSEDED}"
    finally:
        if other is not serving:
            other.close()


# --- The body read once, as the SDK reads it ---------------------------------------------

MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "rtparse", "version": "1"},
}


def discover(extra_meta: str = "") -> bytes:
    """A 2026-07-28 server/discover, its `_meta` with one more member written as is."""
    meta = json.dumps(ENVELOPE)[:-1] + (f', "x": {extra_meta}' if extra_meta else "") + "}"
    return (
        '{"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": '
        + meta
        + "}}"
    ).encode()


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(discover(), id="plain"),
        pytest.param(b"\xef\xbb\xbf" + discover(), id="utf8-bom"),
        pytest.param(discover().decode().encode("utf-16"), id="utf16"),
        pytest.param(discover('"\\ud800"'), id="lone-surrogate"),
        pytest.param(discover("[" * 300 + "]" * 300), id="nested-300"),
    ],
)
def test_a_modern_request_is_read_as_the_sdks_modern_entry_reads_it(
    gateway: Callable[[AgentFixture], Gateway], raw: bytes
) -> None:
    """A 2026-07-28 request goes to the SDK's per-request entry, which reads the body with
    `json.loads` (not `pydantic_core.from_json`, the handshake era's transport): a body it
    reads (a BOM, UTF-16, a lone surrogate, nesting past pydantic_core's 200 levels) must
    be read by Harness too, not answered 400 "missing_session" before the SDK sees it."""
    g = gateway(make_agent())
    answer = g.post(raw, extra={"mcp-protocol-version": MODERN, "mcp-method": "server/discover"})
    assert answer.status == 200, answer.body
    [message] = answer.messages()
    assert MODERN in message["result"]["supportedVersions"], message


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"content-type": "text/plain"}, id="content-type"),
        pytest.param({"accept": "application/json"}, id="accept-no-sse"),
        pytest.param({"mcp-protocol-version": "2099-01-01"}, id="unsupported-version"),
        pytest.param({"mcp-protocol-version": MODERN}, id="modern-dropped-by-the-sdk"),
    ],
)
def test_a_cancellation_the_sdk_refuses_cancels_nothing(
    gateway: Callable[[AgentFixture], Gateway], extra: dict[str, str]
) -> None:
    """A call held for a reviewer; a notifications/cancelled for it is posted with headers
    the SDK's transport refuses (415, 406, an unsupported revision), or at 2026-07-28,
    whose entry acknowledges and drops it (docs/mcp.md, "Cancellation"): the SDK does not
    take it, so Harness must not have cancelled the call before handing it on."""
    g = gateway(make_agent())
    session = g.session()
    hang_up = threading.Event()
    prompt = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}
    held = threading.Thread(
        target=lambda: g.post(call(9, "approval_prompt", prompt), session, hang_up=hang_up),
        daemon=True,
    )
    held.start()
    try:
        pending = pending_in(session)
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
        refused = g.post(note, session, extra)
        assert refused.status >= 400 or extra.get("mcp-protocol-version") == MODERN, refused
        pending.refresh_from_db()
        assert pending.status == Status.PENDING_APPROVAL, refused.body
    finally:
        hang_up.set()
        held.join(30)
