"""dispatcher.client against a live daphne and Celery worker: three dialects, waits, errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from approvals.models import ApprovalRequest
from approvals.services import decide
from dispatcher.gateways.client import HarnessClient, HarnessError
from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


@pytest.fixture
def harness(live_stack: LiveStack, live_agent: AgentFixture) -> HarnessClient:
    client = HarnessClient(live_stack.url, live_agent.token)
    client.start_session(title="client test")
    return client


def workspace(harness: HarnessClient) -> Path:
    return Path(harness.session()["workspace"])


def test_start_session_and_tools_in_every_format(harness: HarnessClient) -> None:
    session = harness.session()
    assert session["id"] == harness.session_id and session["mode"] == "standard"
    native = harness.tools("native")
    openai = harness.tools("openai")
    anthropic = harness.tools("anthropic")
    assert "read_file" in {t["name"] for t in native}
    assert {t["function"]["name"] for t in openai} == {t["name"] for t in native}
    assert all("input_schema" in t for t in anthropic)


def test_openai_round_trip_gives_tool_messages(harness: HarnessClient) -> None:
    (workspace(harness) / "hello.txt").write_text("hello from the workspace\n")
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,  # SDK fields the contract does not name are ignored
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": "hello.txt"})},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "list_directory", "arguments": '{"path": "."}'},
            },
        ],
    }
    result = harness.submit(message, wait=30)
    assert result.done and not result.pending
    assert [r["tool_call_id"] for r in result.results] == ["call_a", "call_b"]
    assert all(r["role"] == "tool" for r in result.results)
    assert "hello from the workspace" in result.results[0]["content"]
    assert "hello.txt" in result.results[1]["content"]


def test_anthropic_round_trip_gives_one_user_message(harness: HarnessClient) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "list_directory", "input": {"path": "."}},
            {"type": "tool_use", "id": "toolu_2", "name": "readFile", "input": {"path": "x"}},
        ],
    }
    result = harness.submit(message, wait=30)
    assert result.done
    [reply] = result.results
    assert reply["role"] == "user"
    blocks = reply["content"]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_1", "toolu_2"]
    assert all(b["type"] == "tool_result" for b in blocks)
    assert blocks[0]["is_error"] is False
    assert blocks[1]["is_error"] is True and "read_file" in blocks[1]["content"]


def test_native_round_trip_and_get_call(harness: HarnessClient) -> None:
    result = harness.submit(
        {"calls": [{"id": "n1", "name": "read_file", "arguments": {"path": "../../etc/passwd"}}]},
        wait=5,
    )
    assert result.done
    assert result.results == [{"id": "n1", "content": result.calls[0]["content"], "is_error": True}]
    call = harness.get_call(result.calls[0]["id"], wait=1)
    assert call["status"] == "denied" and call["decided_by"] == "guard:workspace_confinement"


def _approve_soon(call_id: str, reviewer: User, delay: float) -> threading.Thread:
    def approve() -> None:
        time.sleep(delay)
        try:
            row = ToolCall.objects.get(pk=call_id)
            approval = ApprovalRequest.objects.get(call_id=row.pk)
            decide(approval_id=approval.pk, user=reviewer, approve=True, digest=row.digest)
        finally:
            connection.close()  # this thread's own connection, or the test DB cannot be dropped

    thread = threading.Thread(target=approve)
    thread.start()
    return thread


def test_wait_for_returns_results_once_a_reviewer_approves(harness: HarnessClient) -> None:
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    message = {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_w",
                "name": "write_file",
                "input": {"path": "out.txt", "content": "approved\n"},
            }
        ],
    }
    first = harness.submit(message, wait=0)
    assert not first.done and first.results == []
    [pending] = first.pending
    assert pending["status"] == "pending_approval"

    thread = _approve_soon(pending["id"], reviewer, delay=1.0)
    started = time.monotonic()
    result = harness.wait_for(message, timeout=30)
    thread.join()
    assert result.done, result.calls
    assert time.monotonic() - started < 20
    assert result.calls[0]["id"] == pending["id"]  # resubmitting created nothing new
    assert result.calls[0]["decided_by"] == f"user:{reviewer.username}"
    [reply] = result.results
    assert reply["content"][0]["tool_use_id"] == "toolu_w"
    assert reply["content"][0]["is_error"] is False
    assert (workspace(harness) / "out.txt").read_text() == "approved\n"
    assert ToolCall.objects.filter(session_id=harness.session_id).count() == 1


def test_wait_for_gives_up_at_its_timeout(harness: HarnessClient) -> None:
    message = {
        "calls": [{"id": "t1", "name": "write_file", "arguments": {"path": "a", "content": ""}}]
    }
    started = time.monotonic()
    result = harness.wait_for(message, timeout=1.5)
    assert not result.done and result.pending[0]["status"] == "pending_approval"
    assert 1.0 < time.monotonic() - started < 10
    cancelled = harness.cancel(result.calls[0]["id"])
    assert cancelled["status"] == "cancelled"
    with pytest.raises(HarnessError) as exc:
        harness.cancel(result.calls[0]["id"])
    assert exc.value.status == 409 and exc.value.code == "not_pending"


def test_bad_token_raises_harness_error(live_stack: LiveStack, live_db: None) -> None:
    client = HarnessClient(live_stack.url, "hns_nope_not-a-token")
    with pytest.raises(HarnessError) as exc:
        client.start_session()
    assert exc.value.status == 401 and exc.value.code == "invalid_token"
    assert "Bearer" in exc.value.message


@pytest.mark.parametrize(
    "body, code",
    [
        ({"role": "assistant", "content": "no tool calls here"}, "unrecognized_body"),
        ({"something": "else"}, "unrecognized_body"),
        (["not", "an", "object"], "unrecognized_body"),
    ],
)
def test_malformed_submission_raises_harness_error(
    harness: HarnessClient, body: Any, code: str
) -> None:
    with pytest.raises(HarnessError) as exc:
        harness.submit(body, wait=0)
    assert exc.value.status == 422 and exc.value.code == code
    assert exc.value.message


def test_unknown_session_and_call_raise_harness_error(
    harness: HarnessClient, live_db: None
) -> None:
    other = HarnessClient(harness.base_url, make_agent().token)
    with pytest.raises(HarnessError) as exc:
        other.submit({"calls": []}, session_id=harness.session_id)
    assert exc.value.status == 404 and exc.value.code == "unknown_session"
    with pytest.raises(HarnessError) as exc:
        other.get_call("00000000-0000-0000-0000-000000000000")
    assert exc.value.status == 404 and exc.value.code == "unknown_call"
    with pytest.raises(HarnessError) as exc:
        harness.tools("yaml")
    assert exc.value.status == 400 and exc.value.code == "unknown_format"


def test_submit_without_a_session_is_a_usage_error(live_stack: LiveStack) -> None:
    with pytest.raises(ValueError, match="start_session"):
        HarnessClient(live_stack.url, "t").submit({"calls": []})
