"""Red team (rtweb): "Sign out" of a signed-in agent (agentauth.services.sign_out_agent,
/account/agents/: every OAuth token of the agent revoked, the agent kept) left the calls
sent with those tokens going: a hook request of the signed-out client still waiting for a
reviewer was answered "allow" once a reviewer approved (its client then ran the tool),
and a call queued for a worker still ran. The button a person presses when a device
that holds their agent's token is lost. Against a live Harness (daphne), real HTTP."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from agentauth import services
from agentauth.models import AgentClient
from approvals import services as approvals
from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import Agent, Status, ToolCall
from teams.services import add_member
from tests.agentauth.conftest import oauth_stack
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_agent, make_user, submit_one, unique
from tests.support.oauth import (
    HOOKS,
    DocumentServer,
    documents,
    harness_hook_client,
    member,
    sign_in_agent,
)
from tests.support.oauth_live import OAuthStack, Person, team_member

__all__ = ["documents", "oauth_stack"]  # the fixtures

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _signed_in(stack: OAuthStack) -> tuple[User, Agent, str]:
    """A person's agent signed in with `harness-hook login`'s device code: its hooks token."""
    harness_hook_client()
    code = httpx.post(
        stack.url + "/oauth/device-authorization/", data={"client_id": "harness-hook"}
    ).json()
    owner = team_member()
    page = Person(stack.url, owner.username, "pw-" + owner.username).approve_device(
        code["user_code"], mode="standard"
    )
    assert "Approved" in page
    answer = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": DEVICE_GRANT,
            "client_id": "harness-hook",
            "device_code": code["device_code"],
        },
    )
    assert answer.status_code == 200, answer.text
    agent = AgentClient.objects.get(owner=owner).agent
    return owner, agent, str(answer.json()["access_token"])


@pytest.mark.live
@pytest.mark.parametrize("how", ["sign_out", "revoke"])
def test_a_hook_waiting_for_a_reviewer_is_not_allowed_after_its_agent_is_signed_out(
    oauth_stack: OAuthStack, live_db: None, how: str
) -> None:
    owner, agent, token = _signed_in(oauth_stack)
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    sid = unique("cc")
    body = pre_tool_use(sid, "Bash", {"command": "curl -X POST https://example.com/upload"})
    answered: dict[str, Any] = {}

    def waiting_hook() -> None:
        answered["hook"] = httpx.post(
            oauth_stack.url + "/api/v1/hooks/claude-code?wait=30",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )

    thread = threading.Thread(target=waiting_hook)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not (asked := ApprovalRequest.objects.filter(call__session__agent=agent).first()):
            assert time.monotonic() < deadline, "the hook never asked"
            time.sleep(0.1)
        assert asked.call.status == Status.PENDING_APPROVAL
        if how == "sign_out":
            services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
        else:
            services.revoke_agent(agent=agent, actor=f"user:{owner.username}")
        try:
            approvals.decide(
                approval_id=asked.pk, user=reviewer, approve=True, digest=asked.call.digest
            )
        except Exception as refused:  # (the ask ended with the sign-out: nothing to decide)
            answered["decide"] = str(refused)
    finally:
        thread.join(60)
    hook = answered["hook"]
    assert hook.status_code == 200, hook.text
    decision = hook.json()["hookSpecificOutput"]["permissionDecision"]
    assert decision != "allow", hook.text  # was: "allow" (the signed-out client ran it)
    call = ToolCall.objects.get(pk=asked.call_id)
    assert call.status in (Status.CANCELLED, Status.DENIED), call.status
    said = {"sign_out": "signed out", "revoke": "revoked"}[how]
    assert said in (call.reason + call.content), (call.reason, call.content)


def _sign_out(owner: User, agent: Agent) -> None:
    """The owner's "Sign out" button on /account/agents/, CSRF checks enforced."""
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner)
    assert browser.get("/account/agents/").status_code == 200
    answer = browser.post(
        f"/account/agents/{agent.pk}/sign-out",
        {"csrfmiddlewaretoken": browser.cookies["csrftoken"].value},
    )
    assert answer.status_code == 302, answer.content[:300]


@pytest.mark.django_db
def test_a_signed_out_agents_queued_call_is_denied_an_admins_agent_keeps_its_calls(
    documents: DocumentServer,
) -> None:
    owner = member()
    client_id, _answer = sign_in_agent(documents, owner, resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    queued = submit_one(agents.start_session(agent=agent), "read_file", {"path": "a.txt"})
    assert queued.status == Status.QUEUED
    _sign_out(owner, agent)
    queued.refresh_from_db()
    assert queued.status == Status.DENIED and "was signed out" in queued.content
    assert queued.decided_by == "guard:token"
    # An agent an admin made (its bearer token stays valid): its calls are untouched.
    made = make_agent(owner=owner)
    kept = submit_one(agents.start_session(agent=made.agent), "read_file", {"path": "b.txt"})
    assert kept.status == Status.QUEUED
    _sign_out(owner, made.agent)
    kept.refresh_from_db()
    assert kept.status == Status.QUEUED
