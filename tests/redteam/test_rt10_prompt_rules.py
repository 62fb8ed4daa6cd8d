"""rt10: an organization's or a person's deny or ask rule for a client's shell tool
(`Bash(curl *)`) holds whichever way Claude Code asks about the command: through its hook
(a call of `Bash`) or through its permission prompt (`approval_prompt`: a call of
`client_tool` naming `Bash`, which no rule naming `Bash` matched: in trusted mode it was
allowed). Its allow rules stay the hook's: the prompt's call still asks in standard mode.

Live: daphne and the official MCP client."""

from __future__ import annotations

import pytest

from dispatcher.models import Status, ToolCall
from dispatcher.policy.profiles import update_profile
from tests.redteam.test_rt5_permission_prompt import _prompt
from tests.support.factories import make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def test_a_deny_rule_for_bash_holds_through_the_permission_prompt(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    update_profile(
        user=fx.owner, mode="trusted", allow=[], ask=[], deny=["Bash(curl *)"], actor="test"
    )
    answer = _prompt(live_stack, fx, "Bash", {"command": "ls && curl -s https://example.com/x"})
    call = ToolCall.objects.get(session__agent=fx.agent, name="client_tool")
    assert answer["behavior"] == "deny", (answer, call.decided_by)
    assert call.status == Status.DENIED
    assert call.decided_by == "rule:deny:Bash(curl *)"


def test_an_ask_rule_for_bash_asks_through_the_permission_prompt(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    update_profile(
        user=fx.owner, mode="trusted", allow=[], ask=["Bash(make deploy *)"], deny=[], actor="t"
    )
    from dispatcher.agents import start_session
    from tests.support.factories import submit_one

    session = start_session(agent=fx.agent, title="rt10")
    arguments = {"tool_name": "Bash", "input": {"command": "make deploy ENV=prod"}}
    call = submit_one(session, "client_tool", arguments)
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by)
    assert call.provenance["rule"] == "Bash(make deploy *)"
    # An ordinary command is still allowed in trusted mode, and an allow rule for Bash
    # does not let the prompt's call skip its ask in standard mode.
    other = submit_one(session, "client_tool", {**arguments, "input": {"command": "ls"}}, "w2")
    assert other.status == Status.RELEASED
    update_profile(
        user=fx.owner, mode="standard", allow=["Bash(ls)"], ask=[], deny=[], actor="test"
    )
    standard = start_session(agent=fx.agent, title="rt10 standard")
    asked = submit_one(standard, "client_tool", {**arguments, "input": {"command": "ls"}}, "w3")
    assert asked.status == Status.PENDING_APPROVAL, (asked.status, asked.decided_by)
