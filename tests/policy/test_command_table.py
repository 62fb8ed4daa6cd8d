"""Issue 11's command table: allow rules read commands by what is allowed, not by what is
forbidden (data in tests/policy/command_table.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from dispatcher.policy.context import CallContext, Profile
from dispatcher.policy.guards import command_blocklist
from dispatcher.policy.reading import read_command
from dispatcher.policy.rules import evaluate
from dispatcher.policy.waterfall import permission_mode, run_guards, run_waterfall, user_rules
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

from .command_table import (
    ALLOW,
    ASK,
    DENY,
    ISSUE_ALLOW_BYPASSES,
    ISSUE_BLOCKED,
    ISSUE_DENY_ORDERS,
    ISSUE_UNREADABLE_IN_TRUSTED,
    UNREADABLE_PROGRAMS,
    dangerous_shapes,
    deny_variants,
    ordinary_commands,
)

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

ORDINARY = ordinary_commands()
SHAPES = dangerous_shapes()
DENIED = deny_variants()


def make_call(argv: list[str], mode: str, **rules: Any) -> CallContext:
    profile = Profile(
        mode=mode,
        allow=tuple(rules.get("allow", ())),
        ask=tuple(rules.get("ask", ())),
        deny=tuple(rules.get("deny", ())),
    )
    return CallContext(
        call_id="t",
        session_id="s",
        tool=RUN_COMMAND,
        name="run_command",
        arguments={"argv": argv},
        workspace=Path("/nonexistent-ws"),
        mode=mode,
        username="u",
        agent_name="a",
        profile=profile,
    )


def outcome(call: CallContext) -> tuple[str, str]:
    """(allow / ask / deny, reason) as admission decides: the waterfall, then guards."""
    decision = run_waterfall(call, [user_rules, permission_mode])
    denials = run_guards(call)
    if decision.action == "allow" and denials:
        return "deny", denials[0][1]
    return decision.action, decision.reason


def verdict(argv: list[str]) -> Any:
    call = make_call(argv, "standard", allow=ALLOW, ask=ASK, deny=DENY)
    return evaluate(call, allow=ALLOW, ask=ASK, deny=DENY)


def ids(cases: list[list[str]]) -> list[str]:
    return [repr(argv)[:90] for argv in cases]


def test_the_table_holds_more_than_400_commands() -> None:
    everything = [
        *ORDINARY,
        *SHAPES,
        *UNREADABLE_PROGRAMS,
        *DENIED,
        *ISSUE_ALLOW_BYPASSES,
        *ISSUE_BLOCKED,
        *ISSUE_UNREADABLE_IN_TRUSTED,
    ]
    assert len({tuple(argv) for argv in everything}) >= 400, len(everything)


@pytest.mark.parametrize("argv", ORDINARY, ids=ids(ORDINARY))
def test_ordinary_commands_are_still_allowed(argv: list[str]) -> None:
    reading = read_command(tuple(argv))
    assert reading.unreadable is None, reading.unreadable
    assert verdict(argv).action == "allow"
    call = make_call(argv, "standard", allow=ALLOW, ask=ASK, deny=DENY)
    assert outcome(call)[0] == "allow"


@pytest.mark.parametrize("argv", SHAPES, ids=ids(SHAPES))
def test_dangerous_shapes_are_never_allowed_by_a_rule(argv: list[str], settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    found = verdict(argv)
    assert found.action != "allow", found
    call = make_call(argv, "standard", allow=ALLOW, ask=ASK, deny=DENY)
    assert outcome(call)[0] in ("ask", "deny")
    if "; sudo id" not in argv[-1] and "; touch" not in argv[-1]:
        assert read_command(tuple(argv)).unreadable is not None
        trusted = make_call(argv, "trusted", allow=ALLOW, ask=ASK, deny=DENY)
        assert outcome(trusted)[0] in ("ask", "deny")


@pytest.mark.parametrize(
    "argv",
    UNREADABLE_PROGRAMS + ISSUE_ALLOW_BYPASSES,
    ids=ids(UNREADABLE_PROGRAMS + ISSUE_ALLOW_BYPASSES),
)
def test_code_loading_forms_are_unreadable(argv: list[str], settings: Any) -> None:
    reading = read_command(tuple(argv))
    assert reading.unreadable is not None, reading.commands
    found = verdict(argv)
    assert found.action != "allow", found
    assert (
        evaluate(make_call(argv, "standard"), allow=["run_command"], ask=[], deny=[]).action is None
    )
    settings.HARNESS_SANDBOX = "off"
    trusted = make_call(argv, "trusted")
    assert outcome(trusted)[0] in ("ask", "deny")
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", False
    action, reason = outcome(trusted)
    assert action == "deny" or (action == "allow" and "runs in the sandbox" in reason)


@pytest.mark.parametrize("argv", DENIED, ids=ids(DENIED))
def test_deny_rules_match_options_in_any_order(argv: list[str]) -> None:
    assert verdict(argv).action == "deny"


@pytest.mark.parametrize("argv", ISSUE_DENY_ORDERS, ids=ids(ISSUE_DENY_ORDERS))
def test_interleaved_options_do_not_beat_deny_rules(argv: list[str]) -> None:
    deny = ["run_command(git reset *)", "run_command(rm -rf *)"]
    call = make_call(argv, "trusted", deny=deny)
    found = evaluate(call, allow=["run_command"], ask=[], deny=deny)
    assert found.action == "deny" and found.rule in deny
    assert outcome(call)[0] == "deny"


@pytest.mark.parametrize("argv", ISSUE_BLOCKED, ids=ids(ISSUE_BLOCKED))
def test_blocklist_holes_are_closed_in_trusted_mode(argv: list[str], settings: Any) -> None:
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", False
    call = make_call(argv, "trusted")
    denial = command_blocklist(call)
    assert denial is not None and "blocked by the command guard" in denial
    assert outcome(call) == ("deny", denial)


@pytest.mark.parametrize("argv", ISSUE_UNREADABLE_IN_TRUSTED, ids=ids(ISSUE_UNREADABLE_IN_TRUSTED))
def test_inline_code_in_trusted_mode_asks_or_runs_bounded(argv: list[str], settings: Any) -> None:
    call = make_call(argv, "trusted")
    assert command_blocklist(call) is None  # the guard cannot read inside: it does not pretend
    settings.HARNESS_SANDBOX = "off"
    assert outcome(call)[0] == "ask"
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", True
    assert outcome(call)[0] == "ask"  # a sandbox with network does not bound it
    settings.HARNESS_SANDBOX_NETWORK = False
    action, reason = outcome(call)
    assert action == "allow" and "runs in the sandbox, without network" in reason


def test_an_alias_defined_then_used_is_blocked_then_unreadable() -> None:
    define = make_call(["git", "config", "alias.p", "push"], "trusted")
    assert "git alias" in (command_blocklist(define) or "")
    use = make_call(["git", "p"], "trusted", allow=["run_command(git *)"])
    found = evaluate(use, allow=["run_command(git *)"], ask=[], deny=[])
    assert found.action is None and "could be an alias" in (found.unreadable or "")


def test_a_command_the_client_runs_is_never_bounded_by_the_sandbox(settings: Any) -> None:
    client_bash = dataclasses.replace(RUN_COMMAND, name="Bash", client_executed=True)
    settings.HARNESS_SANDBOX, settings.HARNESS_SANDBOX_NETWORK = "bwrap", False
    call = dataclasses.replace(
        make_call(["python3", "-c", "print(1)"], "trusted"), tool=client_bash, name="Bash"
    )
    action, reason = outcome(call)
    assert action == "ask" and "no sandbox bounds it" in reason
    readable = dataclasses.replace(call, arguments={"argv": ["git", "status"]})
    assert outcome(readable)[0] == "allow"
