"""Red team (D4b): a nested workspace's preview names its overlay's lower layer. Agent A's
program swaps a directory on the path of agent B's workspace (A/x/B) for a symlink to a
person's tree, over and over, while B's commands are previewed: the preview must show
B's own files or none, never the person's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import preview, sandbox
from dispatcher.tools.base import ToolError
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

# Agent A's program: renameat2(RENAME_EXCHANGE) of A/x (a directory) and A/x-link (a
# symlink to the person's tree), as fast as it can, until it is killed.
FLIPPER = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
first, second = sys.argv[1].encode(), sys.argv[2].encode()
if libc.renameat2(-100, first, -100, second, 2) != 0:
    sys.exit(f"renameat2: {ctypes.get_errno()}")
print("flipping", flush=True)
while True:
    libc.renameat2(-100, first, -100, second, 2)
"""

# B's command: it reads B's file (the output) and rewrites it (the effect: a diff against
# the file as it was, read by Harness after the namespace ended)
COMMAND = ["sh", "-c", "cat secret; echo new > secret"]
ATTEMPTS = 3000  # at most; it stops once RAN previews ran and CHANGED were refused
RAN = 20
CHANGED = 3  # refused in the namespace: the path led elsewhere than the directory judged


def test_a_flipping_nested_workspace_never_shows_another_directorys_files(
    workspace: Path,
) -> None:
    """Before the fix the overlay's lower layer, its mount point and the sandbox's bind were
    paths, each walked again through A/x: one preview in two that ran printed the
    person's file. Now the preview runs over the directory judged, or not at all."""
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, _ = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    shown: list[preview.Effect] = []  # what a reviewer would see
    changed = 0
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        for _ in range(ATTEMPTS):
            try:
                made = preview.run_preview(COMMAND, cwd=nested, workspace=nested, env={})
            except preview.PreviewUnavailable as error:
                assert "changed while its preview was being set up" in str(error), error
                changed += 1
            except ToolError as error:  # refused before: a symlink stood there
                assert "symlink" in str(error), error
            else:
                preview.discard(made.store)
                shown.append(made)
                if "the person's" in json.dumps(made.document()):
                    break
            if len(shown) >= RAN and changed >= CHANGED:
                break
    finally:
        flipper.kill()
        flipper.wait()
    leaked = [made for made in shown if "the person's" in json.dumps(made.document())]
    assert not leaked, f"{len(leaked)} of {len(shown)} previews showed the person's file"
    assert {made.output for made in shown} == {"B's own\n"}
    for made in shown:  # B's own file, before and after
        assert [change["path"] for change in made.changes] == ["secret"], made.changes
        assert "\n-B's own\n+new\n" in made.changes[0]["diff"], made.changes
    assert len(shown) >= RAN and changed >= CHANGED, (len(shown), changed)
