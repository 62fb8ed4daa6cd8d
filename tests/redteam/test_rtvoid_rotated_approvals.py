"""Red team (rtvoid): a call sent with an agent token that was rotated or voided while the
call waited for a reviewer must not run once a reviewer approves it.

The merge of wt-voidq made the worker deny a queued call whose token is no longer the
agent's (agents.token_refusal), and left calls waiting for a reviewer waiting across a
rotation: "denied by the worker if approved". Two ways past that:

- a call its client runs itself (Claude Code's PreToolUse hook, decide-only): no worker
  runs it. Approving it released it straight to the client, whose hook request had been
  verified with the old token before the rotation and was still waiting: the client got
  "allow" and ran the tool, although the token that sent it had been replaced because it
  may have leaked;
- "approve and allow for the rest of this session": the approval of a worker-run call sent
  with the old token granted the session a rule, although the call itself was then denied
  by the worker (a call that does not run grants nothing).

Approving such a call now denies it at the decision (guard "token"), as the worker would.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.models import Status, ToolCall
from dispatcher.policy.models import SessionGrant
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack

ROTATED = "The agent token this call was sent with was rotated"


def wait_until(check: Any, what: str, seconds: float = 20) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def hook_approved(
    url: str, token: str, agent: Any, reviewer: Any, command: str, meanwhile: Any = None
) -> tuple[dict[str, Any], ToolCall]:
    """A PreToolUse hook request for `command` sent with `token`, waiting for a reviewer;
    `meanwhile()` runs while it waits, then the reviewer approves it. The hook's answer
    and the call."""
    body = pre_tool_use(str(uuid.uuid4()), "Bash", {"command": command})
    answer: dict[str, Any] = {}

    def hook() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        answer["response"] = httpx.post(
            url + HOOK_URL + "?wait=30", json=body, headers=headers, timeout=60
        )

    waiting = threading.Thread(target=hook)
    waiting.start()
    call = wait_until(
        lambda: ToolCall.objects.filter(
            session__agent=agent, status=Status.PENDING_APPROVAL
        ).first(),
        "the hook's call to wait for a reviewer",
    )
    if meanwhile is not None:
        meanwhile()
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )
    waiting.join(60)
    call.refresh_from_db()
    return answer["response"].json()["hookSpecificOutput"], call


@pytest.mark.live
def test_a_hook_call_sent_with_a_rotated_token_is_not_released_to_its_client(
    live_stack: LiveStack, live_db: None
) -> None:
    owner = make_user(unique("olga"))  # standard mode: a command asks a reviewer
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t")
    rotated: list[str] = []

    def rotate() -> None:  # an admin rotates the token (it may have leaked)
        rotated.append(agents.rotate_token(agent=agent, actor="user:root"))

    output, call = hook_approved(live_stack.url, token, agent, reviewer, "rm -rf build", rotate)
    assert output["permissionDecision"] == "deny", output  # before: "allow"
    assert ROTATED in output["permissionDecisionReason"]
    assert call.status == Status.DENIED and call.started_at is None
    denied = AuditEvent.objects.get(kind="call.denied", subject=f"call:{call.pk}")
    assert denied.payload["by"] == "guard:token", denied.payload
    # the new token's calls are approved and released as ever (no false denial)
    output, call = hook_approved(live_stack.url, rotated[0], agent, reviewer, "rm -rf dist")
    assert output["permissionDecision"] == "allow", output
    assert call.status == Status.RELEASED


@pytest.mark.django_db
def test_approving_a_rotated_tokens_call_for_the_session_grants_nothing() -> None:
    owner = make_user(unique("olga"))
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="t")
    session = agents.start_session(agent=agent)
    call = submit_one(session, "write_file", {"path": "a.txt", "content": "x"})
    assert call.status == Status.PENDING_APPROVAL
    agents.rotate_token(agent=agent, actor="user:root")
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        digest=call.digest,
        allow_session=True,
    )
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.DENIED and ROTATED in call.content
    assert not SessionGrant.objects.filter(session=session).exists()  # before: one granted
