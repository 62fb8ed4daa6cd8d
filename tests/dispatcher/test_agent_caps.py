"""Fair shares per agent on every gateway (dispatcher.limits): waits held (agent API,
hooks, MCP) counted together in every process, pending asks, new sessions per minute.
Past a cap the agent is told what to do, and nothing is recorded twice."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from audit.models import AuditEvent
from dispatcher import limits
from dispatcher.models import Agent, AgentSession, Status, ToolCall
from tests.approvals.conftest import start_session
from tests.support.claude_code_hooks import HOOK_URL, decision, pre_tool_use, send
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack
from tests.support.mcp_requests import initialize

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
def held_slots(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Slots this test takes itself (another process than daphne's); all given back."""
    slots: list[str] = []
    yield slots
    for slot in slots:
        limits.release_wait(slot)


def take(agent: Agent, count: int, slots: list[str]) -> None:
    for _ in range(count):
        slot = limits.reserve_wait(agent, 120)
        assert slot is not None
        slots.append(slot)


def submit(fx: AgentFixture, session_id: str, calls: list[dict[str, Any]], wait: float = 0) -> Any:
    return Client().post(
        f"/api/v1/sessions/{session_id}/calls?wait={wait}",
        data=json.dumps({"calls": calls}),
        content_type="application/json",
        headers=fx.headers,
    )


def write(call_id: str) -> dict[str, Any]:
    """A call that asks in standard mode."""
    return {
        "id": call_id,
        "name": "write_file",
        "arguments": {"path": f"{call_id}.txt", "content": "x"},
    }


def within_one_minute() -> None:
    """The session cap counts per minute: start a test well inside one."""
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def mcp_initialize(client: httpx.Client, fx: AgentFixture, run: str = "") -> httpx.Response:
    """An initialize; with `run`, of that run (a new run key starts a new session)."""
    return client.post(
        "/mcp/", json=initialize("caps", run=run), headers={**fx.headers, **MCP_HEADERS}
    )


def mcp_answer(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        answers = [json.loads(d) for d in data if '"result"' in d or '"error"' in d]
        return dict(answers[-1])
    return dict(response.json())


# --- Waits: one count for every gateway and process ----------------------------------------


@pytest.mark.django_db
def test_a_hook_past_the_wait_cap_is_denied_and_its_call_recorded_as_cancelled(
    agent: AgentFixture, held_slots: list[str]
) -> None:
    take(agent.agent, settings.HARNESS_MAX_WAITS_PER_AGENT, held_slots)
    session_id = str(uuid.uuid4())
    body = pre_tool_use(session_id, "Bash", {"command": "make deploy"})
    action, reason = decision(send(agent, body, wait=20))
    assert action == "deny"
    assert "HARNESS_MAX_WAITS_PER_AGENT" in reason and "propose this call again" in reason
    call = ToolCall.objects.get(session__external_id=session_id)
    assert call.status == Status.CANCELLED  # stored, decided, audited: never a silent drop
    kinds = AuditEvent.objects.filter(subject=f"call:{call.pk}").values_list("kind", flat=True)
    assert list(kinds) == ["call.received", "call.approval_requested", "call.cancelled"]
    # An auto-allowed call holds no wait: it is answered as before.
    read = pre_tool_use(session_id, "Read", {"file_path": "/home/dev/project/a.py"})
    assert decision(send(agent, read, wait=20))[0] == "allow"


@pytest.mark.live
def test_hook_holds_and_mcp_calls_count_with_api_waits_in_every_process(
    live_stack: LiveStack, live_agent: AgentFixture, held_slots: list[str]
) -> None:
    """The test process holds all slots but one; daphne's held hook takes the last; then the
    agent API and the MCP gateway refuse to wait, recording nothing."""
    fx, limit = live_agent, settings.HARNESS_MAX_WAITS_PER_AGENT
    take(fx.agent, limit - 1, held_slots)
    hook_session = str(uuid.uuid4())
    answers: list[httpx.Response] = []

    def hold_hook() -> None:
        body = pre_tool_use(hook_session, "Bash", {"command": "make deploy"})
        with httpx.Client(base_url=live_stack.url, headers=fx.headers, timeout=60) as client:
            answers.append(client.post(f"{HOOK_URL}?wait=30", json=body))

    thread = threading.Thread(target=hold_hook)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while limits.waits_held(fx.agent) < limit and time.monotonic() < deadline:
            time.sleep(0.05)
        assert limits.waits_held(fx.agent) == limit  # the held hook is counted
        with live_stack.client(fx) as client:
            session_id = client.post("/api/v1/sessions", json={}).json()["id"]
            refused = client.post(
                f"/api/v1/sessions/{session_id}/calls?wait=5", json={"calls": [write("a1")]}
            )
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_waits"
            assert "hook requests and MCP calls" in refused.json()["error"]["message"]
            assert int(refused.headers["Retry-After"]) > 0
            assert not ToolCall.objects.filter(session_id=session_id).exists()
            init = mcp_initialize(client, fx)
            mcp = {**fx.headers, **MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
            call = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "list_directory", "arguments": {"path": "."}},
            }
            answer = mcp_answer(client.post("/mcp/", json=call, headers=mcp))
            assert answer["error"]["code"] == -32029
            assert "HARNESS_MAX_WAITS_PER_AGENT" in answer["error"]["message"]
            assert not ToolCall.objects.filter(
                session__external_id=init.headers["mcp-session-id"]
            ).exists()
            # A slot given back: the same submission again creates its call once.
            limits.release_wait(held_slots.pop())
            again = client.post(
                f"/api/v1/sessions/{session_id}/calls?wait=0.2", json={"calls": [write("a1")]}
            )
            assert again.status_code == 202, again.text
            assert ToolCall.objects.filter(session_id=session_id).count() == 1
            held = ToolCall.objects.get(session__external_id=hook_session)
            client.post(f"/api/v1/calls/{held.pk}/cancel")
    finally:
        thread.join(30)
    assert answers and answers[0].json()["hookSpecificOutput"]["permissionDecision"] == "deny"


# --- Pending asks ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_asks_past_the_agents_cap_are_stored_and_denied_with_the_reason(
    agent: AgentFixture, settings: Any
) -> None:
    settings.HARNESS_MAX_PENDING_ASKS_PER_AGENT = 3
    first, second = start_session(agent), start_session(agent)
    assert submit(agent, first, [write("a1"), write("a2")]).status_code == 202
    answer = submit(agent, second, [write("b1"), write("b2")]).json()
    assert [c["status"] for c in answer["calls"]] == ["pending_approval", "denied"]
    denied = answer["calls"][1]
    assert denied["decided_by"] == "limit:pending_asks"
    assert "HARNESS_MAX_PENDING_ASKS_PER_AGENT" in denied["content"]
    event = AuditEvent.objects.get(subject=f"call:{denied['id']}", kind="call.denied")
    assert event.payload["by"] == "limit:pending_asks"
    # Another agent's asks are its own share; an auto-allowed call is not capped.
    other = make_agent()
    assert submit(other, start_session(other), [write("c1")]).json()["calls"][0]["status"] == (
        "pending_approval"
    )
    listing = {"id": "l1", "name": "list_directory", "arguments": {"path": "."}}
    assert submit(agent, second, [listing]).json()["calls"][0]["status"] != "denied"
    # The same message sent again is the same calls: nothing is recorded twice.
    again = submit(agent, second, [write("b1"), write("b2")]).json()
    assert [(c["id"], c["status"]) for c in again["calls"]] == [
        (c["id"], c["status"]) for c in answer["calls"]
    ]
    assert ToolCall.objects.filter(session__agent=agent.agent).count() == 5


# --- Sessions per minute -------------------------------------------------------------------


@pytest.mark.heavy
@pytest.mark.django_db
def test_new_sessions_past_the_per_minute_cap_get_429_on_the_api_and_the_hooks(
    agent: AgentFixture, settings: Any
) -> None:
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 2
    within_one_minute()
    start_session(agent)
    hook = pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/a.py"})
    assert decision(send(agent, hook))[0] == "allow"  # the hook's first sight starts one
    refused = Client().post(
        "/api/v1/sessions", data="{}", content_type="application/json", headers=agent.headers
    )
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "too_many_sessions"
    assert "HARNESS_MAX_SESSIONS_PER_MINUTE" in refused.json()["error"]["message"]
    assert 0 < int(refused["Retry-After"]) <= 60
    fresh = pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/a.py"})
    answer = send(agent, fresh)
    assert answer.status_code == 429 and answer.json()["error"]["code"] == "too_many_sessions"
    # The sessions it has still work, and another agent has its own share.
    assert decision(send(agent, hook))[0] == "allow"
    assert AgentSession.objects.filter(agent=agent.agent).count() == 2
    start_session(make_agent())


@pytest.mark.live
def test_an_mcp_initialize_past_the_session_cap_gets_429(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    within_one_minute()
    with live_stack.client(live_agent) as client:
        answers = [
            mcp_initialize(client, live_agent, run=f"run-{n}")
            for n in range(settings.HARNESS_MAX_SESSIONS_PER_MINUTE + 1)
        ]
    assert [a.status_code for a in answers[:-1]] == [200] * settings.HARNESS_MAX_SESSIONS_PER_MINUTE
    assert answers[-1].status_code == 429
    assert answers[-1].json()["error"]["code"] == "too_many_sessions"
    assert int(answers[-1].headers["retry-after"]) > 0
    started = AgentSession.objects.filter(agent=live_agent.agent).count()
    assert started == settings.HARNESS_MAX_SESSIONS_PER_MINUTE


@pytest.mark.live
def test_a_waits_slot_is_given_back_before_its_answer_whichever_way_the_wait_ends(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """A waiting request's slot is given back by the read that finds its calls done (on
    that read's own trip), or by the request when its wait runs out: either way before
    the agent reads the answer, and once (no slot left held), on POST .../calls?wait and
    GET /calls/{id}?wait alike."""
    fx = live_agent
    with live_stack.client(fx) as client:
        started = client.post("/api/v1/sessions", json={})
        assert started.status_code == 201, started.text
        session_id = started.json()["id"]
        calls_url = f"/api/v1/sessions/{session_id}/calls"
        # The wait runs out: 202, the call still pending, the slot given back.
        out = client.post(f"{calls_url}?wait=0.3", json={"calls": [write("w1")]})
        assert out.status_code == 202, out.text
        assert limits.waits_held(fx.agent) == 0
        first = out.json()["calls"][0]["id"]
        made = client.post(calls_url, json={"calls": [write("w2")]})
        assert made.status_code == 202, made.text
        second = made.json()["calls"][0]["id"]
        # Done while it waits (the agent cancels it from another request): 200, given back.
        for call_id, method, url, body in (
            (first, "GET", f"/api/v1/calls/{first}?wait=30", None),
            (second, "POST", f"{calls_url}?wait=30", {"calls": [write("w2")]}),
        ):
            answers: list[httpx.Response] = []

            def wait_on(
                method: str = method,
                url: str = url,
                body: Any = body,
                answers: list[httpx.Response] = answers,
            ) -> None:
                with live_stack.client(fx) as waiting:
                    answers.append(waiting.request(method, url, json=body))

            thread = threading.Thread(target=wait_on)
            thread.start()
            deadline = time.monotonic() + 20
            while limits.waits_held(fx.agent) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert limits.waits_held(fx.agent) == 1
            assert client.post(f"/api/v1/calls/{call_id}/cancel").status_code == 200
            thread.join(30)
            assert answers and answers[0].status_code == 200, answers
            answer = answers[0].json()
            status = answer["status"] if method == "GET" else answer["calls"][0]["status"]
            assert status == Status.CANCELLED, answer
            assert limits.waits_held(fx.agent) == 0
