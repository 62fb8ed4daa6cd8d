"""Red team rt9: path_violation in a workspace nested in another agent's (A/x/B) while A's
program flips A/x with a symlink to a person's tree. The guard resolved the workspace's
path (`Path.resolve`) and walked what that reached: at a flipped moment, the person's tree.
Its answer then told agent B what the person's tree holds (a link there leading out:
"resolves outside"; B's own tree has no such entry: allowed). The walk now starts at the
workspace opened as the sandbox opens it (no symlink a program may have placed followed),
so the answer is about B's own tree or says the workspace changed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools._paths import WORKSPACE_CHANGED, path_violation
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

# It stops once B's own answer came DONE times, or after SECONDS at most: how often the
# flipper leaves a steady moment depends on the machine's load, not on the code.
SECONDS = 120
DONE = 50


def test_the_guard_never_answers_about_the_tree_a_flipped_path_leads_to(
    workspace: Path,
) -> None:
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    (victim / "B" / "probe").symlink_to("/etc")  # only in the person's tree
    nested = a / "x" / "B"
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    answers: dict[str, int] = {}
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        own = 0
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            answer = str(path_violation("probe/passwd", nested))
            answers[answer] = answers.get(answer, 0) + 1
            own += answer == "None"
            if own >= DONE:
                break
    finally:
        flipper.kill()
        flipper.wait()
    assert set(answers) <= {"None", WORKSPACE_CHANGED}, answers
    assert answers.get("None", 0) >= DONE, answers


def test_a_refusal_never_names_the_tree_a_flipped_path_leads_to(workspace: Path) -> None:
    """A path refused before anything is resolved (absolute, `~`) is answered with the
    workspace's path, which was the resolved one: at a flipped moment, the person's."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    told: list[str] = []
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            told.append(str(path_violation("/etc/passwd", nested)))
            if sum("is absolute" in answer for answer in told) >= DONE:
                break
    finally:
        flipper.kill()
        flipper.wait()
    named = [answer for answer in told if "victim" in answer]
    assert not named, f"{len(named)} of {len(told)} answers named {victim}"
    assert sum("is absolute" in answer for answer in told) >= DONE
