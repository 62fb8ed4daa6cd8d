"""Red team of the waits per person (dispatcher.limits, HARNESS_MAX_WAITS_PER_PERSON):
every way a wait ends gives its slot back to the agent's set and the person's alike,
never one without the other. Each client leaves at the worst moment (its slot being
taken on a thread, or its calls recorded after it), on the agent API and the hooks; the
person's count is back to none, and the person's other agent can take all of the
person's waits again (what a leaked person slot would refuse)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from dispatcher import limits
from dispatcher.gateways import api
from dispatcher.models import Agent
from tests.redteam.test_inline_loop_attacks import ServingLoop, serving  # noqa: F401
from tests.redteam.test_slot_push_attacks import (
    held_up,
    leave_while_held,
    pending_call,
    request,
    write,
)
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import AgentFixture, make_agent, make_user, unique


@pytest.fixture
def app(asgi: Any) -> Any:
    return asgi.application


def until_person_holds(agent: Agent, count: int, seconds: float = 5) -> int:
    deadline = time.monotonic() + seconds
    while (held := limits.person_waits_held(agent)) != count and time.monotonic() < deadline:
        time.sleep(0.02)
    return held


def both_back(first: AgentFixture, second: AgentFixture, settings: Any) -> None:
    """Nothing held for the person, and the person's other agent takes all of its waits."""
    assert until_person_holds(first.agent, 0) == 0, "a person's slot is held until it lapses"
    assert limits.waits_held(first.agent) == 0
    slots = [limits.reserve_wait(second.agent, 5) for _ in range(2)]
    with pytest.raises(limits.TooManyWaits) as full:
        limits.reserve_wait(second.agent, 5)
    assert full.value.cap == "person"
    for slot in slots:
        limits.release_wait(slot)


@pytest.fixture
def person(app: Any, serving: ServingLoop, settings: Any):  # type: ignore[no-untyped-def]  # noqa: F811
    settings.HARNESS_MAX_WAITS_PER_PERSON = "2"
    owner = make_user(unique("person"), mode="standard")
    first, second = make_agent(owner=owner), make_agent(owner=owner)
    status, body = request(app, serving, first, "POST", "/api/v1/sessions", {}).answer()
    assert status == 201, body
    yield first, second, str(body["id"])
    limits._local._held.clear()


@pytest.mark.django_db(transaction=True)
def test_a_submission_left_while_recorded_gives_the_persons_slot_back(
    app: Any,
    serving: ServingLoop,  # noqa: F811
    person: tuple[AgentFixture, AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    first, second, session_id = person
    entered, go = held_up(monkeypatch, api, "_read_and_admit")
    path = f"/api/v1/sessions/{session_id}/calls?wait=30"
    waiting = request(app, serving, first, "POST", path, {"calls": [write("w1")]})
    assert entered.wait(10)
    assert limits.person_waits_held(first.agent) == 1
    leave_while_held(waiting, entered, go)
    both_back(first, second, settings)


@pytest.mark.django_db(transaction=True)
def test_a_read_left_while_its_slot_is_taken_gives_the_persons_slot_back(
    app: Any,
    serving: ServingLoop,  # noqa: F811
    person: tuple[AgentFixture, AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    first, second, session_id = person
    call_id = pending_call(app, serving, first, session_id, "w1")
    entered, go = held_up(monkeypatch, api, "reserve_wait")
    waiting = request(app, serving, first, "GET", f"/api/v1/calls/{call_id}?wait=30")
    leave_while_held(waiting, entered, go)
    both_back(first, second, settings)


@pytest.mark.django_db(transaction=True)
def test_a_hook_left_while_its_slot_is_taken_gives_the_persons_slot_back(
    app: Any,
    serving: ServingLoop,  # noqa: F811
    person: tuple[AgentFixture, AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    first, second, _ = person
    entered, go = held_up(monkeypatch, limits, "reserve_wait")
    body = pre_tool_use(str(uuid.uuid4()), "Bash", {"command": "make deploy"})
    waiting = request(app, serving, first, "POST", f"{HOOK_URL}?wait=30", body)
    leave_while_held(waiting, entered, go)
    both_back(first, second, settings)


@pytest.mark.django_db(transaction=True)
def test_a_read_refused_for_the_persons_waits_is_a_429_naming_the_person(
    app: Any,
    serving: ServingLoop,  # noqa: F811
    person: tuple[AgentFixture, AgentFixture, str],
    settings: Any,
) -> None:
    """The person's other agent holds both waits: the first agent's wait on a call is a
    429 too_many_waits naming the person's cap (not a 500), and costs the first agent
    nothing of its own."""
    first, second, session_id = person
    call_id = pending_call(app, serving, first, session_id, "w1")
    slots = [limits.reserve_wait(second.agent, 30) for _ in range(2)]
    try:
        status, body = request(
            app, serving, first, "GET", f"/api/v1/calls/{call_id}?wait=5"
        ).answer()
        assert status == 429, body
        assert body["error"]["code"] == "too_many_waits"
        assert "HARNESS_MAX_WAITS_PER_PERSON" in body["error"]["message"]
        path = f"/api/v1/sessions/{session_id}/calls?wait=5"
        status, body = request(app, serving, first, "POST", path, {"calls": [write("w2")]}).answer()
        assert status == 429 and "HARNESS_MAX_WAITS_PER_PERSON" in body["error"]["message"]
        assert limits.waits_held(first.agent) == 0
    finally:
        for slot in slots:
            limits.release_wait(slot)
