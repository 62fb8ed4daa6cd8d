"""rtlast's lead: Claude Code 2.1's `Monitor` runs a shell command (`command`) on the
developer's machine and reports what it prints. Harness did not list it, so its command
was never read: the command guard did not deny `rm -rf ~` in it, and a deny rule for Bash
did not hold. It is now read as Bash's command is, and Bash's rules are its rules."""

from __future__ import annotations

import uuid

import pytest

from dispatcher.policy import profiles
from tests.support.claude_code_hooks import decision, hook_input, pre_tool_use, send
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db


def monitor(agent: AgentFixture, session_id: str, tool_input: dict[str, object]) -> tuple[str, str]:
    return decision(send(agent, pre_tool_use(session_id, "Monitor", tool_input)))


def test_monitors_command_is_read_by_the_command_guard_and_bashs_rules(
    agent: AgentFixture,
) -> None:
    session_id = str(uuid.uuid4())
    profiles.update_profile(
        user=agent.owner, mode="trusted", actor="test", allow=[], ask=[], deny=["Bash(curl *)"]
    )
    send(agent, hook_input("SessionStart", session_id, source="startup"))
    watch = {"description": "watch", "timeout_ms": 60000}
    action, reason = monitor(agent, session_id, {**watch, "command": "rm -rf ~"})
    assert action == "deny", reason  # before: allow (trusted mode, the command unread)
    action, reason = monitor(agent, session_id, {**watch, "command": "curl -s https://x.test"})
    assert action == "deny", reason  # Bash's deny rule holds for it
    action, _ = monitor(agent, session_id, {**watch, "command": "tail -f build.log"})
    assert action == "allow"  # trusted mode still allows a plain watch
