"""The replay's states, computed on the server (audit/replay.py), against a session
recorded through the real pipeline: the API admits, a reviewer approves on the queue's
page, the worker's execution runs the calls; the page renders every state escaped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from audit.replay import Replay, Shown, build_replay
from audit.timeline import build_timeline
from dispatcher import execution
from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert(1)</script>"


def api(client: Client, url: str, body: Any, fx: AgentFixture) -> Any:
    return client.post(
        url, data=json.dumps(body), content_type="application/json", headers=fx.headers
    )


@pytest.fixture
def recorded(agent: AgentFixture) -> tuple[str, str]:
    """A session: a listing (allowed, run), a write an agent sent markup in (asked,
    approved by a reviewer, run) and an unknown tool (rejected); (session, reviewer)."""
    agent_http = Client()
    sid = api(agent_http, "/api/v1/sessions", {"title": "replayed"}, agent).json()["id"]
    calls = {
        "calls": [
            {"id": "r1", "name": "list_directory", "arguments": {"path": "."}},
            {"id": "r2", "name": "write_file", "arguments": {"path": "x.sh", "content": SCRIPT}},
            {"id": "r3", "name": "nope_tool", "arguments": {}},
        ]
    }
    assert api(agent_http, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code == 202
    listing = ToolCall.objects.get(session_id=sid, tool_use_id="r1")
    execution.execute_call(str(listing.pk))
    reviewer = unique("rev")
    make_user(reviewer, groups=("reviewer",))
    queue = Client()
    queue.login(username=reviewer, password="pw-" + reviewer)
    approval = ApprovalRequest.objects.get(call__session_id=sid)
    data = {"action": "approve", "digest": approval.call.digest, "feedback": "looks fine"}
    assert queue.post(f"/approvals/{approval.pk}/decide", data).status_code in (200, 302)
    execution.execute_call(str(approval.call_id))
    return str(sid), reviewer


def shown_at(replay: Replay, index: int) -> list[Shown]:
    """What the page shows at step `index` (audit.js shows exactly these)."""
    return [s for s in replay.calls if s.first <= index <= s.last]


def table(replay: Replay, index: int) -> list[tuple[str, str]]:
    return [(s.state.tool, s.state.status) for s in shown_at(replay, index)]


def step_of(replay: Replay, kind: str, tool: str) -> int:
    """The index of the first `kind` event of the call to `tool`."""
    return next(
        s.index
        for s in replay.steps
        if s.kind == kind and json.loads(s.payload).get("tool") == tool
    )


def test_each_step_shows_each_call_as_it_stood(recorded: tuple[str, str]) -> None:
    sid, reviewer = recorded
    timeline = build_timeline(sid)
    assert timeline is not None
    replay = build_replay(timeline.events)
    assert [s.line.split()[0] for s in replay.steps] == [f"#{e.seq}" for e in timeline.events]
    assert replay.steps[0].kind == "session.started" and table(replay, 0) == []

    received = step_of(replay, "call.received", "list_directory")
    assert table(replay, received) == [("list_directory", "received")]
    asked = step_of(replay, "call.approval_requested", "write_file")
    [waiting] = [s for s in shown_at(replay, asked) if s.state.pending]
    assert waiting.state.tool == "write_file"
    assert waiting.state.by.startswith("mode:standard: ")  # who asked, and why
    assert SCRIPT in waiting.state.presentation  # what the reviewer was shown
    assert not [span for span in replay.idle if span.first <= asked <= span.last]
    assert replay.pending == [waiting]

    approved = step_of(replay, "call.approved", "write_file")
    [write] = [s.state for s in shown_at(replay, approved) if s.state.tool == "write_file"]
    assert (write.status, write.by) == ("queued", f"user:{reviewer}: looks fine")
    assert [span for span in replay.idle if span.first <= approved <= span.last]

    last = len(replay.steps) - 1
    assert table(replay, last) == [
        ("list_directory", "completed"),
        ("write_file", "completed"),
        ("nope_tool", "rejected"),
    ]
    listing, written, unknown = (s.state for s in shown_at(replay, last))
    assert listing.content is not None and written.content is not None
    assert "does not exist" in (unknown.content or "")
    # One state per call at every step, in the order the calls first appeared.
    for index in range(len(replay.steps)):
        ids = [s.call_id for s in shown_at(replay, index)]
        assert len(ids) == len(set(ids))
        assert sum(1 for span in replay.idle if span.first <= index <= span.last) == (
            0 if any(s.state.pending for s in shown_at(replay, index)) else 1
        )


def test_the_page_renders_every_state_escaped(recorded: tuple[str, str]) -> None:
    sid, _ = recorded
    auditor = unique("aud")
    make_user(auditor, groups=("auditor",))
    client = Client()
    client.login(username=auditor, password="pw-" + auditor)
    page = client.get(f"/audit/sessions/{sid}/replay/").content.decode()
    timeline = build_timeline(sid)
    assert timeline is not None
    replay = build_replay(timeline.events)
    steps = len(replay.steps)
    assert f'max="{steps}"' in page and f"Step 1 of {steps}" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and SCRIPT not in page
    assert "application/json" not in page  # no log for a script to fold
    body = page.split('data-role="calls"')[1].split("</tbody>")[0]
    assert body.count("<tr ") == len(replay.calls)
    assert body.count(" hidden>") == len([s for s in replay.calls if s.first])
    pending = page.split('data-role="pending"')[1].split("</ul>")[0]
    assert pending.count("is waiting for a reviewer") == len(replay.pending) == 1
    assert pending.count(">none</li>") == len(replay.idle) == 2
