"""The fast path writes a result's JSON-RPC response itself (`mcp_fast.response_json`,
issue 37): byte for byte what the SDK's model writes (`JSONRPCResponse.model_dump_json`),
for every revision the fast path serves, whatever the result's text holds."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import types
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS

from dispatcher.gateways import mcp_fast

pytestmark = pytest.mark.backend_independent

TEXTS = [
    "echo: hi",
    "",
    "é ü 漢字 🙂",
    'quotes " and \\ backslash / slash',
    "controls \x00 \x01 \x1f \x7f \t \n \r \u2028 \u2029",
    "x" * 100_000,
]


def sdk_json(request_id: types.RequestId, result: dict[str, Any]) -> str:
    message = types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
    return message.model_dump_json(by_alias=True, exclude_unset=True)


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("request_id", [7, 0, -1, 2**70, "7", "", 'ü\x00"id'])
def test_a_result_is_written_as_the_sdk_writes_it(
    version: str, text: str, request_id: types.RequestId
) -> None:
    meta = {"id": "0b6c2b0e-4b7e-4d1e-9a57-1d1c6d4f9f00", "status": "completed"}
    for is_error, extra in ((False, {}), (True, {"replaces": "a" * 36})):
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            is_error=is_error,
            _meta={"harness/call": {**meta, **extra}},
        )
        shaped = mcp_fast._runner(version)._serialize(mcp_fast.METHOD, version, result)
        assert mcp_fast.response_json(request_id, shaped) == sdk_json(request_id, shaped)


def test_any_json_result_is_written_as_the_sdk_writes_it() -> None:
    result = {
        "structuredContent": {"n": 1.5, "big": 2**64, "none": None, "list": [True, False, {}]},
        "content": [],
        "isError": False,
    }
    assert mcp_fast.response_json("r", result) == sdk_json("r", result)
