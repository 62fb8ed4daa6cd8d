"""The red-team review of the command readers (F1, F2, F4, F6): each proved bypass, kept
closed. Real-shell checks of the same strings are in test_reading_against_bash.py."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.policy.context import CallContext, Profile
from dispatcher.policy.guards import _blocklist_answer, blocked_reason, command_blocklist
from dispatcher.policy.parts import command_parts
from dispatcher.policy.reading import read_command
from dispatcher.policy.shell import decode_ansi_c, read_ansi_c
from dispatcher.policy.waterfall import permission_mode, run_guards, run_waterfall, user_rules
from dispatcher.tools.claude_code import BASH
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


def make_call(command: Any, mode: str, tool: Any = RUN_COMMAND, **rules: Any) -> CallContext:
    profile = Profile(
        mode=mode,
        allow=tuple(rules.get("allow", ())),
        ask=tuple(rules.get("ask", ())),
        deny=tuple(rules.get("deny", ())),
    )
    argument = "command" if tool is BASH else "argv"
    return CallContext(
        call_id="t",
        session_id="s",
        tool=tool,
        name=tool.name,
        arguments={argument: command},
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


def parts_of(argv: list[str]) -> set[tuple[str, ...]]:
    return {part.argv for part in command_parts(tuple(argv)).parts}


# --- F1: $'\c' ---------------------------------------------------------------------------------

F1_STRINGS = [
    "echo $'\\c' ; rm -rf src # '",
    "echo $'\\c' ; git push # '",
    "echo $'a\\c' ; sudo id # '",
    "echo $'\\c\\\\' ; sudo id # '",
]


@pytest.mark.parametrize("text", F1_STRINGS)
def test_ansi_c_ends_where_bash_ends_it(text: str) -> None:
    reading = read_command(("bash", "-c", text))
    hidden = text.split(" ; ", 1)[1].split(" #", 1)[0].split()
    seen = any(command.argv == tuple(hidden) for command in reading.commands)
    assert seen or f"'{hidden[0]}'" in (reading.unreadable or ""), reading
    assert _blocklist_answer(("bash", "-c", text)) is not None or hidden[0] == "rm"
    assert tuple(hidden) in parts_of(["bash", "-c", text])


def test_ansi_c_control_escapes_decode_as_bash_does() -> None:
    # (body, what bash makes of it): `\cX` is a control character, `\c` ending the body
    # stays literal, `\c\\` is one control character (bash 5.2, checked by hand and in
    # test_reading_against_bash.py)
    cases = {
        "\\c": "\\c",
        "\\cA": "\x01",
        "\\ca": "\x01",
        "\\c?": "\x7f",
        "\\c1": "\x11",
        "\\c\\\\": "\x1c",
        "\\c\\\\x": "\x1cx",
        "\\c\\\\\\\\": "\x1c\\",
        "\\c\\x41": "\x1cx41",
        "\\cA\\c": "\x01\\c",
    }
    for body, expected in cases.items():
        assert read_ansi_c(body + "'", 0, strict=True) == (expected, len(body) + 1), body
    assert decode_ansi_c("echo $'\\c' ; x # '") == "echo '\\c' ; x # '"


def test_claude_code_bash_with_a_hidden_rm_is_not_allowed() -> None:
    text = "echo $'\\c' ; rm -rf src # '"
    call = make_call(text, "standard", BASH, allow=["Bash(echo *)"], deny=["Bash(rm *)"])
    assert outcome(call)[0] == "deny"
    pushed = make_call("echo $'\\c' ; git push # '", "trusted", BASH)
    assert "git push" in (command_blocklist(pushed) or "")


def test_run_command_bash_c_with_a_hidden_command_is_not_allowed() -> None:
    argv = ["bash", "-c", "echo $'\\c' ; id > out.txt # '"]
    call = make_call(argv, "standard", allow=["run_command(echo *)"])
    assert outcome(call)[0] != "allow"
    assert read_command(tuple(argv)).unreadable is not None  # the redirection to a file


# --- F2: sh -c is dash --------------------------------------------------------------------------

F2_STRINGS = [
    "echo $'\\' ; touch PWNED # '",
    "echo $'\\' ; sudo id # '",
    "echo $'\\' ; git push # '",
    'echo $"x" ; git push # "',
]


@pytest.mark.parametrize("shell", ["sh", "dash"])
@pytest.mark.parametrize("text", F2_STRINGS)
def test_dash_strings_are_not_read_with_bash_quoting(shell: str, text: str) -> None:
    argv = [shell, "-c", text]
    assert read_command(tuple(argv)).unreadable is not None
    call = make_call(argv, "standard", allow=["run_command(echo *)"])
    assert outcome(call)[0] != "allow"
    if "touch" not in text:
        assert blocked_reason(argv) is not None
    hidden = text.split(" ; ", 1)[1].split(" #", 1)[0].split()
    assert tuple(hidden) in parts_of(argv)


def test_watch_strings_are_read_as_sh() -> None:
    argv = ["watch", "echo", "$'\\'", ";", "git", "push", "#", "'"]
    assert read_command(tuple(argv)).unreadable is not None
    assert blocked_reason(argv) is not None
    assert ("git", "push") in parts_of(argv)


def test_a_deny_rule_sees_a_dash_hidden_command() -> None:
    argv = ["sh", "-c", "echo $'\\' ; touch PWNED # '"]
    call = make_call(argv, "trusted", deny=["run_command(touch *)"])
    assert outcome(call)[0] == "deny"


def test_bash_strings_still_decode_ansi_c() -> None:
    argv = ["bash", "-c", "echo $'it\\'s'"]
    assert read_command(tuple(argv)).commands[0].argv == ("echo", "it's")
    assert blocked_reason(argv) is None


# --- F4: jobs -x, NAME+=value, other builtins and wrappers -----------------------------------

JOBS = [
    ["jobs", "-x", "sudo", "id"],
    ["jobs", "-x", "git", "push"],
    ["jobs", "-x", "rm", "-rf", "/"],
    ["bash", "-c", "jobs -x git push"],
]


@pytest.mark.parametrize("argv", JOBS)
def test_jobs_x_runs_its_command(argv: list[str], settings: Any) -> None:
    settings.HARNESS_SANDBOX = "bwrap"  # trusted mode's answer, whether this host has bwrap
    assert read_command(tuple(argv)).unreadable is not None
    assert blocked_reason(argv) is not None
    call = make_call(argv, "trusted", deny=["run_command(git push *)"])
    assert outcome(call)[0] == "deny"


def test_jobs_without_x_is_still_read() -> None:
    assert read_command(("jobs", "-l")).unreadable is None


APPENDS = [
    "GIT_SSH_COMMAND+='sudo id' git fetch",
    "GIT_SSH_COMMAND+=$'sudo id' git fetch",
    "PAGER+='git push' git log",
]


@pytest.mark.parametrize("text", APPENDS)
def test_appending_assignments_are_read_as_assignments(text: str) -> None:
    argv = ["bash", "-c", text]
    reading = read_command(tuple(argv))
    assert reading.unreadable is not None and "sets" in reading.unreadable
    assert blocked_reason(argv) is not None


def test_a_harmless_appending_assignment_is_still_read() -> None:
    reading = read_command(("bash", "-c", "CI+=1 npm test"))
    assert reading.commands[0].argv == ("npm", "test")


# What bash runs through a builtin, keyword or wrapper (checked against bash 5.2 and
# coreutils/util-linux, see the notes at each).
HIDDEN_BY_RUNNERS = [
    ["bash", "-c", "builtin eval 'git push'"],
    ["bash", "-c", "command git push"],
    ["bash", "-c", "exec git push"],
    ["bash", "-c", "eval git push"],
    ["bash", "-c", "coproc git push"],
    ["bash", "-c", "time git push"],
    ["bash", "-c", "time -p git push"],
    ["nohup", "git", "push"],
    ["nice", "-n", "5", "git", "push"],
    ["nice", "-10", "git", "push"],
    ["timeout", "-s", "KILL", "5", "git", "push"],
    ["stdbuf", "-oL", "git", "push"],
    ["env", "-S", "git push"],
    ["xargs", "-I{}", "git", "push"],
    ["setsid", "-w", "git", "push"],
    ["chroot", "/", "git", "push"],
    ["unshare", "-r", "git", "push"],
    ["flock", "f", "git", "push"],
    ["flock", "f", "-c", "git push"],
    ["ionice", "-c", "3", "git", "push"],
    ["taskset", "-c", "0", "git", "push"],
    ["taskset", "1", "git", "push"],
    ["doas", "git", "push"],
    ["sudo", "git", "push"],
    ["su", "-c", "git push"],
    ["script", "-qc", "git push", "/dev/null"],
    ["bash", "-c", "trap 'git push' EXIT"],
    ["bash", "-c", "compgen -C 'git push' x"],
    ["bash", "-c", "complete -C 'git push' x"],
    ["strace", "-f", "-o", "log", "git", "push"],
    ["ltrace", "git", "push"],
    ["setpriv", "--reuid=1000", "git", "push"],
    ["systemd-run", "--user", "git", "push"],
    ["numactl", "--cpunodebind=0", "git", "push"],
    ["caffeinate", "git", "push"],
    ["valgrind", "--tool=none", "git", "push"],
    ["faketime", "-f", "+1d", "git", "push"],
    ["fakeroot", "git", "push"],
    ["sshpass", "-p", "x", "git", "push"],
    ["proxychains4", "-q", "git", "push"],
    ["torsocks", "git", "push"],
    ["xvfb-run", "-a", "git", "push"],
    ["dbus-run-session", "git", "push"],
    ["sandbox-exec", "-p", "(version 1)", "git", "push"],
    ["firejail", "--quiet", "git", "push"],
    ["cgexec", "-g", "cpu:x", "git", "push"],
    ["catchsegv", "git", "push"],
    ["unbuffer", "git", "push"],
    ["nocache", "git", "push"],
]


@pytest.mark.parametrize(
    "argv", HIDDEN_BY_RUNNERS, ids=[" ".join(a)[:60] for a in HIDDEN_BY_RUNNERS]
)
def test_builtins_and_wrappers_that_run_commands_are_read_through(argv: list[str]) -> None:
    assert _blocklist_answer(tuple(argv)) is not None, argv
    call = make_call(argv, "trusted", deny=["run_command(git push *)"])
    assert outcome(call)[0] == "deny"
    strict = make_call(argv, "standard", allow=["run_command(echo *)"])
    assert outcome(strict)[0] != "allow"


# --- F6: long strings --------------------------------------------------------------------------


def test_a_megabyte_shell_string_is_decided_quickly(settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    argv = ["bash", "-c", "echo " + "a " * 500_000]
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    started = time.thread_time()
    call = make_call(argv, "trusted", allow=["run_command(echo *)"], deny=["run_command(rm *)"])
    action, _ = outcome(call)
    elapsed = time.thread_time() - started
    assert action in ("ask", "deny")
    assert elapsed < 1.0, elapsed
    denial = command_blocklist(call)
    assert denial is not None and "too long" in denial


@pytest.mark.heavy
@pytest.mark.parametrize("piece", ["a;", "a|", "a ", "${a}", "$(a)"])
def test_a_string_of_many_short_words_is_decided_quickly(piece: str, settings: Any) -> None:
    settings.HARNESS_SANDBOX = "off"
    argv = ["bash", "-c", "echo " + piece * (30_000 // len(piece))]  # under 32 KB
    started = time.thread_time()
    call = make_call(argv, "trusted", allow=["run_command(echo *)"], deny=["run_command(rm *)"])
    action, _ = outcome(call)
    assert time.thread_time() - started < 1.0
    assert action in ("ask", "deny")
    assert "too many words" in (command_blocklist(call) or "")


def test_a_deeply_quoted_string_fails_closed_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv = ("bash", "-c", "echo " + "'a'\"b\"" * 10_000)
    _blocklist_answer.cache_clear()
    with caplog.at_level(logging.DEBUG):
        answer = _blocklist_answer(argv)
    assert answer is not None and "cannot read" in answer
    assert not any(record.exc_info for record in caplog.records)
    assert "RecursionError" not in caplog.text


def test_a_string_just_under_the_cap_nesting_deeply_fails_closed() -> None:
    argv = ("bash", "-c", "echo " + "'a'\"b\"" * 5_000)  # 30 KB
    _blocklist_answer.cache_clear()
    answer = _blocklist_answer(argv)
    assert answer is None or "cannot read" in answer
