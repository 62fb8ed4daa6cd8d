"""Claude Code's permission prompt (`approval_prompt` on the MCP gateway) asks about its
own tools as calls of `client_tool`, and is not told the project directory, as the hook
is (its `cwd`). The paths of such a call were confined to nothing: in trusted mode, an
`Edit` of /etc/hosts asked about through the prompt was allowed, where the hook denies
it. They are now confined to the agent's configured workspace; an agent with none has
them asked of a person. Deny rules still deny.

Live: daphne and the official MCP client, as Claude Code calls the prompt."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from audit import kinds
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from dispatcher.policy.profiles import update_profile
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import mcp_session, review, run, text_of
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def _prompt(stack: LiveStack, fx: AgentFixture, tool_name: str, tool_input: Any) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        async with mcp_session(stack, fx) as (session, _):
            result = await session.call_tool(
                "approval_prompt",
                {"tool_name": tool_name, "input": tool_input, "tool_use_id": "toolu_paths"},
            )
            return dict(json.loads(text_of(result)))

    return run(scenario)


def _edit(path: str) -> dict[str, str]:
    return {"file_path": path, "old_string": "a", "new_string": "b"}


def test_an_edit_outside_the_agents_workspace_is_denied_and_inside_allowed(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fx = make_agent(mode="trusted", workspace=str(project))

    outside = _prompt(live_stack, fx, "Edit", _edit("/etc/hosts"))
    assert outside["behavior"] == "deny", outside
    assert "/etc/hosts" in outside["message"] and "outside the project" in outside["message"]
    call = ToolCall.objects.get(session__agent=fx.agent, name="client_tool")
    assert call.status == Status.DENIED and call.decided_by == "guard:workspace_confinement"

    escape = _prompt(live_stack, fx, "Read", {"file_path": f"{project}/../../etc/passwd"})
    assert escape["behavior"] == "deny", escape

    inside = _edit(str(project / "src" / "app.py"))
    assert _prompt(live_stack, fx, "Edit", inside) == {"behavior": "allow", "updatedInput": inside}
    relative = {"file_path": "notes.txt", "content": "x"}
    assert _prompt(live_stack, fx, "Write", relative) == {
        "behavior": "allow",
        "updatedInput": relative,
    }
    # Not a path-bearing tool: as before.
    shell = {"command": "ls -la"}
    assert _prompt(live_stack, fx, "Bash", shell)["behavior"] == "allow"


def test_a_deny_rule_still_denies_an_edit_inside_the_workspace(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fx = make_agent(mode="trusted", workspace=str(project))
    update_profile(
        user=fx.owner, mode="trusted", allow=[], ask=[], deny=["Edit(secrets/**)"], actor="t"
    )
    answer = _prompt(live_stack, fx, "Edit", _edit(str(project / "secrets" / "key.txt")))
    assert answer["behavior"] == "deny", answer
    call = ToolCall.objects.get(session__agent=fx.agent, name="client_tool")
    assert call.decided_by == "rule:deny:Edit(secrets/**)"


def test_without_a_workspace_an_edit_is_asked_of_a_person_not_allowed(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")  # no configured workspace
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    seen: list[ToolCall] = []
    answered = threading.Event()

    def deny_when_asked() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not answered.is_set():
            call = ToolCall.objects.filter(
                session__agent=fx.agent, name="client_tool", status=Status.PENDING_APPROVAL
            ).first()
            if call is not None:
                seen.append(call)
                review(call, reviewer, approve=False, feedback="Not the hosts file.")
                return
            time.sleep(0.1)

    person = threading.Thread(target=closing_connections(deny_when_asked), daemon=True)
    person.start()
    answer = _prompt(live_stack, fx, "Edit", _edit("/etc/hosts"))
    answered.set()
    person.join(5)
    assert seen, "the prompt's Edit was never asked of a person"
    assert answer["behavior"] == "deny" and "Not the hosts file." in answer["message"]
    asked = AuditEvent.objects.get(
        subject=f"call:{seen[0].pk}", kind=kinds.CALL_APPROVAL_REQUESTED
    ).payload
    assert asked["by"] == "policy:unconfined-paths", asked
    assert "no configured workspace" in asked["reason"]

    # A deny rule still denies, without asking anyone.
    update_profile(user=fx.owner, mode="trusted", allow=[], ask=[], deny=["Edit"], actor="t")
    denied = _prompt(live_stack, fx, "Edit", _edit("/etc/hosts"))
    assert denied["behavior"] == "deny"
    last = ToolCall.objects.filter(session__agent=fx.agent).order_by("-created_at").first()
    assert last is not None and last.decided_by == "rule:deny:Edit"
