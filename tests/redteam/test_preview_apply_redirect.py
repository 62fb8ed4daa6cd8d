"""Red team (D4c): applying a nested workspace's previewed effect. Agent A's program swaps
a directory on the path of agent B's workspace (A/x/B) for a symlink to a person's tree,
over and over, while B's approved effect is checked and applied (as previews.settle does,
under B's lock, which A's program never takes): the effect must land in B or nowhere,
never in the person's tree."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import preview, preview_apply, sandbox
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

# B's command: it creates files (each one more open of the workspace by the apply) and
# deletes one (a whiteout the apply turns into an unlink)
COMMAND = ["sh", "-c", "for n in 1 2 3 4 5 6 7 8; do echo planted > planted-$n; done; rm secret"]
ATTEMPTS = 600  # at most; it stops once APPLIED effects landed in B and REFUSED were refused
APPLIED = 40  # before the fix one effect in 10 to 30 applied went (in part) to the person
REFUSED = 10
PLANTED = {f"planted-{n}": b"planted\n" for n in range(1, 9)}


def _exchange(first: Path, second: Path) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.renameat2(-100, bytes(first), -100, bytes(second), 2) == 0, ctypes.get_errno()


def _pause(flipper: subprocess.Popen[bytes], a: Path) -> None:
    """Stop A's program (waited for), with A/x a directory again."""
    flipper.send_signal(signal.SIGSTOP)
    os.waitpid(flipper.pid, os.WUNTRACED)
    if (a / "x").is_symlink():
        _exchange(a / "x", a / "x-link")


def _tree(root: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(root.iterdir())}


def test_a_flipping_nested_workspace_never_gets_the_effect_written_elsewhere(
    workspace: Path,
) -> None:
    """Before the fix check and apply took the workspace by path: the fingerprint walk
    met B, then apply's resolve (and each member's open of the root) went through A/x
    flipped to the person's tree, which got B's file and lost its own. Now both work
    from the descriptor of the directory judged, opened once."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace, own="B's own\n")
    nested = a / "x" / "B"
    persons = _tree(victim / "B")
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    applied = refused = 0
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        for _ in range(ATTEMPTS):
            _pause(flipper, a)
            for name in PLANTED:
                (nested / name).unlink(missing_ok=True)
            (nested / "secret").write_text("B's own\n")
            effect = preview.run_preview(COMMAND, cwd=nested, workspace=nested, env={})
            assert effect.appliable and effect.summary(), effect.why_not_appliable()
            flipper.send_signal(signal.SIGCONT)
            try:
                reason = preview_apply.check(effect, nested)
                if reason is None:
                    preview_apply.apply(effect, nested, checked=True)
            except (OSError, preview_apply.NotAppliable) as error:  # said, not hidden
                reason = str(error)
            finally:
                _pause(flipper, a)
                preview.discard(effect.store)
            if _tree(victim / "B") != persons:
                break
            if reason is None:
                assert _tree(nested) == PLANTED
                applied += 1
            else:
                refused += 1
            flipper.send_signal(signal.SIGCONT)
            if applied >= APPLIED and refused >= REFUSED:
                break
    finally:
        flipper.kill()
        flipper.wait()
    assert _tree(victim / "B") == persons, (
        f"the effect was written into the person's tree (after {applied} applied in B)"
    )
    assert applied >= APPLIED and refused >= REFUSED, (applied, refused)
