"""Red-team rtagent: a path of a million slashes holds no request's thread for minutes.

The workspace confinement guard (dispatcher.tools._paths._resolve_beneath) reads a path
one component at a time, and took each from the front of the list of those left, moving
the whole rest each time: quadratic in the number of components. A `read_file` whose path
is `x/` and a million slashes (a body under HARNESS_MAX_BODY_BYTES) held the web
process's thread for about seven minutes (400,000 components: 66 s), before any decision;
an agent sending a few of them held every thread that serves other agents' calls and
reviewers' pages."""

from __future__ import annotations

import httpx
import pytest

from dispatcher.models import Status, ToolCall
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack

pytestmark = pytest.mark.slow


def test_a_path_of_a_million_slashes_is_decided_at_once(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    path = "x/" + "/" * 1_000_000
    with live_stack.client(live_agent, timeout=60) as http:
        session = http.post("/api/v1/sessions", json={}).json()["id"]
        try:
            answer = http.post(
                f"/api/v1/sessions/{session}/calls",
                json={"calls": [{"id": "long", "name": "read_file", "arguments": {"path": path}}]},
            )
        except httpx.TimeoutException:
            pytest.fail("the call was not decided within 60 s: the path's check held the thread")
    assert answer.status_code in (200, 202), answer.text[:300]
    call = ToolCall.objects.get(session_id=session, tool_use_id="long")
    # Inside the workspace (it names `x`): allowed, as any read of a missing file is.
    assert call.status != Status.REJECTED, call.content[:300]
