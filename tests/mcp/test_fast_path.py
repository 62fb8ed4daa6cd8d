"""The fast path of tools/call (issue 37; docs/mcp.md, "The fast path"): the same requests
sent with HARNESS_MCP_FAST_PATH on and off get the same answers (status, JSON-RPC content),
framed as the SDK's transport frames them (one JSON body, as in its JSON mode, for a call
done within mcp_fast.JSON_WITHIN; its SSE stream, headers and pings for one still waiting
then), and what needs the SDK's server (progress, batches, other revisions, bodies the SDK
refuses) still goes to it.

The gateway's ASGI app runs in this process, driven as daphne drives it, against a real
upstream HTTP server (its echo is auto-allowed and runs in the inline lane)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from dispatcher.gateways import mcp_fast, mcp_http
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import Status, ToolCall
from dispatcher.tools.sources import upstream as upstream_module
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import review, wait_for_pending
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.mcp_requests import HANDSHAKE, initialize

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


@pytest.fixture
def upstream(trusted_upstream: str, settings: Any) -> str:
    """The trusted upstream, with progress notifications every 0.2 s; its name."""
    settings.HARNESS_MCP_PROGRESS_INTERVAL = 0.2
    return trusted_upstream


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    via_sdk: bool

    def messages(self) -> list[Any]:
        """The JSON-RPC messages of an SSE body (or the JSON body)."""
        if not self.headers.get("content-type", "").startswith("text/event-stream"):
            return [json.loads(self.body)] if self.body else []
        return [
            json.loads(line[len(b"data: ") :])
            for line in self.body.split(b"\r\n")
            if line.startswith(b"data: ") and line[len(b"data: ") :]
        ]


@dataclass
class Gateway:
    """/mcp/ in this process, with a record of the requests (scopes) the SDK served."""

    fx: AgentFixture
    sdk_scopes: list[Any] = field(default_factory=list)
    sdk_methods: list[str] = field(default_factory=list)
    # Every body chunk sent, as it is sent (a reviewer thread may wait on one).
    streamed: list[bytes] = field(default_factory=list)

    def post(
        self,
        body: Any,
        session: str = "",
        extra: dict[str, str] | None = None,
        hang_up: threading.Event | None = None,
    ) -> Answer:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {
            "host": "localhost",
            "authorization": f"Bearer {self.fx.token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **({"mcp-session-id": session, "mcp-protocol-version": HANDSHAKE} if session else {}),
            **(extra or {}),
        }
        return asyncio.run(self._exchange(raw, headers, hang_up or threading.Event()))

    async def _exchange(
        self, body: bytes, headers: dict[str, str], hang_up: threading.Event
    ) -> Answer:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/mcp/",
            "scheme": "http",
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        }
        sent: list[MutableMapping[str, Any]] = []
        arrived = [False]

        async def receive() -> dict[str, Any]:
            if not arrived[0]:
                arrived[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            # The client stays until the answer has ended, or hangs up.
            await asyncio.to_thread(hang_up.wait)
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)
            self.streamed.append(message.get("body", b""))
            if message["type"] == "http.response.body" and not message.get("more_body"):
                hang_up.set()

        await asyncio.wait_for(mcp_http.application(scope, receive, send), 60)
        hang_up.set()
        if not sent:  # (a client that hung up before anything was sent)
            return Answer(0, {}, b"", via_sdk=any(s is scope for s in self.sdk_scopes))
        start = sent[0]
        return Answer(
            start["status"],
            {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]),
            via_sdk=any(s is scope for s in self.sdk_scopes),
        )

    def session(self) -> str:
        answer = self.post(initialize("fast-path-test", run=uuid.uuid4().hex))
        return answer.headers["mcp-session-id"]


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Callable[[AgentFixture], Gateway]:
    """A Gateway per agent; each records the requests the SDK's transport served."""
    run_transport = mcp_http.run_transport
    scopes: list[Any] = []
    methods: list[str] = []

    async def recording(caller: Any, scope: Any, receive: Any, send: Any, **kw: Any) -> None:
        scopes.append(scope)
        first = await receive()  # (the body the gateway read, handed on unchanged)
        with contextlib.suppress(ValueError, AttributeError):
            methods.append(json.loads(first.get("body") or b"{}").get("method", ""))

        async def again() -> Any:
            nonlocal first
            if first is not None:
                message, first = first, None
                return message
            return await receive()

        await run_transport(caller, scope, again, send, **kw)

    monkeypatch.setattr(mcp_http, "run_transport", recording)
    return lambda fx: Gateway(fx, scopes, methods)


def pending_in(session: str) -> ToolCall:
    """The session's call waiting for a reviewer (the test is the reviewer)."""
    call = ToolCall.objects.filter(session__external_id=session).first()
    name = call.name if call is not None else ""
    return wait_for_pending(session, tool=name) if name else _pending_later(session)


def _pending_later(session: str) -> ToolCall:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        call = ToolCall.objects.filter(session__external_id=session).first()
        if call is not None:
            return wait_for_pending(session, tool=call.name)
        time.sleep(0.05)
    raise AssertionError(f"no call in {session}")


def call(request_id: Any, name: str, arguments: Any, meta: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def comparable(answer: Answer) -> tuple[int, list[Any]]:
    """The answer without what differs from call to call (call ids) or with its framing
    (`framed_as_the_sdk_frames` compares that): its status and JSON-RPC messages."""
    messages = answer.messages()
    for message in messages:
        meta = (message.get("result") or {}).get("_meta", {}).get("harness/call")
        if meta:
            meta["id"] = "<call>"
            if "replaces" in meta:
                meta["replaces"] = "<call>"
    return answer.status, messages


def framed_as_the_sdk_frames(fast: Answer, sdk: Answer) -> None:
    """The fast answer's framing is one the SDK's transport writes: one JSON body with its
    JSON mode's headers (Content-Type, Content-Length), or the same SSE stream as the SDK's
    answer here (its headers; one `message` event)."""
    headers = {k: v for k, v in fast.headers.items() if k != "mcp-session-id"}
    assert fast.headers.get("mcp-session-id") and sdk.headers.get("mcp-session-id")
    if fast.headers.get("content-type") == "application/json":
        assert headers == {
            "content-type": "application/json",
            "content-length": str(len(fast.body)),
        }
        assert isinstance(json.loads(fast.body), dict)  # one JSON-RPC message, not a stream
    else:
        assert headers == {k: v for k, v in sdk.headers.items() if k != "mcp-session-id"}
        assert fast.body.startswith(b"event: message\r\ndata: {")


def both_ways(
    settings: Any, g: Gateway, body: Any, *, during: Callable[[str], None] | None = None
) -> tuple[Answer, Answer]:
    """`body` in a new session with the fast path on, then in another with it off (the
    same request ids); `during(session)` runs in a thread while each request is open."""
    answers = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session = g.session()
        worker = None
        if during is not None:
            worker = threading.Thread(
                target=closing_connections(functools.partial(during, session)), daemon=True
            )
            worker.start()
        answers.append(g.post(body, session))
        if worker is not None:
            worker.join(30)
    fast_answer, sdk_answer = answers
    assert sdk_answer.via_sdk  # (off: every request goes to the SDK)
    assert comparable(fast_answer) == comparable(sdk_answer)
    framed_as_the_sdk_frames(fast_answer, sdk_answer)
    return fast_answer, sdk_answer


def test_an_allowed_call_is_answered_without_the_sdk_exactly_as_the_sdk_answers(
    upstream: str,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (what is shown is the framing of a call done within the window, not the window: on
    # a loaded host the first call to a new upstream session may take more than a second)
    monkeypatch.setattr(mcp_fast, "JSON_WITHIN", 60.0)
    g = gateway(make_agent())
    fast, sdk = both_ways(settings, g, call(7, f"{upstream}__echo", {"text": "hi"}))
    assert not fast.via_sdk and sdk.via_sdk
    [message] = fast.messages()
    assert message["id"] == 7 and message["result"]["isError"] is False
    assert message["result"]["content"] == [{"type": "text", "text": "echo: hi"}]
    # Done at once: one JSON body, as the SDK's transport answers in its JSON mode (a
    # client reads it to its end and keeps its connection), where the SDK's path (SSE
    # mode) answers one event on a stream.
    assert fast.headers["content-type"] == "application/json"
    assert fast.headers["content-length"] == str(len(fast.body))
    assert fast.headers["mcp-session-id"] and json.loads(fast.body) == message
    assert sdk.headers["content-type"] == "text/event-stream"
    call_row = ToolCall.objects.get(pk=message["result"]["_meta"]["harness/call"]["id"])
    assert call_row.status == Status.COMPLETED and call_row.tool_use_id == "mcp:7"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("readFile", {"path": "a"}),  # an unknown tool
        ("read_file", {"path": 5}),  # invalid arguments
        ("x" * 300, {}),  # a name Harness cannot store: a JSON-RPC error
    ],
)
def test_refused_calls_get_the_same_answer_both_ways(
    upstream: str,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
    name: str,
    arguments: Any,
) -> None:
    g = gateway(make_agent())
    fast, _ = both_ways(settings, g, call("r-1", name, arguments))
    assert not fast.via_sdk
    [message] = fast.messages()
    assert message.get("error") or message["result"]["isError"] is True


def test_a_call_the_policy_denies_gets_the_same_answer_both_ways(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    g = gateway(make_agent(mode="read_only"))
    fast, _ = both_ways(settings, g, call(3, f"{upstream}__write_note", {"path": "a", "text": "b"}))
    assert not fast.via_sdk
    assert fast.messages()[0]["result"]["isError"] is True


def test_an_upstream_error_gets_the_same_answer_both_ways(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    g = gateway(make_agent(mode="trusted"))
    fast, _ = both_ways(settings, g, call(4, f"{upstream}__fail", {"reason": "quota"}))
    assert not fast.via_sdk
    result = fast.messages()[0]["result"]
    assert result["isError"] is True and "upstream refused: quota" in result["content"][0]["text"]


@pytest.mark.parametrize("approve", [True, False])
def test_a_call_held_for_a_reviewer_gets_the_same_answer_both_ways(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway], approve: bool
) -> None:
    """The permission prompt (decide-only: nothing runs) waits for the reviewer's decision
    in the request, then answers allow or deny."""
    g = gateway(make_agent())
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    def decide(session: str) -> None:
        pending = pending_in(session)
        review(pending, reviewer, approve=approve, feedback="" if approve else "Not now.")

    prompt = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}
    fast, _ = both_ways(settings, g, call(5, "approval_prompt", prompt), during=decide)
    assert not fast.via_sdk
    text = json.loads(fast.messages()[0]["result"]["content"][0]["text"])
    assert text["behavior"] == ("allow" if approve else "deny")


def test_a_call_still_waiting_after_the_json_window_is_answered_on_the_sse_stream(
    upstream: str,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call the reviewer decides after the window: the SSE stream is opened when the
    window ends (its headers before the decision), and the answer is one event on it,
    framed as the SDK's (the same headers as the SDK's answer to the same request)."""
    monkeypatch.setattr(mcp_fast, "JSON_WITHIN", 0.05)
    g = gateway(make_agent())
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    prompt = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}
    answers = []
    for fast in (True, False):
        settings.HARNESS_MCP_FAST_PATH = fast
        session = g.session()
        g.streamed.clear()  # (nothing of this request is sent before the window ends)

        def decide(session: str = session) -> None:
            pending = pending_in(session)
            deadline = time.monotonic() + 15
            while not g.streamed:  # the stream's headers: the first message sent
                assert time.monotonic() < deadline
                time.sleep(0.02)
            review(pending, reviewer, approve=True)

        thread = threading.Thread(target=closing_connections(decide), daemon=True)
        thread.start()
        answers.append(g.post(call(15, "approval_prompt", prompt), session))
        thread.join(30)
    fast_answer, sdk_answer = answers
    assert not fast_answer.via_sdk and sdk_answer.via_sdk
    assert comparable(fast_answer) == comparable(sdk_answer)
    framed_as_the_sdk_frames(fast_answer, sdk_answer)
    assert fast_answer.headers["content-type"] == "text/event-stream"
    [message] = fast_answer.messages()
    assert json.loads(message["result"]["content"][0]["text"])["behavior"] == "allow"


def test_a_call_cancelled_by_another_request_gets_the_same_answer_both_ways(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    g = gateway(make_agent())

    def cancel(session: str) -> None:
        wait_for_pending(session, tool=f"{upstream}__write_note")
        note = {"requestId": 6, "reason": "The user pressed Esc."}
        cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": note}
        assert g.post(cancelled, session).status == 202

    fast, _ = both_ways(
        settings, g, call(6, f"{upstream}__write_note", {"path": "a", "text": "b"}), during=cancel
    )
    assert not fast.via_sdk
    result = fast.messages()[0]["result"]
    assert result["isError"] is True and "The user pressed Esc." in result["content"][0]["text"]
    assert result["_meta"]["harness/call"]["status"] == Status.CANCELLED


def test_a_call_asking_for_progress_goes_to_the_sdk(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    g = gateway(make_agent())
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    def approve(session: str) -> None:
        pending = pending_in(session)
        deadline = time.monotonic() + 15
        while b"notifications/progress" not in b"".join(g.streamed):  # announced first
            assert time.monotonic() < deadline
            time.sleep(0.05)
        review(pending, reviewer, approve=True)

    prompt = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}
    body = call(8, "approval_prompt", prompt, meta={"progressToken": "p"})
    settings.HARNESS_MCP_FAST_PATH = True
    session = g.session()
    reviewer_thread = threading.Thread(
        target=closing_connections(functools.partial(approve, session)), daemon=True
    )
    reviewer_thread.start()
    answer = g.post(body, session)
    reviewer_thread.join(30)
    assert answer.via_sdk
    progress, result = answer.messages()
    assert progress["method"] == "notifications/progress"
    assert "Waiting for a reviewer" in progress["params"]["message"]
    assert json.loads(result["result"]["content"][0]["text"])["behavior"] == "allow"


@pytest.mark.parametrize(
    ("body", "extra"),
    [
        ([call(1, "readFile", {})], {}),  # a batch
        (call(1, "readFile", 5), {}),  # params the SDK refuses
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ', {}),  # no JSON
        (call(1, "readFile", {}), {"accept": "application/json"}),  # no SSE accepted
        (call(1, "readFile", {}), {"content-type": "text/plain"}),
        (call(1, "readFile", {}), {"mcp-protocol-version": "2026-07-28"}),
    ],
)
def test_what_the_sdk_must_answer_goes_to_the_sdk(
    upstream: str,
    settings: Any,
    gateway: Callable[[AgentFixture], Gateway],
    body: Any,
    extra: dict[str, str],
) -> None:
    g = gateway(make_agent())
    settings.HARNESS_MCP_FAST_PATH = True
    answer = g.post(body, g.session(), extra)
    assert answer.via_sdk
    settings.HARNESS_MCP_FAST_PATH = False
    again = g.post(body, g.session(), extra)
    assert (answer.status, answer.body) == (again.status, again.body)


@pytest.mark.parametrize("fast", [True, False])
def test_a_client_that_hangs_up_ends_its_request_and_leaves_the_call_pending(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway], fast: bool
) -> None:
    """Before 2026-07-28 a dropped connection is no cancellation: the call stays for its
    reviewer, and the request ends without an answer, on either path."""
    settings.HARNESS_MCP_FAST_PATH = fast
    g = gateway(make_agent())
    session = g.session()
    hang_up = threading.Event()
    pending: list[ToolCall] = []

    def leave(session: str) -> None:
        pending.append(pending_in(session))
        hang_up.set()

    thread = threading.Thread(
        target=closing_connections(functools.partial(leave, session)), daemon=True
    )
    thread.start()
    prompt = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}
    answer = g.post(call(9, "approval_prompt", prompt), session, hang_up=hang_up)
    thread.join(30)
    assert answer.via_sdk is not fast
    # (the SDK's stream was open before the client left; the fast path, within its JSON
    # window, had sent nothing yet, and sends nothing to a client that is gone)
    assert (answer.status, answer.messages()) == ((0, []) if fast else (200, []))
    [held] = pending
    held.refresh_from_db()
    assert held.status == Status.PENDING_APPROVAL


def test_the_official_clients_calls_take_the_fast_path(
    upstream: str, settings: Any, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    """The SDK's own client (its handshake: initialize, then calls) is served the fast
    way, and reads the answers as it reads the SDK's."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    fx = make_agent()
    g = gateway(fx)
    settings.HARNESS_MCP_FAST_PATH = True

    async def scenario() -> list[Any]:
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=mcp_http.application),
            base_url="http://localhost",
            headers={"Authorization": f"Bearer {fx.token}"},
        )
        async with (
            http,
            streamable_http_client("http://localhost/mcp/", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            results = [await session.call_tool(f"{upstream}__echo", {"text": "a"})]
            results.append(await session.call_tool("readFile", {"path": "a"}))
            return results

    echoed, unknown = asyncio.run(scenario())
    # (the client lists the tools after its first call, to read their output schemas)
    assert "tools/list" in g.sdk_methods and "tools/call" not in g.sdk_methods
    assert echoed.is_error is False and echoed.content[0].text == "echo: a"
    assert unknown.is_error is True and "Tool 'readFile' does not exist" in unknown.content[0].text


def test_an_inline_call_is_answered_while_the_pools_loop_thread_is_held_up(
    gateway: Any, upstream: str
) -> None:
    """The inline lane's upstream request is made on the request's own event loop
    (upstream.Pool.loop_for): with the pool's loop thread busy (a blocking callback on
    it), the call is still run and answered."""
    fx = make_agent(mode="trusted")
    g = gateway(fx)
    session = g.session()
    held, release, gave_up = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        if not release.wait(20):
            gave_up.set()

    upstream_module.POOL.loop().call_soon_threadsafe(hold)
    assert held.wait(10), "the pool's loop did not run the blocking callback"
    try:
        answer = g.post(call(1, f"{upstream}__echo", {"text": "own loop"}), session)
        answered_while_held = not gave_up.is_set()
    finally:
        release.set()
    assert answered_while_held
    [message] = answer.messages()
    assert message["result"]["content"] == [{"type": "text", "text": "echo: own loop"}]
    stored = ToolCall.objects.get(session__external_id=split_session_id(session)[0])
    assert (stored.status, stored.content, stored.attempts) == (
        Status.COMPLETED,
        "echo: own loop",
        1,
    )
