"""Red-team rtagent: an OAuth agent's profile, narrowed by its person, holds in the
sessions the agent already has.

The consent page (and the device page) ask which profile the agent runs under: the
person's own mode or a narrower one. Approving the same client again for the same team
reuses the agent and sets its new mode (agentauth.services.authorize_agent). The mode was
applied only to sessions started after: a client session (a Claude Code session id, an
MCP session or run key) started before went on under the wider mode, with the old token
and with the new one, while /account/agents/ showed the narrower one."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agentauth.models import AgentClient
from dispatcher.models import Status, ToolCall
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    REDIRECT,
    DocumentServer,
    authorize_params,
    code_from,
    consent,
    documents,
    member,
    pkce,
    signed_in,
    token,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _signed_in_token(documents: DocumentServer, client_id: str, person: Any, mode: str) -> str:
    """`person` approves `client_id` with `mode`; the access token for the hooks API."""
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge, resource=HOOKS)
    query = code_from(consent(signed_in(person), params, mode=mode))
    answer = token(client_id, query["code"][0], verifier, resource=HOOKS)
    assert answer.status_code == 200, answer.content
    return str(answer.json()["access_token"])


def _write(access: str, session_id: str, tool_use_id: str) -> Any:
    return Client().post(
        "/api/v1/hooks/claude-code?wait=0",
        {
            "session_id": session_id,
            "hook_event_name": "PreToolUse",
            "cwd": "/work/project",
            "tool_name": "Write",
            "tool_input": {"file_path": "/work/project/notes.txt", "content": "hello\n"},
            "tool_use_id": tool_use_id,
        },
        content_type="application/json",
        headers={"Authorization": f"Bearer {access}"},
    )


@pytest.mark.parametrize("which", ["old token", "new token"])
def test_a_mode_narrowed_by_consenting_again_holds_in_the_agents_open_sessions(
    documents: DocumentServer, which: str
) -> None:
    person = member()
    client_id = documents.client(f"/{unique('client')}.json", [REDIRECT], name="Claude Test")
    first = _signed_in_token(documents, client_id, person, "standard")
    session_id = unique("cc-session")
    asked = _write(first, session_id, "t-1")
    assert asked.status_code == 200, asked.content
    call = ToolCall.objects.get(session__external_id=session_id, tool_use_id="t-1")
    assert call.session.mode == "standard"
    assert call.status != Status.DENIED or "read_only" not in call.content  # asked a person

    # The person narrows the agent to read_only: consenting again to the same client.
    second = _signed_in_token(documents, client_id, person, "read_only")
    link = AgentClient.objects.get(owner=person)
    assert link.mode == "read_only"
    assert link.agent_id == call.session.agent_id  # the same agent, reused

    access = first if which == "old token" else second
    answer = _write(access, session_id, "t-2")
    assert answer.status_code == 200, answer.content
    later = ToolCall.objects.get(session__external_id=session_id, tool_use_id="t-2")
    # The write is refused by the mode the person chose, never asked of a reviewer.
    assert later.status == Status.DENIED, (later.status, later.content)
    assert "read_only mode" in later.content, later.content
    decision = answer.json()["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny", decision
    assert "read_only mode" in decision["permissionDecisionReason"], decision
