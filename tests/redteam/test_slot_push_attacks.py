"""Red-team of three changes: a waiting agent API request's slot given back by the read
that finds its calls done (`api.HeldSlot`, `api.reloader`), the reviewer queues' pushes to
several groups in one handoff to the send loop (`approvals.live._group_send`), and a
removed server's configuration remembered when the catalog rebuild retires its session
(`catalog._build`, `upstream.Pool.keep_only(removed=...)`). Each test is an attack, driven
in-process through the real ASGI application, the real channel layer's send loop, or the
pool's lanes against the hostile upstream process; it passes when the attack fails.

Found and fixed:
- A request whose client went away (Django cancels the view on http.disconnect) while
  its wait slot was being taken on a thread (the submission's `_submit`, the read's
  `reserve_wait`) never gave the slot back: the thread's answer, slot included, was
  dropped with the cancelled await, and the slot held until it lapsed (the wait's
  seconds plus a minute), counted against the agent's cap. (Older than the HeldSlot
  change, in the same slot's life.)
- A call looked up before its server's removal, arriving on a loop that held no session
  of the server when the rebuild saw the removal (another loop of the process, or none
  held one then), opened a session of the removed registration: its URL and headers
  used after the removal, and that session kept until the next rebuild.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError

from approvals import live
from dispatcher import limits, wakeups
from dispatcher.answers import is_done
from dispatcher.gateways import api
from dispatcher.models import Agent
from dispatcher.tools.sources import catalog, services
from dispatcher.tools.sources import upstream as upstream_module
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import Hostile, ServingLoop, register
from tests.redteam.test_pool_parse_attacks import until_no_session
from tests.redteam.test_request_threads_attacks import bearer, scope
from tests.redteam.test_session_retire_attacks import probe_on, target
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import AgentFixture, make_agent

hostile = loop_attacks.hostile
serving = loop_attacks.serving


# --- In-process requests, as daphne hands them to the application --------------------------


class Exchange:
    """One request to harness_site.asgi.application on `loop`; `hang_up` is the client
    going away (http.disconnect), as daphne tells the application."""

    def __init__(
        self,
        app: Any,
        loop: asyncio.AbstractEventLoop,
        method: str,
        path: str,
        token: str,
        body: Any,
    ) -> None:
        self.loop = loop
        self.gone = asyncio.Event()
        raw = json.dumps(body).encode() if body is not None else b""
        request_scope = scope(
            path, bearer(token), (b"content-type", b"application/json"), method=method
        )
        self.sent: list[dict[str, Any]] = []
        self.disconnected = threading.Event()  # (the application was told)
        self.future = asyncio.run_coroutine_threadsafe(self._run(app, request_scope, raw), loop)

    async def _run(self, app: Any, scope: dict[str, Any], raw: bytes) -> None:
        arrived = [False]

        async def receive() -> dict[str, Any]:
            if not arrived[0]:
                arrived[0] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await self.gone.wait()
            self.disconnected.set()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            self.sent.append(message)

        try:
            await app(scope, receive, send)
        finally:
            self.gone.set()

    def hang_up(self) -> None:
        self.loop.call_soon_threadsafe(self.gone.set)

    def hung_up(self) -> None:
        """The client gone and the view cancelled: the application was told of the
        disconnect (Django's listener then raises and its task group cancels the view),
        and the loop then ran many more rounds than that takes (each a step scheduled by
        the one before, no clock). Not a fixed 0.5 s: a loaded host's cancel could come
        after a held thread was let go, its slot then given back the ordinary way, the
        race not run."""
        self.hang_up()
        assert self.disconnected.wait(30), "the application did not read the disconnect"

        async def rounds() -> None:
            for _ in range(100):
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(rounds(), self.loop).result(30)

    def answer(self, timeout: float = 30) -> tuple[int, Any]:
        self.future.result(timeout)
        status = next((m["status"] for m in self.sent if m["type"] == "http.response.start"), 0)
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return status, json.loads(body) if body else None


@pytest.fixture
def app(asgi: Any) -> Any:
    return asgi.application


def request(
    app: Any, loop: ServingLoop, fx: AgentFixture, method: str, path: str, body: Any = None
) -> Exchange:
    return Exchange(app, loop.loop, method, path, fx.token, body)


def write(call_id: str) -> dict[str, Any]:
    """A call that asks in standard mode (it waits for a reviewer)."""
    return {
        "id": call_id,
        "name": "write_file",
        "arguments": {"path": f"{call_id}.txt", "content": "x"},
    }


def until_held(agent: Agent, count: int, seconds: float = 10) -> int:
    """Until the agent holds `count` wait slots (or `seconds` pass): how many it holds."""
    deadline = time.monotonic() + seconds
    while (held := limits.waits_held(agent)) != count and time.monotonic() < deadline:
        time.sleep(0.02)
    return held


@pytest.fixture
def agent_session(app: Any, serving: ServingLoop) -> Iterator[tuple[AgentFixture, str]]:
    fx = make_agent()
    status, body = request(app, serving, fx, "POST", "/api/v1/sessions", {}).answer()
    assert status == 201, body
    yield fx, str(body["id"])
    limits._local._held.clear()


def pending_call(
    app: Any, serving: ServingLoop, fx: AgentFixture, session_id: str, cid: str
) -> str:
    path = f"/api/v1/sessions/{session_id}/calls"
    status, body = request(app, serving, fx, "POST", path, {"calls": [write(cid)]}).answer()
    assert status == 202, body
    return str(body["calls"][0]["id"])


def held_up(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str
) -> tuple[threading.Event, threading.Event]:
    """`owner.name` (what takes the slot, or records the calls after it) held on its thread
    until `go` is set, `entered` set once it is there: the window in which the client
    leaves."""
    entered, go = threading.Event(), threading.Event()
    original = getattr(owner, name)

    def slow(*args: Any) -> Any:
        answer = original(*args)
        entered.set()
        go.wait(60)
        return answer

    monkeypatch.setattr(owner, name, slow)
    return entered, go


def leave_while_held(waiting: Exchange, entered: threading.Event, go: threading.Event) -> None:
    """The client goes away while the slot's work is held on its thread; then it ends."""
    assert entered.wait(10)
    waiting.hung_up()  # (the view cancelled meanwhile: the race the fix is for)
    go.set()
    with contextlib.suppress(Exception):
        waiting.future.result(15)


# --- 1. The wait slot ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_submission_whose_client_leaves_while_it_is_recorded_gives_its_slot_back(
    app: Any,
    serving: ServingLoop,
    agent_session: tuple[AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """POST .../calls?wait=30: the client goes away while the calls are being recorded on
    the request's thread (its slot taken just before): the slot must be given back, not
    held until it lapses (90 s on) against the agent's cap."""
    fx, session_id = agent_session
    entered, go = held_up(monkeypatch, api, "_read_and_admit")
    path = f"/api/v1/sessions/{session_id}/calls?wait=30"
    waiting = request(app, serving, fx, "POST", path, {"calls": [write("w1")]})
    assert entered.wait(10)
    assert limits.waits_held(fx.agent) == 1
    leave_while_held(waiting, entered, go)
    assert until_held(fx.agent, 0, 5) == 0, "the slot is held until it lapses"


@pytest.mark.django_db(transaction=True)
def test_a_read_whose_client_leaves_while_its_slot_is_taken_gives_it_back(
    app: Any,
    serving: ServingLoop,
    agent_session: tuple[AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GET /calls/{id}?wait=30 of a pending call: the client goes away while its slot is
    being taken (on a thread): the slot must be given back."""
    fx, session_id = agent_session
    call_id = pending_call(app, serving, fx, session_id, "w1")
    entered, go = held_up(monkeypatch, api, "reserve_wait")
    waiting = request(app, serving, fx, "GET", f"/api/v1/calls/{call_id}?wait=30")
    leave_while_held(waiting, entered, go)
    assert until_held(fx.agent, 0, 5) == 0, "the slot is held until it lapses"


@pytest.mark.django_db(transaction=True)
def test_a_hook_whose_client_leaves_while_its_slot_is_taken_gives_it_back(
    app: Any, serving: ServingLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Claude Code hook held for a reviewer (`?wait=30` of a command that asks): the
    client goes away (its hook killed) while the slot is being taken on a thread; the
    slot must be given back, not held until it lapses (before: as on the agent API)."""
    fx = make_agent()
    entered, go = held_up(monkeypatch, limits, "reserve_wait")
    body = pre_tool_use(str(uuid.uuid4()), "Bash", {"command": "make deploy"})
    waiting = request(app, serving, fx, "POST", f"{HOOK_URL}?wait=30", body)
    leave_while_held(waiting, entered, go)
    assert until_held(fx.agent, 0, 5) == 0, "the slot is held until it lapses"
    limits._local._held.clear()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["GET", "POST"])
def test_a_client_gone_while_the_last_read_finds_its_calls_done_gives_the_slot_back_once(
    app: Any,
    serving: ServingLoop,
    agent_session: tuple[AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The wait's read that finds the call done (cancelled by the agent) is held on the
    request's thread while the client goes away: the request's `finally` and the read both
    reach the slot; it is given back (once: with the cap at 1, the agent can wait again at
    once, and no more than once at a time)."""
    fx, session_id = agent_session
    call_id = pending_call(app, serving, fx, session_id, "w1")
    entered, go = threading.Event(), threading.Event()
    original = api._reload

    def held_read(call_ids: list[str], slot: api.HeldSlot | None = None) -> Any:
        calls = original(call_ids)  # (looked at first without the slot)
        if slot is not None and all(is_done(c) for c in calls):
            entered.set()
            go.wait(60)
        return original(call_ids, slot)

    monkeypatch.setattr(api, "_reload", held_read)
    if how == "GET":
        waiting = request(app, serving, fx, "GET", f"/api/v1/calls/{call_id}?wait=30")
    else:
        path = f"/api/v1/sessions/{session_id}/calls?wait=30"
        waiting = request(app, serving, fx, "POST", path, {"calls": [write("w1")]})
    assert until_held(fx.agent, 1) == 1
    status, _ = request(app, serving, fx, "POST", f"/api/v1/calls/{call_id}/cancel").answer()
    assert status == 200
    assert entered.wait(10)
    waiting.hung_up()
    go.set()
    waiting.future.result(15)
    assert until_held(fx.agent, 0, 5) == 0


@pytest.mark.django_db(transaction=True)
def test_waits_held_never_pass_the_cap_while_waits_end_every_way(
    app: Any,
    serving: ServingLoop,
    agent_session: tuple[AgentFixture, str],
    settings: Any,
) -> None:
    """Cap 2; waits on GET and POST started again and again, ended by the call's
    cancellation, by their deadline, or by the client leaving: the agent never holds more
    than 2 slots, and none once every wait ended."""
    settings.HARNESS_MAX_WAITS_PER_AGENT = 2
    fx, session_id = agent_session
    ids = [pending_call(app, serving, fx, session_id, f"w{i}") for i in range(8)]
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(limits.waits_held(fx.agent))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    exchanges: list[Exchange] = []
    try:
        for round_ in range(4):
            first, second = ids[2 * round_], ids[2 * round_ + 1]
            a = request(app, serving, fx, "GET", f"/api/v1/calls/{first}?wait=0.4")
            path = f"/api/v1/sessions/{session_id}/calls?wait=30"
            b = request(app, serving, fx, "POST", path, {"calls": [write(f"w{2 * round_ + 1}")]})
            c = request(app, serving, fx, "GET", f"/api/v1/calls/{first}?wait=30")
            exchanges += [a, b, c]
            time.sleep(0.1)
            request(app, serving, fx, "POST", f"/api/v1/calls/{second}/cancel").answer()
            c.hang_up()
            for exchange in (a, b, c):
                exchange.future.result(30)
    finally:
        stop.set()
        sampler.join()
    assert max(seen) <= 2, max(seen)
    assert until_held(fx.agent, 0, 5) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["GET", "POST"])
@pytest.mark.parametrize("failure", ["wake_unavailable", "read_fails_once_done"])
def test_a_wait_that_fails_gives_its_slot_back(
    app: Any,
    serving: ServingLoop,
    agent_session: tuple[AgentFixture, str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
    failure: str,
) -> None:
    """The wake-up channel fails (WakeUnavailable: answered at once with the call's state),
    or the read that would find the call done raises (a DatabaseError: 503): the slot is
    given back either way."""
    fx, session_id = agent_session
    call_id = pending_call(app, serving, fx, session_id, "w1")
    if failure == "wake_unavailable":

        def unavailable(channels: Any) -> Any:
            raise wakeups.WakeUnavailable("redis down")

        monkeypatch.setattr(wakeups, "wake_on", unavailable)
    else:
        original = api._reload

        def failing(call_ids: list[str], slot: api.HeldSlot | None = None) -> Any:
            calls = original(call_ids)
            if all(is_done(c) for c in calls):
                raise DatabaseError("connection lost")
            return calls

        monkeypatch.setattr(api, "_reload", failing)
        # The cancel goes in once the request sleeps on its wake-ups: the POST takes its
        # slot before it reads the call, so a cancel just after the slot was taken was
        # read there (done: answered 200 with no read left to fail).
        following = threading.Event()
        follow = api._follow

        async def watched_follow(*args: Any, **kwargs: Any) -> Any:
            following.set()
            return await follow(*args, **kwargs)

        monkeypatch.setattr(api, "_follow", watched_follow)
    if how == "GET":
        waiting = request(app, serving, fx, "GET", f"/api/v1/calls/{call_id}?wait=30")
    else:
        path = f"/api/v1/sessions/{session_id}/calls?wait=30"
        waiting = request(app, serving, fx, "POST", path, {"calls": [write("w1")]})
    if failure == "wake_unavailable":
        status, _ = waiting.answer()
        assert status in (200, 202)
    else:
        assert until_held(fx.agent, 1) == 1
        assert following.wait(30), "the request never waited for a wake-up"
        request(app, serving, fx, "POST", f"/api/v1/calls/{call_id}/cancel").answer()
        status, _ = waiting.answer()
        assert status == 503  # (a DatabaseError: Service Unavailable)
    assert until_held(fx.agent, 0, 5) == 0


# --- 2. Pushes to the reviewer queues ------------------------------------------------------


class Layer:
    """A channel layer whose sends to `failing` raise and to `stuck` never end."""

    def __init__(self, failing: str = "", stuck: str = "") -> None:
        self.failing, self.stuck = failing, stuck
        self.got: list[tuple[str, str]] = []

    async def group_send(self, group: str, message: dict[str, str]) -> None:
        if group == self.failing:
            raise ConnectionError("publish failed")
        if group == self.stuck:
            await asyncio.Event().wait()
        await asyncio.sleep(0)
        self.got.append((group, message["html"]))


@pytest.mark.parametrize("failing", [live.GROUP, live.team_group(7)])
def test_one_groups_failed_send_loses_no_other_and_reaches_no_other_team(
    monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    layer = Layer(failing=failing)
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    with pytest.raises(ConnectionError):
        live._send_to((7, None), {"type": "queue.push", "html": "ask"})
    expected = {live.GROUP, live.team_group(7)} - {failing}
    assert {group for group, _ in layer.got} == expected
    # Pushes for one call, one after another from one thread: in order in every queue.
    layer.failing = ""
    layer.got.clear()
    live._send_to((7, 3), {"type": "queue.push", "html": "ask"})
    live._send_to((7, 3), {"type": "queue.push", "html": "removed"})
    for group in (live.GROUP, live.team_group(7), live.team_group(3)):
        assert [html for g, html in layer.got if g == group] == ["ask", "removed"]
    assert {g for g, _ in layer.got} == {live.GROUP, live.team_group(7), live.team_group(3)}


def test_a_stuck_send_holds_its_caller_at_most_its_timeout_and_the_other_group_gets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = Layer(stuck=live.team_group(7))
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        live._send_to((7,), {"type": "queue.push", "html": "ask"})
    assert time.monotonic() - started < 12
    assert layer.got == [(live.GROUP, "ask")]
    # The loop goes on: the next push is sent.
    layer.stuck = ""
    live._send_to((7,), {"type": "queue.push", "html": "next"})
    assert (live.team_group(7), "next") in layer.got


# --- 3. A removed server's configuration ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.heavy
def test_a_server_whose_tools_await_review_then_are_accepted_is_not_refused(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """No false refusal: the server's tools are held for review (none offered: the rebuild
    retires its session, the server still registered), then accepted again: its calls are
    served, on a session opened again with its configuration."""
    from dispatcher.tools.sources.models import McpTool, ToolState

    name = register(hostile.url, "--header", "X-Probe=same")
    endpoint, fingerprint = target(name, "probe")
    assert probe_on(serving.loop, endpoint, fingerprint) == "same"
    states = dict(McpTool.objects.filter(server__name=name).values_list("pk", "state"))
    McpTool.objects.filter(server__name=name).update(state=ToolState.CHANGED)
    services._bump_generation()
    assert catalog.upstream_tool(f"{name}__probe") is None  # (the rebuild: keep_only)
    until_no_session(serving.loop, name)
    for pk, state in states.items():
        McpTool.objects.filter(pk=pk).update(state=state)
    services._bump_generation()
    again, again_fingerprint = target(name, "probe")
    assert again == endpoint
    assert probe_on(serving.loop, again, again_fingerprint) == "same"


def test_held_is_safe_while_loops_open_and_retire_sessions() -> None:
    """`held` from another thread while a loop adds and removes sessions in its own
    dict (as `_connection` and `_retire_all_but` do): never raises, never invents an id."""
    pool = upstream_module.Pool()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stop = threading.Event()
    endpoints = [
        upstream_module.Endpoint(i, 1, f"s{i}", "http", url="http://127.0.0.1:9/")
        for i in range(50)
    ]

    async def churn() -> None:
        connections = pool._on_this_loop()
        while not stop.is_set():
            for e in endpoints:
                connections[e] = None  # type: ignore[assignment]
            for e in endpoints:
                del connections[e]
            await asyncio.sleep(0)

    churning = asyncio.run_coroutine_threadsafe(churn(), loop)
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert {key.server_id for key in pool.held()} <= set(range(50))
    finally:
        stop.set()
        churning.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
