"""JSON-RPC bodies the MCP tests send by hand, where the SDK's client would hide what the
test is about (a header, a session id, a revision, a cap)."""

from __future__ import annotations

from typing import Any

# The handshake revision these tests speak unless they are about another.
HANDSHAKE = "2025-06-18"


def initialize(
    client: str, *, version: str = HANDSHAKE, request_id: int = 0, run: str = ""
) -> dict[str, Any]:
    """An `initialize` from a client named `client`; with `run`, of that run (Harness's
    `harness/run` key: a new key starts a new session)."""
    params: dict[str, Any] = {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": client, "version": "1"},
    }
    if run:
        params["_meta"] = {"harness/run": run}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}
