"""Red team: the before side of a nested workspace's preview (what the effect says a
command deletes, what a symlink pointed at) is read from the directory held, never by a
path walked again. Agent B's workspace lies in agent A's (A/x/B), so A's program may
write in it: it exchanges B's directory `d` with a symlink to a person's tree, over and
over, while Harness reads what B's `rm -rf d` deleted. The effect a reviewer sees (and
its error, when it cannot be read) must never name the person's files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import preview, sandbox
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

COMMAND = ["sh", "-c", "rm -rf d"]
ROUNDS = 20_000  # at most; it stops once B's own listing was read READ times
READ = 200
PERSONS = ("persons-file", "persons-dir", "persons-link")


def test_a_flipping_nested_workspace_never_shows_another_trees_names(workspace: Path) -> None:
    """Before the fix the deleted tree was listed by scandir of a path below the held
    directory (/proc/self/fd/N/d), which followed `d` swapped for a symlink: the effect
    listed the person's names as deleted, or its error named the person's file."""
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace)
    nested = a / "x" / "B"
    (nested / "d" / "own-dir").mkdir(parents=True)
    (nested / "d" / "own-file").write_text("B's own\n")
    for path in (nested / "d", nested / "d" / "own-dir", nested / "d" / "own-file"):
        os.chown(path, *owner)  # B's, as a program of B would have made them
    persons = victim / "B"
    (persons / "persons-file").write_text("the person's\n")
    (persons / "persons-dir").mkdir()
    (persons / "persons-link").symlink_to("persons-file")
    (nested / "d-link").symlink_to(persons)
    effect = preview.run_preview(COMMAND, cwd=nested, workspace=nested, env={})
    try:
        assert [change["path"] for change in effect.changes] == [
            "d",
            "d/own-dir",
            "d/own-file",
        ], (effect.changes, effect.exit_text, effect.output)
        tar = Path(effect.store) / "upper.tar"
        held = os.open(nested, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        flipper = subprocess.Popen(
            ["/usr/bin/python3", "-c", FLIPPER, str(nested / "d"), str(nested / "d-link")],
            stdout=subprocess.PIPE,
        )
        assert flipper.stdout is not None
        shown: list[str] = []  # each effect (or error) as a reviewer would read it
        read = 0
        try:
            assert flipper.stdout.readline() == b"flipping\n"
            for _ in range(ROUNDS):
                try:
                    changes, _ = preview.read_changes(tar, Path(f"/proc/self/fd/{held}"))
                    text = json.dumps(changes)
                    read += "own-file" in text
                except OSError as error:  # refused: said as the preview's error
                    text = str(error)
                shown.append(text)
                if any(name in text for name in PERSONS) or read >= READ:
                    break
        finally:
            flipper.kill()
            flipper.wait()
            os.close(held)
    finally:
        preview.discard(effect.store)
    leaked = [text for text in shown if any(name in text for name in PERSONS)]
    assert not leaked, f"{len(leaked)} of {len(shown)} reads named the person's files: {leaked[0]}"
    assert read >= READ, (read, len(shown))


def test_a_flipping_nested_workspace_never_leads_the_fingerprint_walk_elsewhere(
    workspace: Path,
) -> None:
    """Before the fix the workspace's fingerprint (taken before each preview, and again
    before its effect is applied) walked each directory by a path below the held one, so
    `d` swapped for a symlink had the walk list the person's tree (a symlink to / had it
    walk the whole machine as root, under the workspace's lock). The person's directory
    was never read: its access time, set in the past, stays there."""
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace)
    nested = a / "x" / "B"
    (nested / "d" / "own-dir").mkdir(parents=True)
    persons = victim / "B"
    (persons / "persons-dir").mkdir()
    (nested / "d-link").symlink_to(persons)
    os.utime(persons, (0, persons.stat().st_mtime))  # relatime: the next read updates it
    held = os.open(nested, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(nested / "d"), str(nested / "d-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    walks = 0
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        while walks < 5_000 and persons.stat().st_atime == 0:
            preview.fingerprint_of(nested, root_fd=held)
            walks += 1
    finally:
        flipper.kill()
        flipper.wait()
        os.close(held)
    assert persons.stat().st_atime == 0, f"the walk read the person's directory ({walks} walks)"
