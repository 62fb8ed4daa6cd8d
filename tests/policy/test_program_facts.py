"""The table of program facts (dispatcher/policy/program_facts.py): every example of every
row, through the strict reader (allow rules), the wide reader (deny rules) and the guard;
and the three readers agree on what the table says each program is."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from dispatcher.policy import program_facts
from dispatcher.policy.context import CallContext, Profile
from dispatcher.policy.guards import command_blocklist
from dispatcher.policy.parts import command_parts
from dispatcher.policy.program_facts import GIT, PROGRAMS, Program, check_table
from dispatcher.policy.reading import read_command
from dispatcher.policy.rules import evaluate
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

pytestmark = pytest.mark.backend_independent

ROWS: list[Program | program_facts.GitFacts] = [*PROGRAMS, GIT]


def examples(kind: str) -> list[tuple[str, str]]:
    return [("/".join(row.names[:2]), example) for row in ROWS for example in getattr(row, kind)]


def call(argv: list[str]) -> CallContext:
    return CallContext(
        call_id="t",
        session_id="s",
        tool=RUN_COMMAND,
        name="run_command",
        arguments={"argv": argv},
        workspace=Path("/nonexistent-ws"),
        mode="standard",
        username="u",
        agent_name="a",
        profile=Profile(mode="standard"),
    )


def test_the_table_loads_with_no_error() -> None:
    assert check_table() == []


def test_the_check_refuses_a_row_without_examples_or_naming_another_program() -> None:
    bare = Program(("frobnicate",))
    assert check_table((bare,), GIT) == [
        "frobnicate: no unreadable example",
        "frobnicate: no readable example",
    ]
    stray = Program(("frob",), readable=("ls -l",), unreadable=("frob -x",))
    assert check_table((stray,), GIT) == ["frob: example 'ls -l' names none of the row's programs"]
    twice = tuple(
        Program(("sh",), shell_kind="read", readable=(f"sh {n}",), unreadable=("sh -i",))
        for n in "ab"
    )
    assert "sh: two rows say it is a shell" in check_table(twice, GIT)


def test_every_row_carries_examples_both_ways() -> None:
    for row in ROWS:
        never_read = isinstance(row, Program) and (row.opaque or row.evaluates)
        assert row.readable or never_read, row.names
        assert row.unreadable or row.blocked, row.names
    assert len(examples("readable")) + len(examples("unreadable")) >= 250


@pytest.mark.parametrize(("row", "example"), examples("readable"))
def test_readable_examples_are_read_and_allowed_by_a_rule(row: str, example: str) -> None:
    argv = shlex.split(example)
    reading = read_command(tuple(argv))
    assert reading.unreadable is None, reading.unreadable
    assert evaluate(call(argv), allow=["run_command"], ask=[], deny=[]).action == "allow"
    assert command_blocklist(call(argv)) is None


@pytest.mark.parametrize(("row", "example"), examples("unreadable"))
def test_unreadable_examples_are_never_allowed_by_a_rule(row: str, example: str) -> None:
    argv = shlex.split(example)
    reading = read_command(tuple(argv))
    assert reading.unreadable is not None, reading.commands
    assert evaluate(call(argv), allow=["run_command"], ask=[], deny=[]).action != "allow"
    assert evaluate(call(["sh", "-c", example]), allow=["run_command"], ask=[], deny=[]).action != (
        "allow"
    )


@pytest.mark.parametrize(("row", "example"), examples("blocked"))
def test_blocked_examples_are_denied_by_the_guard(row: str, example: str) -> None:
    argv = shlex.split(example)
    denial = command_blocklist(call(argv))
    assert denial is not None and ("blocked" in denial), example


@pytest.mark.parametrize(
    ("row", "example", "part"),
    [("/".join(r.names[:2]), command, part) for r in ROWS for command, part in r.sees],
)
def test_deny_rules_see_the_commands_a_program_starts(row: str, example: str, part: str) -> None:
    argv = shlex.split(example)
    parts = {found.argv for found in command_parts(tuple(argv)).parts}
    assert tuple(shlex.split(part)) in parts, parts
    rule = f"run_command({part})"
    found = evaluate(call(argv), allow=["run_command"], ask=[], deny=[rule])
    assert found.action == "deny" and found.rule == rule


@pytest.mark.parametrize("shell", sorted(program_facts.SHELLS))
def test_the_guard_and_deny_rules_read_into_every_shell_of_the_table(shell: str) -> None:
    argv = [shell, "-c", "sudo id"]
    assert "'sudo' is blocked" in (command_blocklist(call(argv)) or "")
    assert ("sudo", "id") in {part.argv for part in command_parts(tuple(argv)).parts}
    reading = read_command((shell, "-c", "ls"))
    assert (reading.unreadable is None) == (shell in program_facts.LOOKED_THROUGH_SHELLS)


@pytest.mark.parametrize("name", sorted(program_facts.PRIVILEGE_PROGRAMS))
def test_every_privilege_program_of_the_table_is_blocked_and_unreadable(name: str) -> None:
    assert f"'{name}' is blocked" in (command_blocklist(call([name, "id"])) or "")
    assert read_command((name, "id")).unreadable is not None


@pytest.mark.parametrize("name", sorted(program_facts.WIDE_WRAPPERS))
def test_the_guard_looks_through_every_wrapper_of_the_table(name: str) -> None:
    spec = program_facts.WIDE_WRAPPERS[name]
    leading = ["0"] * spec.leading_operands
    argv = {
        "flock": [name, "lock", "sudo", "id"],
        "sg": [name, "wheel", "-c", "sudo id"],
        "script": [name, "-c", "sudo id"],
    }.get(name, [name, *leading, "sudo", "id"])
    assert "is blocked" in (command_blocklist(call(argv)) or ""), argv


def test_a_row_is_frozen_data() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PROGRAMS[0].names = ("x",)  # type: ignore[misc]
