"""Issue 30's reader forms (tests/policy/real_forms.py) through the agent API and the three
hook endpoints (Claude Code, Codex, Gemini CLI), with allow rules naming every program they
use: none is allowed by a rule (each asks), and a deny rule on the command a form carries
denies it without asking."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.support.claude_code_hooks import HOOK_URL as CLAUDE_URL
from tests.support.claude_code_hooks import decision, pre_tool_use
from tests.support.coding_agent_hooks import (
    CODEX_URL,
    GEMINI_URL,
    codex_decision,
    codex_tool,
    gemini_decision,
    gemini_tool,
)
from tests.support.factories import AgentFixture

from .conftest import start_session, submit
from .real_forms import FORMS, Form

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]

PROGRAMS = ["git", "echo", "bash", "dash", "python3", "make", "printf", "awk", "cp", "env"]
PROGRAMS += ["rbash", "tee", "ln", "dd"]


def post(url: str, fx: AgentFixture, body: dict[str, Any]) -> Any:
    return Client().post(
        f"{url}?wait=0", data=json.dumps(body), content_type="application/json", headers=fx.headers
    )


def claude(fx: AgentFixture, line: str) -> tuple[str, str, str]:
    session = str(uuid.uuid4())
    action, reason = decision(
        post(CLAUDE_URL, fx, pre_tool_use(session, "Bash", {"command": line}))
    )
    return action, reason, session


def codex(fx: AgentFixture, line: str) -> tuple[str, str, str]:
    session = str(uuid.uuid4())
    action, reason = codex_decision(post(CODEX_URL, fx, codex_tool(session, "Bash", line)))
    return action, reason, session


def gemini(fx: AgentFixture, line: str) -> tuple[str, str, str]:
    session = str(uuid.uuid4())
    body = gemini_tool(session, "run_shell_command", {"command": line})
    action, reason = gemini_decision(post(GEMINI_URL, fx, body))
    return action, reason, session


CLIENTS: dict[str, tuple[str, Callable[[AgentFixture, str], tuple[str, str, str]]]] = {
    "claude-code": ("Bash", claude),
    "codex": ("Bash", codex),
    "gemini": ("run_shell_command", gemini),
}


def with_rules(fx: AgentFixture, tool: str, deny: list[str] | None = None) -> None:
    allow = [f"{tool}({program} *)" for program in PROGRAMS]
    profiles.update_profile(
        user=fx.owner, mode="standard", actor="test", allow=allow, ask=[], deny=deny or []
    )


def the_call(session: str) -> ToolCall:
    return ToolCall.objects.get(session__external_id=session)


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("form", FORMS, ids=[form.name for form in FORMS])
def test_no_form_is_allowed_by_a_rule_at_a_hook(
    form: Form, client: str, agent: AgentFixture
) -> None:
    tool, send = CLIENTS[client]
    with_rules(agent, tool)
    action, reason, session = send(agent, form.line)
    if form.blocked:
        assert action == "deny" and "blocked by the command guard" in reason, reason
        return
    assert action == "deny" and "rule:allow" not in reason, reason  # it asked; wait=0 gave up
    assert ApprovalRequest.objects.filter(call=the_call(session)).exists()


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize(
    "form", [f for f in FORMS if f.seen], ids=[f.name for f in FORMS if f.seen]
)
def test_a_deny_rule_sees_the_command_a_form_carries(
    form: Form, client: str, agent: AgentFixture
) -> None:
    tool, send = CLIENTS[client]
    rule = f"{tool}(touch *)"
    with_rules(agent, tool, deny=[rule])
    action, reason, session = send(agent, form.line)
    assert action == "deny" and f"Rule '{rule}' in" in reason and "deny list" in reason, reason
    assert not ApprovalRequest.objects.filter(call=the_call(session)).exists()


@pytest.mark.parametrize("form", FORMS, ids=[form.name for form in FORMS])
def test_no_form_is_allowed_by_a_rule_through_the_agent_api(
    form: Form, agent: AgentFixture
) -> None:
    seen = form.seen and not form.blocked
    with_rules(agent, "run_command", deny=["run_command(touch *)"] if seen else [])
    session = start_session(agent)
    call = submit(agent, session, "c1", "run_command", {"argv": ["bash", "-c", form.line]})
    if form.blocked:
        assert call.status == Status.DENIED and "blocked by the command guard" in call.reason
    elif seen:
        assert call.status == Status.DENIED and "run_command(touch *)" in call.reason
    else:
        assert call.status == Status.PENDING_APPROVAL, (call.status, call.reason)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_guard_blocks_what_git_settings_and_other_shells_carry(
    client: str, agent: AgentFixture
) -> None:
    tool, send = CLIENTS[client]
    with_rules(agent, tool)
    for line in (
        "git -c core.pager='sudo id' log",
        "git -c alias.x='!sudo id' x",
        "GIT_CONFIG_PARAMETERS=\"'core.fsmonitor'='sudo id'\" git status",
        "env GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0='sudo id' git log",
        "rbash -c 'sudo id'",
        "ksh93 -c 'sudo id'",
        "yash -c 'sudo id'",
        "posh -c 'sudo id'",
    ):
        action, reason, _ = send(agent, line)
        assert action == "deny" and "blocked by the command guard" in reason, (line, reason)
