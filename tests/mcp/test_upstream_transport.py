"""upstream._Transport extends the MCP SDK's streamable-HTTP client transport through its
internals (docs/mcp.md, "Execution in the workers"; pyproject pins the SDK's minor). An
SDK that renamed or dropped one of them would silently undo a defence: one request's
failure ending the session's calls of every agent, or abandoned requests filling the HTTP
client. This says which one is gone, at once (the behaviour itself:
tests/redteam/test_concurrent_session_attacks.py)."""

from __future__ import annotations

import inspect

import httpx2
from mcp.client.streamable_http import RequestContext, StreamableHTTPTransport

from dispatcher.tools.sources import upstream

EXTENDED = ("_handle_post_request", "_consume_modern_cancellation")
USED = ("_resolve_abandoned_request", "post_writer", "handle_get_stream", "terminate_session")


def test_the_sdk_transport_still_has_what_upstream_extends_and_uses() -> None:
    missing = [n for n in EXTENDED + USED if not callable(getattr(StreamableHTTPTransport, n, 0))]
    assert missing == [], f"the SDK's transport no longer has {missing}: see upstream._Transport"
    for name in EXTENDED:  # (overridden with the SDK's own signature)
        ours = inspect.signature(getattr(upstream._Transport, name))
        assert ours == inspect.signature(getattr(StreamableHTTPTransport, name)), name
    transport = upstream._Transport("http://127.0.0.1:9/mcp")
    assert transport._in_flight_posts == {} and transport.session_id is None
    assert {"session_message", "read_stream_writer"} <= set(RequestContext.__dataclass_fields__)


def test_the_sdk_still_has_what_the_lean_call_uses() -> None:
    """upstream.lean_call sends an allowed tools/call through the SDK's own parts, private
    ones among them: an SDK without one says so here (LEAN_CALLS = False is the way back)."""
    from mcp import ClientSession
    from mcp.client import session as sdk_session
    from mcp.shared import jsonrpc_dispatcher

    wanted = {
        sdk_session: ("_clamp_inbound_ttl", "_later_revision_fields", "_input_required_unexpected"),
        jsonrpc_dispatcher: ("_plan_outbound", "_ABANDON_WRITE_TIMEOUT"),
        jsonrpc_dispatcher.JSONRPCDispatcher: ("_final_write", "_cancel_outbound"),
        ClientSession: ("validate_tool_result",),
        # (`_Transport.lean_post`: the SDK's own handling of an answer's parts, and what
        # httpx2's client does with one, done without its client)
        upstream._Transport("http://127.0.0.1:9/mcp"): (
            "_prepare_headers",
            "_handle_sse_event",
            "_handle_reconnection",
            "max_sse_event_size",
        ),
        httpx2.AsyncClient(): ("_build_redirect_request", "_transport", "max_redirects"),
    }
    missing = [
        f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
        for owner, names in wanted.items()
        for name in names
        if not hasattr(owner, name)
    ]
    source = inspect.getsource(ClientSession)  # (attributes each session sets itself)
    for name in ("_stamp", "_call_tool_adapter", "_negotiated_version", "_dispatcher"):
        if f"self.{name} =" not in source and f"self.{name}:" not in source:
            missing.append(f"ClientSession().{name}")
    assert missing == [], f"the SDK no longer has {missing}: see upstream.lean_call"
