"""The MCP gateway under a real daphne and Celery worker, with the official `mcp` client."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from django.db import connection
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from approvals.models import ApprovalRequest
from approvals.services import edit
from audit.models import AuditEvent
from dispatcher.models import AgentSession, Status, ToolCall
from dispatcher.policy.profiles import update_profile
from dispatcher.policy.stages import Rejection, resolve, validate
from dispatcher.tools.registry import get_tool
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import mcp_session, review, run, text_of, wait_for_pending
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack
from tests.support.mcp_requests import initialize

pytestmark = pytest.mark.live


def test_a_request_without_a_valid_agent_token_is_refused_401(live_stack: LiveStack) -> None:
    for headers in ({}, {"Authorization": "Bearer hrn_nope_nope"}, {"Authorization": "Basic x"}):
        response = httpx.post(
            live_stack.url + "/mcp/",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
        assert response.status_code == 401
        assert "Bearer <token>" in response.json()["error"]["message"]
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_tools_list_pages_through_the_model_facing_projection(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    async def scenario() -> tuple[list[list[types.Tool]], str | None]:
        async with mcp_session(live_stack, live_agent) as (session, session_id):
            pages = []
            cursor = None
            while True:
                result = await session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor)
                )
                pages.append(result.tools)
                cursor = result.next_cursor
                if cursor is None:
                    return pages, session_id()

    pages, session_id = run(scenario)
    assert len(pages) > 1 and all(len(page) <= 4 for page in pages)
    tools = {tool.name: tool for page in pages for tool in page}
    assert "read_file" in tools and "approval_prompt" in tools
    assert "client_note" not in tools  # the client's own tools are not offered
    read = tools["read_file"]
    assert read.input_schema == get_tool("read_file").parameters  # type: ignore[union-attr]
    assert read.annotations is not None and read.annotations.read_only_hint is True
    # Only the four named fields (and annotations) of the definition, nothing host-only.
    dumped = read.model_dump(by_alias=True, exclude_none=True)
    assert set(dumped) == {"name", "description", "inputSchema", "annotations"}
    # One MCP session is one Harness session.
    assert AgentSession.objects.filter(
        agent=live_agent.agent, client="mcp", external_id=session_id
    ).exists()


def test_the_gateway_does_not_promise_list_changed_notifications(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """It has no stream to send them on (docs/mcp.md): clients must list again."""

    async def scenario() -> types.InitializeResult:
        headers = {"Authorization": f"Bearer {live_agent.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(live_stack.url + "/mcp/", http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            return await session.initialize()

    tools = run(scenario).capabilities.tools
    assert tools is not None and not tools.list_changed


def test_an_allowed_call_runs_in_the_worker_and_returns_its_result(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    async def scenario() -> tuple[types.CallToolResult, str | None]:
        async with mcp_session(live_stack, live_agent) as (session, session_id):
            result = await session.call_tool("list_directory", {"path": "."})
            return result, session_id()

    result, session_id = run(scenario)
    assert result.is_error is False
    call = ToolCall.objects.get(session__external_id=session_id)
    # The JSON-RPC request id (the SDK's client numbers from 1: initialize, then the call).
    assert (call.status, call.dialect, call.tool_use_id) == (Status.COMPLETED, "mcp", "mcp:2")
    assert text_of(result) == call.content
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["call.received", "call.allowed", "call.started", "call.completed"]


def _api_text(stack: LiveStack, fx: AgentFixture, name: str, arguments: Any) -> str:
    with stack.client(fx) as client:
        session = client.post("/api/v1/sessions", json={}).json()
        body = {"calls": [{"id": "c", "name": name, "arguments": arguments}]}
        response = client.post(f"/api/v1/sessions/{session['id']}/calls", json=body)
        return str(response.json()["calls"][0]["content"])


def test_unknown_tool_and_invalid_arguments_are_error_results_with_the_api_text(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    async def scenario() -> list[types.CallToolResult]:
        async with mcp_session(live_stack, live_agent) as (session, _):
            return [
                await session.call_tool("readFile", {"path": "a"}),
                await session.call_tool("read_file", {"path": 5}),
            ]

    unknown, invalid = run(scenario)
    assert unknown.is_error and invalid.is_error
    assert "Tool 'readFile' does not exist" in text_of(unknown)
    assert "Did you mean 'read_file'?" in text_of(unknown)
    assert text_of(unknown) == _api_text(live_stack, live_agent, "readFile", {"path": "a"})
    assert "$.path: expected string, got int 5" in text_of(invalid)
    assert text_of(invalid) == _api_text(live_stack, live_agent, "read_file", {"path": 5})
    with pytest.raises(Rejection):
        validate(resolve("read_file"), {"path": 5})


def _held_call(
    stack: LiveStack, fx: AgentFixture, decide_in_thread: Any
) -> tuple[types.CallToolResult, list[str]]:
    """Call write_file (asks in standard mode) with a progress callback; `decide_in_thread`
    is run in another thread once the call is pending."""
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async def scenario() -> types.CallToolResult:
        async with mcp_session(stack, fx) as (session, session_id):
            decide = functools.partial(decide_in_thread, session_id(), notes)
            worker = threading.Thread(target=closing_connections(decide), daemon=True)
            worker.start()
            return await session.call_tool(
                "write_file",
                {"path": "held.txt", "content": "held\n"},
                progress_callback=on_progress,
            )

    return run(scenario), notes


def test_an_ask_holds_the_request_with_progress_naming_the_reviewer_page(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    def approve(session_id: str, notes: list[str]) -> None:
        call = wait_for_pending(session_id, tool="write_file")
        deadline = time.monotonic() + 10
        while not notes and time.monotonic() < deadline:  # the reviewer page was announced
            time.sleep(0.05)
        review(call, reviewer, approve=True)

    result, notes = _held_call(live_stack, live_agent, approve)
    assert result.is_error is False and text_of(result) == "Wrote 5 bytes to held.txt"
    assert notes and "Waiting for a reviewer" in notes[0]
    assert f"{live_stack.url}/approvals/" in notes[0]
    page = notes[0].rsplit(" ", 1)[-1]
    assert httpx.get(page).status_code in (200, 302)  # a real page (sign-in first)


def test_a_denial_carries_the_reviewers_feedback(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    def deny(session_id: str, notes: list[str]) -> None:
        call = wait_for_pending(session_id, tool="write_file")
        review(call, reviewer, approve=False, feedback="Write it under docs/ instead.")

    result, _ = _held_call(live_stack, live_agent, deny)
    assert result.is_error is True
    assert "Their feedback: Write it under docs/ instead." in text_of(result)


def test_a_reviewers_edit_answers_with_the_replacement_calls_result(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    replaced: list[ToolCall] = []

    def edit_it(session_id: str, notes: list[str]) -> None:
        call = wait_for_pending(session_id, tool="write_file")
        outcome = edit(
            approval_id=ApprovalRequest.objects.get(call=call).pk,
            user=reviewer,
            digest=call.digest,
            arguments={"path": "edited.txt", "content": "edited!\n"},
            comment="Write it to edited.txt.",
        )
        replaced.append(outcome.replacement)

    result, _ = _held_call(live_stack, live_agent, edit_it)
    [replacement] = replaced
    replacement.refresh_from_db()
    assert replacement.status == Status.COMPLETED
    assert result.is_error is False, text_of(result)
    assert text_of(result).endswith("Wrote 8 bytes to edited.txt")
    assert "edited" in text_of(result).split("Wrote 8 bytes")[0]  # the edit's note first
    assert result.meta is not None
    assert result.meta["harness/call"] == {
        "id": str(replacement.pk),
        "status": "completed",
        "replaces": str(replacement.edited_from_id),
    }


def test_an_edit_still_waiting_for_a_quorum_is_followed_until_it_is_decided(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    editor = make_user(unique("editor"), groups=("reviewer",))
    second = make_user(unique("second"), groups=("reviewer",))
    pages: list[str] = []

    def edit_then_approve(session_id: str, notes: list[str]) -> None:
        call = wait_for_pending(session_id, tool="write_file")
        outcome = edit(
            approval_id=ApprovalRequest.objects.get(call=call).pk,
            user=editor,
            digest=call.digest,
            arguments={"path": "quorum.txt", "content": "q\n"},
        )
        assert outcome.replacement_approval is not None  # 1 of 2: still pending
        page = f"/approvals/{outcome.replacement_approval.pk}/"
        deadline = time.monotonic() + 10  # the held request now names the replacement
        while not any(page in note for note in notes) and time.monotonic() < deadline:
            time.sleep(0.05)
        pages.extend(note for note in notes if page in note)
        review(outcome.replacement, second, approve=True)

    result, _ = _held_call(live_stack, fx, edit_then_approve)
    assert pages, "no progress notification named the replacement's reviewer page"
    assert result.is_error is False and text_of(result).endswith("Wrote 2 bytes to quorum.txt")


def request_id_of(call: ToolCall) -> int:
    """The JSON-RPC id of the request that made `call` (its tool_use_id: "mcp:<id>")."""
    return int(call.tool_use_id.removeprefix("mcp:"))


def test_a_client_cancellation_cancels_the_pending_call(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    async def scenario() -> tuple[ToolCall, str]:
        import anyio

        async with mcp_session(live_stack, live_agent) as (session, session_id):
            async with anyio.create_task_group() as group:
                group.start_soon(
                    session.call_tool, "write_file", {"path": "never.txt", "content": "x"}
                )
                call = await anyio.to_thread.run_sync(
                    closing_connections(
                        lambda: wait_for_pending(session_id() or "", tool="write_file")
                    )
                )
                await session.send_notification(
                    types.CancelledNotification(
                        params=types.CancelledNotificationParams(
                            request_id=request_id_of(call), reason="The user pressed Esc."
                        )
                    )
                )
                await anyio.sleep(1)
                group.cancel_scope.cancel()
            return call, session_id() or ""

    call, _ = run(scenario)
    call.refresh_from_db()
    assert call.status == Status.CANCELLED
    assert call.decided_by == f"agent:{live_agent.agent.name}"
    assert "The user pressed Esc." in call.content


def test_a_2026_07_28_client_cancels_a_pending_call_by_closing_its_request(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """The stateless revision has no notifications/cancelled: a client cancels by closing
    the request's stream, and Harness cancels the pending call."""
    from mcp import Client

    def pending() -> ToolCall:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            found = ToolCall.objects.filter(
                session__agent=live_agent.agent, status=Status.PENDING_APPROVAL
            ).first()
            if found is not None:
                return found
            time.sleep(0.05)
        raise AssertionError("no pending call")

    async def scenario() -> tuple[ToolCall, str]:
        import anyio

        headers = {"Authorization": f"Bearer {live_agent.token}"}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
        transport = streamable_http_client(live_stack.url + "/mcp/", http_client=http)
        async with http, Client(transport) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(
                    client.call_tool, "write_file", {"path": "closed.txt", "content": "x"}
                )
                call = await anyio.to_thread.run_sync(closing_connections(pending))
                group.cancel_scope.cancel()  # the request's stream closes
            return call, client.protocol_version

    call, version = run(scenario)
    assert version == "2026-07-28"
    deadline = time.monotonic() + 15
    while call.status == Status.PENDING_APPROVAL and time.monotonic() < deadline:
        time.sleep(0.05)
        call.refresh_from_db()
    assert call.status == Status.CANCELLED
    assert call.decided_by == f"agent:{live_agent.agent.name}"
    assert "closed the request" in call.content
    assert not (Path(call.session.workspace) / "closed.txt").exists()


def test_a_client_cancellation_after_an_edit_cancels_the_replacement(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    editor = make_user(unique("editor"), groups=("reviewer",))

    def edit_pending(session_id: str) -> tuple[ToolCall, ToolCall]:
        call = wait_for_pending(session_id, tool="write_file")
        outcome = edit(
            approval_id=ApprovalRequest.objects.get(call=call).pk,
            user=editor,
            digest=call.digest,
            arguments={"path": "never-edited.txt", "content": "x"},
        )
        return call, outcome.replacement  # 1 of 2 approvals: still pending

    async def scenario() -> ToolCall:
        import anyio

        async with mcp_session(live_stack, fx) as (session, session_id):
            async with anyio.create_task_group() as group:
                group.start_soon(
                    session.call_tool, "write_file", {"path": "never.txt", "content": "x"}
                )
                call, replacement = await anyio.to_thread.run_sync(
                    closing_connections(lambda: edit_pending(session_id() or ""))
                )
                await session.send_notification(
                    types.CancelledNotification(
                        params=types.CancelledNotificationParams(
                            request_id=request_id_of(call), reason="Not any more."
                        )
                    )
                )
                await anyio.sleep(1)
                group.cancel_scope.cancel()
            return replacement

    replacement = run(scenario)
    replacement.refresh_from_db()
    assert replacement.status == Status.CANCELLED
    assert "Not any more." in replacement.content
    assert not (Path(replacement.session.workspace) / "never-edited.txt").exists()


def test_the_permission_prompt_allows_with_the_same_input_or_denies(
    live_stack: LiveStack, live_db: None
) -> None:
    trusted = make_agent(mode="trusted")
    locked = make_agent(mode="locked")
    tool_input = {"command": "ls -la", "description": "List files"}

    async def prompt(fx: AgentFixture) -> dict[str, Any]:
        async with mcp_session(live_stack, fx) as (session, _):
            result = await session.call_tool(
                "approval_prompt",
                {"tool_name": "Bash", "input": tool_input, "tool_use_id": "toolu_01"},
            )
            return dict(json.loads(text_of(result)))

    assert run(lambda: prompt(trusted)) == {"behavior": "allow", "updatedInput": tool_input}
    denied = run(lambda: prompt(locked))
    assert denied["behavior"] == "deny" and "locked mode" in denied["message"]
    call = ToolCall.objects.get(session__agent=trusted.agent, name="client_tool")
    assert call.status == Status.RELEASED and call.executor == "client"
    assert call.arguments == {"tool_name": "Bash", "input": tool_input}
    assert call.tool_use_id == "mcp:2/toolu_01"


def test_unstorable_or_foreign_requests_are_refused_without_a_trace(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    from mcp.shared.exceptions import MCPError

    async def scenario() -> tuple[list[str], str | None]:
        async with mcp_session(live_stack, live_agent) as (session, session_id):
            errors = []
            for name, arguments in (
                ("read_file", {"path": "a\u0000b"}),
                ("x" * 500, {}),
            ):
                try:
                    await session.call_tool(name, arguments)
                except MCPError as exc:
                    errors.append(exc.error.message)
            return errors, session_id()

    errors, session_id = run(scenario)
    assert "NUL character" in errors[0] and "1 to 200 characters" in errors[1]
    assert not ToolCall.objects.filter(session__external_id=session_id).exists()
    other = make_agent()
    headers = {
        "Authorization": f"Bearer {other.token}",
        "Mcp-Session-Id": session_id or "",
        "Accept": "application/json, text/event-stream",
    }
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}
    foreign = httpx.post(live_stack.url + "/mcp/", json=body, headers=headers)
    assert foreign.status_code == 404 and "Initialize again" in foreign.text
    headers.pop("Mcp-Session-Id")
    # Without a session id a request joins its agent's run (docs/mcp.md): it is answered,
    # and no session id comes back (the client keeps none).
    sessionless = httpx.post(live_stack.url + "/mcp/", json=body, headers=headers)
    assert sessionless.status_code == 200 and "mcp-session-id" not in sessionless.headers
    assert "read_file" in sessionless.text
    notification = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    alone = httpx.post(live_stack.url + "/mcp/", json=notification, headers=headers)
    assert alone.status_code == 400 and "no request" in alone.text
    assert httpx.get(live_stack.url + "/mcp/", headers=headers).status_code == 405
    garbage = httpx.post(live_stack.url + "/mcp/", content=b"[" * 100000, headers=headers)
    assert garbage.status_code == 400 and "Traceback" not in garbage.text
    own = {**live_agent.headers, "Mcp-Session-Id": session_id or ""}
    assert httpx.delete(live_stack.url + "/mcp/", headers=own).status_code == 200


def _rpc(client: httpx.Client, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request on /mcp/; its response (JSON, or the last SSE data line)."""
    return _answer(client.post("/mcp/", json=body, headers=headers))


def _answer(response: httpx.Response) -> dict[str, Any]:
    """A /mcp/ response's JSON-RPC answer (JSON, or the last SSE data line)."""
    assert response.status_code == 200, response.text
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        answers = [json.loads(d) for d in data if '"result"' in d or '"error"' in d]
        return dict(answers[-1])
    return dict(response.json())


def test_a_request_id_used_again_with_other_input_gets_no_earlier_decision(
    live_stack: LiveStack, live_db: None
) -> None:
    """Red-team F5: a reused id must not carry an allow (or a result) to other input."""
    trusted = make_agent(mode="trusted")
    headers = {
        "Authorization": f"Bearer {trusted.token}",
        "Accept": "application/json, text/event-stream",
    }
    with httpx.Client(base_url=live_stack.url, timeout=60) as client:
        init = client.post("/mcp/", json=initialize("reuse"), headers=headers)
        assert init.status_code == 200, init.text
        session_headers = {**headers, "Mcp-Session-Id": init.headers["mcp-session-id"]}

        def prompt(command: str) -> dict[str, Any]:
            arguments = {"tool_name": "Bash", "input": {"command": command}, "tool_use_id": "t1"}
            body = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "approval_prompt", "arguments": arguments},
            }
            answer = _rpc(client, session_headers, body)
            return dict(json.loads(answer["result"]["content"][0]["text"]))

        first = prompt("ls")
        again = prompt("ls")
        other = prompt("rm -rf src")

        def call(path: str) -> dict[str, Any]:
            body = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "tools/call",
                "params": {"name": "list_directory", "arguments": {"path": path}},
            }
            return _rpc(client, session_headers, body)

        listed = call(".")
        reused = call("elsewhere")
    assert first == again == {"behavior": "allow", "updatedInput": {"command": "ls"}}
    assert other["behavior"] == "deny" and "already used" in other["message"]
    assert "result" in listed
    assert "already used" in reused["error"]["message"]
    calls = ToolCall.objects.filter(session__agent=trusted.agent)
    assert sorted(c.tool_use_id for c in calls) == ["mcp:7/t1", "mcp:9"]


def test_a_session_is_read_with_its_token_and_its_owners_profile_at_each_request(
    live_stack: LiveStack, live_db: None
) -> None:
    """After initialize, a request's token and session are read together (with the owner's
    profile and the session's grants): a wrong or revoked token with a real session id is
    still 401, an id Harness could not have issued is 404, and a profile changed between
    two requests of one session decides the next call."""
    from dispatcher.agents import revoke_agent

    fx = make_agent(mode="standard")
    update_profile(user=fx.owner, mode="standard", allow=[], ask=[], deny=[], actor="test")
    stranger = make_agent(mode="trusted")
    progress: list[str] = []

    def deny_listing() -> None:
        try:
            update_profile(
                user=fx.owner,
                mode="standard",
                allow=[],
                ask=[],
                deny=["list_directory"],
                actor="test",
            )
        finally:
            connection.close()

    async def scenario() -> tuple[types.CallToolResult, types.CallToolResult, str | None]:
        async with mcp_session(live_stack, fx) as (session, session_id):
            first = await session.call_tool("list_directory", {"path": "."})
            await asyncio.to_thread(deny_listing)
            progress.append("profile changed")
            second = await session.call_tool("list_directory", {"path": "."})
            return first, second, session_id()

    first, second, session_id = run(scenario)
    assert progress == ["profile changed"]
    assert first.is_error is False
    assert second.is_error is True and "denied by policy" in text_of(second)
    calls = ToolCall.objects.filter(session__external_id=session_id).order_by("created_at")
    assert [c.status for c in calls] == [Status.COMPLETED, Status.DENIED]

    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}

    def post(token: str, sid: str) -> httpx.Response:
        headers = {**accept, "Authorization": f"Bearer {token}", "Mcp-Session-Id": sid}
        encoded = {k: v.encode("latin-1") for k, v in headers.items()}
        return httpx.post(live_stack.url + "/mcp/", json=body, headers=encoded)

    assert session_id
    assert post(fx.token, session_id).status_code == 200
    wrong = fx.token[:-1] + ("a" if fx.token[-1] != "a" else "b")
    refused = post(wrong, session_id)
    assert refused.status_code == 401 and "Bearer <token>" in refused.text
    foreign = post(stranger.token, session_id)
    assert foreign.status_code == 404 and "Initialize again" in foreign.text
    for odd in ("x" * 5000, session_id + "\u00e9", session_id + " x"):
        unknown = post(fx.token, odd)
        assert unknown.status_code == 404 and "Traceback" not in unknown.text
    revoke_agent(agent=fx.agent, actor="test")
    assert post(fx.token, session_id).status_code == 401


def test_protocol_versions_are_negotiated_as_the_specification_says(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """The handshake revisions through initialize, 2026-07-28 per request (its version,
    and the client's, in `_meta` and the MCP-Protocol-Version header; server/discover
    names it), a version Harness does not serve refused by name: the SDK decides, Harness
    routes by the header as the SDK's own session manager does."""
    accept = {**live_agent.headers, "Accept": "application/json, text/event-stream"}

    def handshake(version: str) -> tuple[str, str | None]:
        body = initialize("negotiator", version=version, request_id=1)
        answer = httpx.post(live_stack.url + "/mcp/", json=body, headers=accept, timeout=60)
        return _answer(answer)["result"]["protocolVersion"], answer.headers.get("mcp-session-id")

    assert handshake("2025-03-26")[0] == "2025-03-26"
    # Not reachable by a handshake: the newest handshake revision is offered instead.
    version, session_id = handshake("2026-07-28")
    assert version == "2025-11-25" and session_id

    modern = {**accept, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "negotiator", "version": "1"},
    }
    body = {"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": envelope}}
    discover = httpx.post(live_stack.url + "/mcp/", json=body, headers=modern, timeout=60)
    assert discover.status_code == 200, discover.text
    assert "mcp-session-id" not in discover.headers
    assert "2026-07-28" in discover.json()["result"]["supportedVersions"]
    assert discover.json()["result"]["capabilities"]["tools"] is not None

    future = {**modern, "MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "tools/list"}
    body = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/list",
        "params": {"_meta": {**envelope, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}},
    }
    refused = httpx.post(live_stack.url + "/mcp/", json=body, headers=future, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "2026-07-28" in json.dumps(error) and "Traceback" not in refused.text
    assert not ToolCall.objects.filter(session__agent=live_agent.agent).exists()
