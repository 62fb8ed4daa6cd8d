"""Red team (D4d): the file tools in a nested workspace. Agent A's program swaps a
directory on the path of agent B's workspace (A/x/B) for a symlink to a person's tree,
over and over, while B's read_file, write_file and delete_file run: each must reach B's
own files or fail, never read, write or delete the person's."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dispatcher.tools import delete_file, read_file, sandbox, write_file
from dispatcher.tools.base import ExecutionContext, ToolError
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

# Rounds at most (of each tool); before the fix about one read in three returned the
# person's file. The loop ends as soon as each tool reached B's own file DONE times, so a
# loaded machine (where the flipper wins more often) only makes it run longer.
# until each tool got through DONE times, or SECONDS at most: how often the flipper leaves
# a steady moment depends on the machine's load, not on the code
SECONDS = 120
DONE = 10


def test_a_flipping_nested_workspace_never_leads_the_file_tools_elsewhere(
    workspace: Path,
) -> None:
    """Before the fix the tools resolved the workspace's path and opened it by path for
    every file (_confined.open_beneath): with A/x flipped at that moment, read_file
    returned the person's file, write_file wrote into their tree (as root) and
    delete_file removed their file. Now the root is opened as the sandbox opens it
    (no symlink a program may have placed followed) and the path checked against it."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    (victim / "B" / "doomed").write_text("the person's too\n")
    persons = {path.name: path.read_bytes() for path in (victim / "B").iterdir()}
    ctx = ExecutionContext(workspace=nested, call_id="d4d", timeout=30, output_limit=20_000)
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    reached = {"read": 0, "write": 0, "make": 0, "delete": 0}
    read: list[str] = []
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            attempts = (
                ("read", read_file.TOOL, {"path": "secret"}),
                ("write", write_file.TOOL, {"path": "planted", "content": "B's write\n"}),
                ("make", write_file.TOOL, {"path": "doomed", "content": "B's to delete\n"}),
                ("delete", delete_file.TOOL, {"path": "doomed"}),
            )
            for name, tool, args in attempts:
                try:
                    out = str(tool.execute(ctx, args))
                except (ToolError, OSError):
                    continue
                reached[name] += 1
                if name == "read":
                    read.append(out)
            if not (victim / "B" / "doomed").exists() or "the person's" in "".join(read):
                break
            if min(reached.values()) >= DONE:
                break
    finally:
        flipper.kill()
        flipper.wait()
    now = {path.name: path.read_bytes() for path in (victim / "B").iterdir()}
    assert now == persons, "the person's tree was written or deleted in"
    leaked = [out for out in read if "the person's" in out]
    assert not leaked, f"{len(leaked)} of {len(read)} reads returned the person's file"
    assert min(reached.values()) >= DONE, reached


DOT_PATHS = (".", "..", "./", "sub/.", "sub/..", "sub/../.")
DOT_ROUNDS = 300


def test_delete_file_of_a_dot_path_is_refused_cleanly_while_the_workspace_flips(
    workspace: Path,
) -> None:
    """Before the fix delete_file of '.' or 'a/..' resolved the workspace's path again to
    tell whether the path named the workspace itself; with A/x flipping, that resolve
    raised EINVAL (a readlink of what was no longer a link), a raw OSError the worker
    turned into an unclear error. Now such a path is refused by its text, before anything
    is resolved, and any OSError of the race becomes a tool error."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    (nested / "sub").mkdir()
    persons = {path.name: path.read_bytes() for path in (victim / "B").iterdir()}
    ctx = ExecutionContext(workspace=nested, call_id="d4e", timeout=30, output_limit=20_000)
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    escaped: list[OSError] = []
    answers: set[str] = set()
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        for _ in range(DOT_ROUNDS):
            for path in (*DOT_PATHS, "sub/gone"):
                try:
                    delete_file.TOOL.execute(ctx, {"path": path})
                except ToolError as error:
                    if path in DOT_PATHS:
                        answers.add(str(error).split(":")[0])
                except OSError as error:
                    escaped.append(error)
    finally:
        flipper.kill()
        flipper.wait()
    assert not escaped, f"{len(escaped)} raw OSErrors escaped delete_file: {escaped[:3]}"
    assert answers == {f"Refusing to delete {path!r}" for path in DOT_PATHS}
    assert {path.name: path.read_bytes() for path in (victim / "B").iterdir()} == persons
    # (the flipper stopped at either state: B's tree is under whichever name is no link)
    [own] = [path / "B" for path in (a / "x", a / "x-link") if not path.is_symlink()]
    assert (own / "sub").is_dir() and (own / "secret").read_text() == "B's own\n"
