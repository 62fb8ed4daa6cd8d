"""Red team (D4d, the other two file tools): search_files and list_directory in a nested
workspace. Agent A's program swaps a directory on the path of agent B's workspace (A/x/B)
for a symlink to a person's tree, over and over: each call answers with B's own files
or refuses (a ToolError, as the model reads it), never with the person's, and never
fails with another exception (a traceback, not an answer)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import list_directory, sandbox, search_files
from dispatcher.tools.base import ExecutionContext, ToolError
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

CALLS = 20_000  # rounds (each tool once a round; most are refused, the path flipped)
DONE = 100  # answers of each tool at least

# A's program: flips the path in bursts of an odd number of swaps, each followed by a
# millisecond's pause, so the path rests in each of its two states in turn. Flipping
# without a pause, on an idle two-core host, left the path flipped for nearly every
# call: 11 to 39 answers of 20,000 rounds (on a loaded one, a few hundred), and the test
# failed for want of answers, not for a leak.
PAUSING_FLIPPER = FLIPPER.replace(
    "while True:\n    libc.renameat2(-100, first, -100, second, 2)\n",
    "import time\nwhile True:\n    for _ in range(51):\n"
    "        libc.renameat2(-100, first, -100, second, 2)\n    time.sleep(0.001)\n",
)
assert PAUSING_FLIPPER != FLIPPER


def test_a_flipping_nested_workspace_never_leads_search_or_list_elsewhere(
    workspace: Path,
) -> None:
    """Before the fix the path check's resolve of the workspace raised OSError (EINVAL:
    Python read as a link what had been one a moment before), out of every file tool
    and out of the guard; and search_files took the workspace's path a second time
    (start.relative_to(workspace.resolve())) after opening the directory judged, so
    with A/x flipped then it raised ValueError naming the person's tree."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    (victim / "B" / "persons-only").write_text("the person's too\n")
    ctx = ExecutionContext(workspace=nested, call_id="d4d", timeout=30, output_limit=20_000)
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", PAUSING_FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    answered = {"search": 0, "list": 0}
    shown: list[str] = []
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        for _ in range(CALLS):
            for name, tool, args in (
                ("search", search_files.TOOL, {"pattern": "own|person", "path": "."}),
                ("list", list_directory.TOOL, {"path": "."}),
            ):
                try:
                    shown.append(str(tool.execute(ctx, args)))
                except ToolError:
                    continue
                answered[name] += 1
            if any("person" in out for out in shown):
                break
    finally:
        flipper.kill()
        flipper.wait()
    leaked = [out for out in shown if "person" in out]
    assert not leaked, f"{len(leaked)} answers showed the person's tree: {leaked[0]}"
    assert min(answered.values()) >= DONE, answered
