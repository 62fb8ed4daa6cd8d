"""The simulator decides like admission (rule, mode or guard named); the backtest lists changes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from dispatcher import simulation
from dispatcher.models import ToolCall
from dispatcher.policy import profiles
from tests.support.factories import AgentFixture

from .conftest import start_session, submit

pytestmark = pytest.mark.django_db


def _set(agent: AgentFixture, admin: User, **lists: list[str]) -> None:
    profiles.update_profile(
        user=agent.owner,
        mode=lists.pop("mode", ["standard"])[0],
        allow=lists.get("allow", []),
        ask=lists.get("ask", []),
        deny=lists.get("deny", []),
        actor=admin,
    )


def test_simulator_names_the_deciding_rule_mode_and_guard(agent: AgentFixture, admin: User) -> None:
    _set(agent, admin, allow=["run_command(npm test *)"], deny=["read_file(**/.env)"])
    owner = agent.owner

    by_rule = simulation.simulate(
        user=owner, tool="run_command", arguments={"argv": ["npm", "test", "--watch"]}
    )
    assert (by_rule.action, by_rule.rule) == ("allow", "run_command(npm test *)")
    assert by_rule.by == "rule:allow:run_command(npm test *)"

    denied = simulation.simulate(user=owner, tool="read_file", arguments={"path": "a/.env"})
    assert (denied.action, denied.by) == ("deny", "rule:deny:read_file(**/.env)")

    by_mode = simulation.simulate(
        user=owner, tool="write_file", arguments={"path": "x.txt", "content": ""}
    )
    assert (by_mode.action, by_mode.by, by_mode.stage) == ("ask", "mode:standard", "pre_execute")

    guarded = simulation.simulate(
        user=owner, tool="run_command", arguments={"argv": ["sudo", "npm", "test"]}
    )
    assert guarded.action == "deny" and guarded.stage == "guards"
    assert guarded.by == "guard:command_blocklist"

    outside = simulation.simulate(user=owner, tool="read_file", arguments={"path": "/etc/passwd"})
    assert outside.by == "guard:workspace_confinement"


def test_simulator_rejects_like_admission(agent: AgentFixture) -> None:
    unknown = simulation.simulate(user=agent.owner, tool="readFile", arguments={})
    assert unknown.action == "reject" and unknown.stage == "resolve"
    assert "read_file" in unknown.reason
    invalid = simulation.simulate(user=agent.owner, tool="read_file", arguments={"path": 3})
    assert invalid.action == "reject" and invalid.stage == "validate"


def test_simulator_tries_proposed_rules_and_stores_nothing(agent: AgentFixture) -> None:
    proposed = profiles.proposed_profile(
        agent.owner, "standard", allow=["write_file(docs/**)"], ask=[], deny=[]
    )
    calls, events = ToolCall.objects.count(), AuditEvent.objects.count()
    result = simulation.simulate(
        user=agent.owner,
        tool="write_file",
        arguments={"path": "docs/a.md", "content": "x"},
        profile=proposed,
    )
    assert result.action == "allow" and result.rule == "write_file(docs/**)"
    assert result.profile_version == proposed.version
    assert (ToolCall.objects.count(), AuditEvent.objects.count()) == (calls, events)


def test_past_call_is_simulated_in_its_own_session(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "src/a.py", "content": "x"})
    assert call.status == "pending_approval"
    _set(agent, admin, allow=["write_file(src/*.py)"])
    again = simulation.simulate_call(call)
    assert again.action == "allow" and again.rule == "write_file(src/*.py)"


def test_backtest_lists_only_calls_whose_decision_would_change(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    write = submit(agent, session, "w1", "write_file", {"path": "src/a.py", "content": "x"})
    read = submit(agent, session, "r1", "read_file", {"path": "README.md"})
    submit(agent, session, "x1", "no_such_tool", {})  # rejected: never listed
    command = submit(agent, session, "c1", "run_command", {"argv": ["git", "status"]})
    assert (write.status, read.status, command.status) == (
        "pending_approval",
        "queued",
        "pending_approval",
    )
    proposed = profiles.proposed_profile(
        agent.owner,
        "standard",
        allow=["write_file(src/**)"],
        ask=[],
        deny=["read_file(README.md)"],
    )
    result = simulation.backtest(user=agent.owner, proposed=proposed)
    assert result.checked == 3
    changed = {c.call.pk: (c.before.action, c.after.action) for c in result.changes}
    assert changed == {write.pk: ("ask", "allow"), read.pk: ("allow", "deny")}
    after = {c.call.pk: c.after.by for c in result.changes}
    assert after[read.pk] == "rule:deny:read_file(README.md)"
