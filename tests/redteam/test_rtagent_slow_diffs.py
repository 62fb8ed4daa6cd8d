"""Red-team rtagent: a diff a reviewer is shown is made in bounded time, whatever lines the
model chose.

An asking Edit (Claude Code's hook), MultiEdit, write_file, or a previewed command's
change is shown to the reviewer as a unified diff, made while the call is admitted, on the
web process's thread. difflib's matcher took minutes on lines the model chose: an Edit
whose old_string and new_string are 20,000 lines of 200 values each (138 KB, far below
the body limit) held the thread, and the interpreter, for over three minutes before the
call was even asked; a near-identical 50,000-line write, half a minute. A handful of them
stalled the process for every agent and reviewer it serves."""

from __future__ import annotations

import time

import httpx
import pytest

from approvals.models import ApprovalRequest
from dispatcher.models import ToolCall
from dispatcher.tools import diffs
from tests.support.factories import AgentFixture, unique
from tests.support.live import LiveStack


def _lines(values: int, step: int, count: int = 20_000) -> str:
    return "".join(f"{(i * step) % values}\n" for i in range(count))


@pytest.mark.slow
def test_an_asking_edit_of_model_chosen_lines_is_asked_at_once(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    external = unique("cc")
    old, new = _lines(200, 1), _lines(200, 7)
    body = {
        "session_id": external,
        "cwd": "/home/dev/project",
        "hook_event_name": "PreToolUse",
        "tool_name": "Edit",
        "tool_input": {
            "file_path": "/home/dev/project/a.txt",
            "old_string": old,
            "new_string": new,
        },
        "tool_use_id": "toolu_edit",
    }
    try:
        answer = httpx.post(
            live_stack.url + "/api/v1/hooks/claude-code?wait=0",
            headers=live_agent.headers,
            json=body,
            timeout=60,
        )
    except httpx.TimeoutException:
        pytest.fail("the Edit was not asked within 60 s: its diff held the web thread")
    assert answer.status_code == 200, answer.text[:300]
    call = ToolCall.objects.get(session__external_id=external, tool_use_id="toolu_edit")
    diff = ApprovalRequest.objects.get(call=call).presentation["diff"]
    # The change shown whole: every old line removed, every new one added.
    assert diff.count("\n-") >= 19_000 and diff.count("\n+") >= 19_000, diff[:300]


def test_diffs_of_model_chosen_lines_are_made_in_bounded_time_and_are_true() -> None:
    cases = [
        (_lines(200, 1).splitlines(True), _lines(200, 7).splitlines(True)),
        (_lines(101, 1, 50_000).splitlines(True), None),  # one line changed, mid-file
        ([f"{i % 2}\n" for i in range(199)], [f"{(i // 2) % 2}\n" for i in range(199)]),
    ]
    for old, new in cases:
        if new is None:
            new = list(old)
            new[len(new) // 2] = "changed\n"
        started = time.monotonic()
        made = list(diffs.unified_diff(old, new, "a/x", "b/x"))
        assert time.monotonic() - started < 5, len(old)
        assert _applied(old, made) == new


def _applied(old: list[str], diff: list[str]) -> list[str]:
    """`old` with the unified `diff` applied (each line checked against it)."""
    out: list[str] = []
    at = 0
    for line in diff[2:]:
        if line.startswith("@@"):
            first = int(line.split()[1][1:].split(",")[0])
            length = line.split()[1].split(",")[1] if "," in line.split()[1] else "1"
            start = first - 1 if length != "0" else first
            out += old[at:start]
            at = start
        elif line[0] in " -":
            assert old[at] == line[1:], (at, line)
            if line[0] == " ":
                out.append(line[1:])
            at += 1
        else:
            out.append(line[1:])
    return out + old[at:]
