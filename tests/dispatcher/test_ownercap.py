"""Fair shares per person (dispatcher.limits): one person's agents together hold at most
HARNESS_MAX_WAITS_PER_PERSON waits and send at most HARNESS_PERSON_REQUESTS_PER_SECOND,
taken in the same Redis call as the agent's own caps. Another person's agent keeps its
share; the refusal names whose cap and its variable."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import Error
from django.test import Client

from dispatcher import agents, checks, limits
from dispatcher.models import Agent, ToolCall
from tests.approvals.conftest import start_session
from tests.support.claude_code_hooks import decision, pre_tool_use, send
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack

from .test_agent_caps import MCP_HEADERS, mcp_answer, mcp_initialize, submit, write


@pytest.fixture
def held_slots() -> Iterator[list[str]]:
    """Slots this test takes itself (another process than daphne's); all given back."""
    slots: list[str] = []
    yield slots
    for slot in slots:
        limits.release_wait(slot)


def take(agent: Agent, count: int, slots: list[str]) -> None:
    for _ in range(count):
        slots.append(limits.reserve_wait(agent, 120))


def person_with_agents(count: int) -> list[AgentFixture]:
    owner = make_user(unique("person"), mode="standard")
    return [make_agent(owner=owner) for _ in range(count)]


# --- Waits ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_one_persons_agents_together_hold_at_most_the_persons_waits(
    settings: Any, held_slots: list[str]
) -> None:
    """Three agents of one person, the person's cap 5 (each agent's 8): two agents hold
    five slots, so the third agent's waiting request is refused on the agent API and its
    hook is cancelled, recording nothing twice; another person's agent still waits."""
    settings.HARNESS_MAX_WAITS_PER_PERSON = "5"
    first, second, third = person_with_agents(3)
    take(first.agent, 3, held_slots)
    take(second.agent, 2, held_slots)
    assert limits.person_waits_held(third.agent) == 5
    assert limits.waits_held(third.agent) == 0  # its own share untouched
    session_id = start_session(third)
    refused = submit(third, session_id, [write("p1")], wait=5)
    assert refused.status_code == 429, refused.content
    error = refused.json()["error"]
    assert error["code"] == "too_many_waits"
    assert "HARNESS_MAX_WAITS_PER_PERSON" in error["message"]
    assert "across all of their agents" in error["message"]
    assert int(refused["Retry-After"]) > 0
    assert not ToolCall.objects.filter(session_id=uuid.UUID(session_id)).exists()
    # A held hook of the same person: cancelled at once, saying whose cap.
    hook_session = str(uuid.uuid4())
    body = pre_tool_use(hook_session, "Bash", {"command": "make deploy"})
    action, reason = decision(send(third, body, wait=20))
    assert action == "deny" and "HARNESS_MAX_WAITS_PER_PERSON" in reason
    # Another person's agent waits as before (its call is stored and pending).
    other = make_agent(mode="standard")
    answer = submit(other, start_session(other), [write("o1")], wait=0.2)
    assert answer.status_code == 202, answer.content
    assert answer.json()["calls"][0]["status"] == "pending_approval"
    # One slot of the person given back: the third agent's request now waits, once.
    limits.release_wait(held_slots.pop())
    again = submit(third, session_id, [write("p1")], wait=0.2)
    assert again.status_code == 202, again.content
    assert ToolCall.objects.filter(session_id=uuid.UUID(session_id)).count() == 1


@pytest.mark.django_db
def test_the_agents_own_cap_is_named_when_it_is_the_one_full(
    settings: Any, held_slots: list[str]
) -> None:
    settings.HARNESS_MAX_WAITS_PER_AGENT = 2
    [fx] = person_with_agents(1)
    take(fx.agent, 2, held_slots)
    refused = submit(fx, start_session(fx), [write("a1")], wait=5)
    message = refused.json()["error"]["message"]
    assert refused.status_code == 429
    assert "HARNESS_MAX_WAITS_PER_AGENT" in message and "PER_PERSON" not in message


@pytest.mark.django_db
def test_no_cap_per_person_when_it_is_zero(settings: Any, held_slots: list[str]) -> None:
    settings.HARNESS_MAX_WAITS_PER_PERSON = "0"
    agents_ = person_with_agents(3)
    for fx in agents_:
        take(fx.agent, settings.HARNESS_MAX_WAITS_PER_AGENT, held_slots)
    assert len(held_slots) == 3 * settings.HARNESS_MAX_WAITS_PER_AGENT


@pytest.mark.django_db
def test_a_transferred_agents_slot_stays_with_the_old_owner_until_given_back(
    settings: Any, held_slots: list[str]
) -> None:
    """A slot names the sets it was taken in: given back after the agent changed owner,
    it leaves the old owner's count (never the new one's); new slots count for the new."""
    settings.HARNESS_MAX_WAITS_PER_PERSON = "4"
    fx = make_agent(mode="standard")
    take(fx.agent, 2, held_slots)
    old = Agent.objects.get(pk=fx.agent.pk)
    new_owner = make_user(unique("heir"), mode="standard")
    agents.hand_over_agent(agent=fx.agent, to=new_owner, actor="test")
    moved = Agent.objects.get(pk=fx.agent.pk)
    assert limits.person_waits_held(old) == 2 and limits.person_waits_held(moved) == 0
    take(moved, 1, held_slots)
    assert limits.person_waits_held(moved) == 1
    for slot in list(held_slots):
        limits.release_wait(slot)
    held_slots.clear()
    assert limits.person_waits_held(old) == 0 and limits.person_waits_held(moved) == 0
    assert limits.waits_held(moved) == 0


@pytest.mark.django_db
def test_a_short_wait_beside_a_long_one_does_not_drop_the_long_one(
    monkeypatch: pytest.MonkeyPatch, held_slots: list[str]
) -> None:
    """Before: every slot set the set's expiry to its own lapse, so a short wait taken
    after a long one expired the whole set, and with it the long wait's count."""
    monkeypatch.setattr(limits, "LAPSE_MARGIN", 0.0)
    fx = make_agent(mode="standard")
    held_slots.append(limits.reserve_wait(fx.agent, 60))
    limits.reserve_wait(fx.agent, 0.5)  # never given back: it lapses
    time.sleep(2.2)
    assert limits.waits_held(fx.agent) == 1
    assert limits.person_waits_held(fx.agent) == 1


@pytest.mark.live
def test_an_mcp_call_past_the_persons_waits_is_refused_and_another_person_served(
    live_stack: LiveStack, live_db: None, held_slots: list[str]
) -> None:
    """daphne on its defaults (16 per person, 8 per agent): two agents of one person hold
    sixteen slots, so a third agent's tools/call is refused (nothing recorded) with the
    person's cap named; another person's call is answered."""
    limit = int(settings.HARNESS_MAX_WAITS_PER_PERSON)
    first, second, third = person_with_agents(3)
    take(first.agent, settings.HARNESS_MAX_WAITS_PER_AGENT, held_slots)
    take(second.agent, limit - settings.HARNESS_MAX_WAITS_PER_AGENT, held_slots)
    call = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "list_directory", "arguments": {"path": "."}},
    }
    with live_stack.client(third) as client:
        init = mcp_initialize(client, third)
        headers = {**third.headers, **MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        answer = mcp_answer(client.post("/mcp/", json=call, headers=headers))
    assert answer["error"]["code"] == -32029, answer
    assert "HARNESS_MAX_WAITS_PER_PERSON" in answer["error"]["message"]
    assert not ToolCall.objects.filter(session__agent=third.agent).exists()
    other = make_agent(mode="standard")
    with live_stack.client(other) as client:
        init = mcp_initialize(client, other)
        headers = {**other.headers, **MCP_HEADERS, "Mcp-Session-Id": init.headers["mcp-session-id"]}
        served = mcp_answer(client.post("/mcp/", json=call, headers=headers))
    assert "result" in served, served


# --- Requests per second ------------------------------------------------------------------------


@pytest.mark.django_db
def test_one_persons_agents_share_the_persons_request_rate(settings: Any) -> None:
    """Per person three requests at once, then one every 10 s; each agent's own rate high.
    Two agents of the person use up the three; the next request of either is refused,
    naming the person's rate; another person's agent is served."""
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 100
    settings.HARNESS_AGENT_REQUEST_BURST = 100
    settings.HARNESS_PERSON_REQUESTS_PER_SECOND = 0.1
    settings.HARNESS_PERSON_REQUEST_BURST = 3
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 0
    first, second = person_with_agents(2)

    def tools(fx: AgentFixture) -> Any:
        return Client().get("/api/v1/tools", headers=fx.headers)

    assert [tools(fx).status_code for fx in (first, second, first)] == [200, 200, 200]
    refused = tools(second)
    assert refused.status_code == 429, refused.content
    message = refused.json()["error"]["message"]
    assert refused.json()["error"]["code"] == "too_many_requests"
    assert "HARNESS_PERSON_REQUESTS_PER_SECOND" in message and "all of their agents" in message
    assert 1 <= int(refused["Retry-After"]) <= 20
    # Remembered by this process: the same token is refused again, with the same cap named.
    again = tools(second)
    assert again.status_code == 429
    assert "HARNESS_PERSON_REQUESTS_PER_SECOND" in again.json()["error"]["message"]
    other = make_agent(mode="standard")
    assert tools(other).status_code == 200


@pytest.mark.django_db
def test_the_agents_own_rate_is_named_when_it_is_the_one_spent(settings: Any) -> None:
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.1
    settings.HARNESS_AGENT_REQUEST_BURST = 2
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 0
    # (no person's rate, which this test is not about: SQLite gives a rolled-back test's
    # person id out again, and the bucket an earlier test's person spent is this person's
    # while it lasts: a 429 before the agent's own two, once on CI's embedded run)
    settings.HARNESS_PERSON_REQUESTS_PER_SECOND = 0
    [fx] = person_with_agents(1)
    for _ in range(2):
        assert Client().get("/api/v1/tools", headers=fx.headers).status_code == 200
    refused = Client().get("/api/v1/tools", headers=fx.headers)
    assert refused.status_code == 429
    message = refused.json()["error"]["message"]
    assert "HARNESS_AGENT_REQUESTS_PER_SECOND" in message and "PERSON" not in message


# --- Start-up check ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["lots", "-1", "32", "1.5"])
def test_bad_waits_per_person_are_refused_at_start(settings: Any, value: str) -> None:
    settings.HARNESS_MAX_WAITS_PER_PERSON = value
    [error] = checks.check_person_caps()
    assert isinstance(error, Error) and error.id == "dispatcher.E047"
    assert "HARNESS_MAX_WAITS_PER_PERSON" in error.msg


@pytest.mark.parametrize("value", ["16", "0", "31"])
def test_good_waits_per_person_pass(settings: Any, value: str) -> None:
    settings.HARNESS_MAX_WAITS_PER_PERSON = value
    assert checks.check_person_caps() == []


def test_a_negative_person_rate_is_refused(settings: Any) -> None:
    settings.HARNESS_PERSON_REQUESTS_PER_SECOND = -1
    [error] = checks.check_person_caps()
    assert error.id == "dispatcher.E047" and "HARNESS_PERSON_REQUESTS_PER_SECOND" in error.msg
