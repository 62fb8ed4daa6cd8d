"""rt5: a stdio upstream server's answer is bounded as it arrives, as an HTTP server's is
(upstream.ANSWER_BYTES, refused by the outbound door). The SDK's stdio client read a
line of any length whole (concatenating each 64 KiB piece onto what it held, quadratic):
a server answering one huge line held the worker's memory and the pool's event loop, on
which every upstream call of the process waits.

Live: daphne, a Celery worker and the stdio upstream server of tests/support."""

from __future__ import annotations

import json
import sys
import time
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from dispatcher.models import Status, ToolCall
from dispatcher.tools.sources import upstream
from tests.mcp.conftest import UPSTREAM_SERVER, mcp_session, run, text_of
from tests.support.factories import make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def test_a_stdio_answer_past_the_bound_is_refused_and_the_server_serves_the_next_call(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    variant = tmp_path / "variant.json"
    variant.write_text(json.dumps({"huge": True}))
    variant.parent.chmod(0o755)
    name = "s" + uuid.uuid4().hex[:8]
    call_command(
        "add_mcp_server",
        name,
        "--command",
        f"{sys.executable} {UPSTREAM_SERVER} stdio",
        "--env",
        f"UPSTREAM_VARIANT_FILE={variant}",
        "--path",
        f"{variant.parent}:ro",
        stdout=StringIO(),
    )
    fx = make_agent(mode="trusted")
    too_much = (upstream.ANSWER_BYTES >> 20) + 16  # megabytes, past the bound

    async def scenario() -> tuple[object, float, object]:
        async with mcp_session(live_stack, fx) as (session, _):
            started = time.monotonic()
            huge = await session.call_tool(f"{name}__huge", {"megabytes": too_much})
            took = time.monotonic() - started
            return huge, took, await session.call_tool(f"{name}__echo", {"text": "after"})

    huge, took, after = run(scenario, timeout=180)
    print(f"huge answer: {took:.1f}s")
    assert huge.is_error, text_of(huge)[:200]
    assert "larger than" in text_of(huge), text_of(huge)[:300]
    call = ToolCall.objects.get(session__agent=fx.agent, name=f"{name}__huge")
    assert call.status == Status.COMPLETED and call.is_error
    assert len(call.content) < 2000
    # The server is started again for the next call, which is answered.
    assert (after.is_error, text_of(after)) == (False, "echo: after")
