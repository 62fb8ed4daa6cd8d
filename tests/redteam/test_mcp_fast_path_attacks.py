"""Red-team of the MCP gateway's fast path (issue 37; dispatcher/gateways/mcp_fast.py,
docs/mcp.md "The fast path"). Each test is an attack; it passes when the attack fails:
the same request sent with HARNESS_MCP_FAST_PATH on and off gets the same answer (header
smuggling, body and params quirks, ids; framed as the SDK frames an answer), the same
audit events, the same wait cap; a client hanging up on a held fast call (in this
process, and on a real daphne in test_mcp_fast_path_attacks_live.py) gives its wait slot
back and leaves the call for its reviewer; keep-alive pings are sent alike."""

# ruff: noqa: F811  (the `gateway` fixture, imported, is each test's argument)
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from sse_starlette import EventSourceResponse

from audit.models import AuditEvent
from dispatcher import limits
from dispatcher.gateways import mcp_http
from dispatcher.models import AgentSession, ToolCall
from tests.mcp.conftest import review, wait_for_pending
from tests.mcp.test_fast_path import (  # noqa: F401
    Answer,
    Gateway,
    comparable,
    framed_as_the_sdk_frames,
    gateway,
)
from tests.support.factories import AgentFixture, make_agent, make_user, unique

# `slow` (make test-all): 85 requests twice over, about 90 s per backend; its helper
# threads keep their connections (tests/mcp/test_fast_path.py closes them: `closing`).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy, pytest.mark.slow]


def body(request_id: Any = 1, **params: Any) -> dict[str, Any]:
    params.setdefault("name", "readFile")
    params.setdefault("arguments", {"path": "a"})
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


QUIRKS: dict[str, tuple[Any, dict[str, str]]] = {
    "id-null": (body(None), {}),
    "id-float": (body(1.5), {}),
    "id-float-int": (
        b'{"jsonrpc":"2.0","id":1.0,"method":"tools/call","params":{"name":"readFile","arguments":{}}}',
        {},
    ),
    "id-bool": (body(True), {}),
    "id-huge": (body(2**80), {}),
    "id-neg": (body(-3), {}),
    "id-empty": (body(""), {}),
    "id-long": (body("x" * 5000), {}),
    "jsonrpc-1.0": ({**body(), "jsonrpc": "1.0"}, {}),
    "extra-top": ({**body(), "extra": 1, "result": {}}, {}),
    "bom": (b"\xef\xbb\xbf" + json.dumps(body()).encode(), {}),
    "latin1": (json.dumps(body(name="r\u00e9")).encode().replace(b"\\u00e9", b"\xe9"), {}),
    "dup-id": (
        b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"readFile","arguments":{}}}',
        {},
    ),
    "dup-method": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"readFile","arguments":{}}}',
        {},
    ),
    "dup-name": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"approval_prompt","name":"readFile","arguments":{}}}',
        {},
    ),
    "nan-arg": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"readFile","arguments":{"x":NaN}}}',
        {},
    ),
    "inf-arg": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"readFile","arguments":{"x":1e999}}}',
        {},
    ),
    "batch-one": ([body()], {}),
    "name-zw": (body(name="read\u200bFile"), {}),
    "name-nul": (body(name="read\u0000File"), {}),
    "name-surrogate": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800","arguments":{}}}',
        {},
    ),
    "name-int": (body(name=5), {}),
    "args-list": (body(arguments=[1]), {}),
    "args-null": (body(arguments=None), {}),
    "args-str": (body(arguments="x"), {}),
    "no-args": (
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "readFile"}},
        {},
    ),
    "meta-list": (body(_meta=[1]), {}),
    "meta-str": (body(_meta="x"), {}),
    "meta-null": (body(_meta=None), {}),
    "meta-pt-null": (body(_meta={"progressToken": None}), {}),
    "meta-pt-snake": (body(_meta={"progress_token": "p"}), {}),
    "meta-nested": (body(_meta={"a": {"b": [1, {"c": None}]}}), {}),
    "task": (body(task={"ttl": 1000}), {}),
    "task-bad": (body(task="x"), {}),
    "extra-param": (body(foo=1), {}),
    "params-list": ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}, {}),
    "no-params": ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, {}),
    "deep-args": (body(arguments={"a": json.loads("[" * 150 + "]" * 150)}), {}),
    "ct-charset": (body(), {"content-type": "application/json; charset=utf-8"}),
    "ct-latin1": (body(), {"content-type": "application/json; charset=iso-8859-1"}),
    "ct-upper": (body(), {"content-type": "Application/JSON"}),
    "ct-list": (body(), {"content-type": "text/plain, application/json"}),
    "ct-list2": (body(), {"content-type": "application/json, text/plain"}),
    "ct-jsonx": (body(), {"content-type": "application/jsonx"}),
    "ct-space": (body(), {"content-type": " application/json"}),
    "acc-star": (body(), {"accept": "*/*"}),
    "acc-wild": (body(), {"accept": "application/*, text/*"}),
    "acc-upper": (body(), {"accept": "APPLICATION/JSON, TEXT/EVENT-STREAM"}),
    "acc-q0": (body(), {"accept": "application/json;q=0, text/event-stream;q=0"}),
    "ver-lower": (body(), {"mcp-protocol-version": "2025-03-26"}),
    "ver-old": (body(), {"mcp-protocol-version": "2024-11-05"}),
    "ver-bogus": (body(), {"mcp-protocol-version": "1999-01-01"}),
    "id-5000-digits": (
        b'{"jsonrpc":"2.0","id":'
        + b"9" * 5000
        + b',"method":"tools/call","params":{"name":"readFile","arguments":{}}}',
        {},
    ),
    "arg-5000-digits": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"readFile","arguments":{"x":'
        + b"9" * 5000
        + b"}}}",
        {},
    ),
    "prompt-5000-digits": (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"approval_prompt","arguments":{"tool_name":"Bash","input":{"x":'
        + b"9" * 5000
        + b"}}}}",
        {},
    ),
    "name-dunder": (body(name="__"), {}),
    "name-upstream-ish": (body(name="nosuch__tool"), {}),
    "name-upstream-empty": (body(name="a__"), {}),
    "name-200": (body(name="s__" + "x" * 197), {}),
    "prompt-dunder": (body(name="approval_prompt", arguments={"tool_name": "__", "input": {}}), {}),
    "prompt-mcp-name": (
        body(name="approval_prompt", arguments={"tool_name": "mcp__x__y", "input": {"a": 1}}),
        {},
    ),
    "prompt-long-name": (
        body(name="approval_prompt", arguments={"tool_name": "x" * 5000, "input": {}}),
        {},
    ),
    "prompt-nul-name": (
        body(name="approval_prompt", arguments={"tool_name": "a\u0000", "input": {}}),
        {},
    ),
    "prompt-long-ids": (
        body(
            "r" * 150,
            name="approval_prompt",
            arguments={"tool_name": "Bash", "input": {"command": "ls"}, "tool_use_id": "t" * 150},
        ),
        {},
    ),
    "prompt-id-obj": (
        body(
            7,
            name="approval_prompt",
            arguments={
                "tool_name": "Bash",
                "input": {"command": "ls"},
                "tool_use_id": {"a": [1] * 100},
            },
        ),
        {},
    ),
    "ver-space": (body(), {"mcp-protocol-version": " 2025-06-18"}),
}


@pytest.mark.parametrize("quirk", list(QUIRKS))
def test_a_quirky_request_gets_the_same_answer_both_ways(
    quirk: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    raw, extra = QUIRKS[quirk]
    g = gateway(make_agent(mode="locked" if quirk.startswith("prompt-") else "standard"))
    answers: list[Answer] = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        answers.append(g.post(raw, g.session(), extra))
    f, s = answers
    if f.status == 200:
        assert comparable(f) == comparable(s)
        framed_as_the_sdk_frames(f, s)
    else:
        assert (f.status, f.body) == (s.status, s.body)


# --- Beyond parsing: the record, the caps, a hang-up, DELETE -----------------------------


PROMPT = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}


def kinds(session: str) -> list[str]:
    pk = AgentSession.objects.get(external_id=session).pk
    return list(
        AuditEvent.objects.filter(session_id=pk).order_by("seq").values_list("kind", flat=True)
    )


@pytest.mark.parametrize("case", ["rejected", "denied", "approved", "refused-args"])
def test_audit_kinds_same_both_ways(
    case: str,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
) -> None:
    fx = make_agent(mode="read_only" if case == "denied" else "standard")
    g = gateway(fx)
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    requests = {
        "rejected": body(3),
        "denied": body(3, name="write_file", arguments={"path": "a", "content": "b"}),
        "approved": body(3, name="approval_prompt", arguments=PROMPT),
        "refused-args": body(3, name="read_file", arguments={"path": 5}),
    }
    seen = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session = g.session()
        worker = None
        if case == "approved":
            worker = threading.Thread(
                target=_closing(
                    lambda s=session: review(
                        wait_for_pending(s, tool="client_tool"), reviewer, approve=True
                    )
                ),
                daemon=True,
            )
            worker.start()
        answer = g.post(requests[case], session)
        if worker:
            worker.join(30)
        assert answer.via_sdk is not fast
        call_row = ToolCall.objects.get(session__external_id=session)
        assert call_row.digest
        seen.append(kinds(session))
    assert seen[0] == seen[1]


def _closing(target: Callable[[], object]) -> Callable[[], None]:
    """`target` for a thread of the test's: its database connection given back to the pool
    when it ends (the pool check fails a test whose threads keep theirs)."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    return run


@pytest.mark.parametrize("fast", [True, False])
def test_wait_cap_and_slot_given_back_after_hang_up(
    fast: bool,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
) -> None:
    settings.HARNESS_MCP_FAST_PATH = fast
    settings.HARNESS_MAX_WAITS_PER_AGENT = 1
    fx = make_agent()
    g = gateway(fx)
    session = g.session()
    hang_up = threading.Event()
    refused: list[Answer] = []

    def second_then_leave() -> None:
        wait_for_pending(session, tool="client_tool")
        assert limits.waits_held(fx.agent) == 1
        refused.append(g.post(body(2, name="approval_prompt", arguments=PROMPT), session))
        hang_up.set()

    t = threading.Thread(target=_closing(second_then_leave), daemon=True)
    t.start()
    headers = {
        "host": "localhost",
        "authorization": f"Bearer {fx.token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-session-id": session,
        "mcp-protocol-version": "2025-06-18",
    }
    raw = json.dumps(body(1, name="approval_prompt", arguments=PROMPT)).encode()
    first = asyncio.run(_and_what_it_left(g._exchange(raw, headers, hang_up), fx))
    t.join(30)
    assert first.messages() == []
    [second] = refused
    assert second.via_sdk is not fast
    assert second.messages()[0]["error"]["code"] == -32029
    assert limits.waits_held(fx.agent) == 0


async def _and_what_it_left(exchange: Any, fx: AgentFixture) -> Answer:
    """The exchange, then the loop kept running until the agent's wait slots are given
    back (the release, shielded, ends after the request: daphne's loop runs it;
    asyncio.run would cancel it), for at most 15 s."""
    answer: Answer = await exchange
    held = sync_to_async(limits.waits_held, thread_sensitive=False)
    async with asyncio.timeout(15):
        while await held(fx.agent):
            await asyncio.sleep(0.02)
    return answer


def test_delete_then_call_same_both_ways(
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
) -> None:
    fx = make_agent()
    g = gateway(fx)
    out = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session = g.session()
        status = asyncio.run(_delete(fx.token, session))
        answer = g.post(body(4), session)
        out.append((status, answer.status, answer.via_sdk))
    # (DELETE ends no Harness session on either path: the next call is served alike)
    assert out[0][:2] == out[1][:2] == (200, 200)


async def _delete(token: str, session: str) -> int:
    scope = {
        "type": "http",
        "method": "DELETE",
        "path": "/mcp/",
        "scheme": "http",
        "headers": [
            (b"host", b"localhost"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"mcp-session-id", session.encode()),
            (b"mcp-protocol-version", b"2025-06-18"),
        ],
    }
    sent: list[Any] = []
    first = [True]

    async def receive() -> dict[str, Any]:
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    await asyncio.wait_for(mcp_http.application(scope, receive, send), 30)
    return int(sent[0]["status"])


def test_keep_alive_pings_same_both_ways(
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", 0.3)
    g = gateway(make_agent())
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    bodies = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session = g.session()
        g.streamed.clear()

        def approve(s: str = session) -> None:
            pending = wait_for_pending(s, tool="client_tool")
            deadline = time.monotonic() + 15
            while sum(c.startswith(b": ping") for c in list(g.streamed)) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            review(pending, reviewer, approve=True)

        t = threading.Thread(target=_closing(approve), daemon=True)
        t.start()
        answer = g.post(body(12, name="approval_prompt", arguments=PROMPT), session)
        t.join(30)
        assert answer.via_sdk is not fast
        bodies.append(answer)

    shapes = [re.sub(rb": ping - [^\r]*", b": ping", a.body) for a in bodies]
    shapes = [re.sub(rb'"id":"[0-9a-f-]{36}"', b'"id":"<call>"', s) for s in shapes]
    assert comparable(bodies[0]) == comparable(bodies[1])
    assert shapes[0].count(b": ping") >= 2 and shapes[1].count(b": ping") >= 2


class _Pairs(dict):  # type: ignore[type-arg]
    """Headers with repeats, in order (Gateway._exchange reads .items())."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__()
        self.pairs = pairs

    def items(self) -> Any:
        return self.pairs


DUPLICATES = {
    "ver-handshake-then-modern": [
        ("mcp-protocol-version", "2025-06-18"),
        ("mcp-protocol-version", "2026-07-28"),
    ],
    "ver-modern-then-handshake": [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-protocol-version", "2025-06-18"),
    ],
    "ct-text-then-json": [("content-type", "text/plain"), ("content-type", "application/json")],
    "ct-json-then-text": [("content-type", "application/json"), ("content-type", "text/plain")],
    "accept-split": [("accept", "application/json"), ("accept", "text/event-stream")],
    "session-twice-other": [("mcp-session-id", "SELF"), ("mcp-session-id", "OTHER")],
    "session-other-then-self": [("mcp-session-id", "OTHER"), ("mcp-session-id", "SELF")],
    "upper-name": [("Mcp-Session-Id", "SELF")],
}


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_duplicate_headers(
    case: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    g = gateway(make_agent())
    other_g = gateway(make_agent())
    out = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session, other = g.session(), other_g.session()
        base = {
            "host": "localhost",
            "authorization": f"Bearer {g.fx.token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-06-18",
        }
        extra = [
            (k, v.replace("SELF", session).replace("OTHER", other)) for k, v in DUPLICATES[case]
        ]
        names = {k.lower() for k, _ in extra}
        pairs = [(k, v) for k, v in base.items() if k not in names] + extra
        raw = json.dumps(body(5)).encode()
        answer = asyncio.run(g._exchange(raw, _Pairs(pairs), threading.Event()))
        out.append(answer)
    f, s = out
    if f.status == 200:
        assert comparable(f) == comparable(s)
        framed_as_the_sdk_frames(f, s)
    else:
        assert (f.status, f.body) == (s.status, s.body)


@pytest.mark.parametrize("fast", [True, False])
def test_the_same_request_sent_twice_while_held_is_one_call(
    fast: bool, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    """A retry of a held call (same id, same session) joins it: one call, one decision,
    the same answer to both requests."""
    settings.HARNESS_MCP_FAST_PATH = fast
    g = gateway(make_agent())
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    session = g.session()
    request = body(21, name="approval_prompt", arguments=PROMPT)
    answers: list[Answer] = []

    def retry_then_approve() -> None:
        pending = wait_for_pending(session, tool="client_tool")
        retried = threading.Thread(target=lambda: answers.append(g.post(request, session)))
        retried.start()
        deadline = time.monotonic() + 15  # (the retry is held: its wait slot is taken)
        while limits.waits_held(g.fx.agent) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        review(pending, reviewer, approve=True)
        retried.join(30)

    t = threading.Thread(target=_closing(retry_then_approve), daemon=True)
    t.start()
    first = g.post(request, session)
    t.join(30)
    [second] = answers
    assert first.via_sdk is not fast and second.via_sdk is not fast
    assert comparable(first) == comparable(second)
    assert json.loads(first.messages()[0]["result"]["content"][0]["text"])["behavior"] == "allow"
    assert ToolCall.objects.filter(session__external_id=session).count() == 1


@pytest.mark.parametrize("fast", [True, False])
def test_approval_prompt_with_long_ids_is_decided_not_refused_for_storage(
    fast: bool, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    """A long string request id and a long client tool_use_id made a call id past the
    200 characters a call keeps: PostgreSQL refused it (-32603, "could not record"), SQLite
    stored it. Now a long client id goes by its digest, and two that differ only at their
    end stay two calls."""
    from dispatcher.models import ToolCall

    settings.HARNESS_MCP_FAST_PATH = fast
    fx = make_agent(mode="locked")
    g = gateway(fx)
    session = g.session()
    for tail in ("a", "b"):
        arguments = {
            "tool_name": "Bash",
            "input": {"command": "ls"},
            "tool_use_id": "t" * 300 + tail,
        }
        [message] = g.post(
            body("r" * 150, name="approval_prompt", arguments=arguments), session
        ).messages()
        assert "error" not in message, message
        decision = json.loads(message["result"]["content"][0]["text"])
        assert decision["behavior"] in ("allow", "deny"), decision
    ids = list(
        ToolCall.objects.filter(session__agent=fx.agent).values_list("tool_use_id", flat=True)
    )
    assert len(ids) == 2 and len(set(ids)) == 2 and all(len(i) <= 200 for i in ids), ids
