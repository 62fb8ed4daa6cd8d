"""Red team (rtc): "reviewers approve a command's previewed effect, which is then exactly
what happens". Each test runs a real program in the real preview sandbox over a real
workspace (tests.tools.test_preview's fixture) and compares what the effect shows with
what applying it does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, preview_apply, workspace_lock
from tests.tools.test_preview import _by_path, _preview, _tree, workspace

__all__ = ["workspace"]


def _apply(effect: preview.Effect, workspace: Path) -> None:
    with workspace_lock.held(workspace):
        preview_apply.apply(effect, workspace)


def _shown_deleted(effect: preview.Effect) -> set[str]:
    return {c["path"] for c in effect.changes if c["change"] == "deleted"}


def test_a_directory_under_a_recreated_one_hides_no_deletion(workspace: Path) -> None:
    """`rm -rf src` then the same files put back and `mkdir -p src/sub`: src is an opaque
    directory of the upper layer, src/sub a plain one. The effect listed only what was
    missing directly under src (nothing: a.py and b.py came back unchanged), so it read
    "change no files"; the apply removed src whole and with it src/sub/keep.py and
    src/sub/deeper/k2, which the reviewer never saw."""
    (workspace / "src" / "sub" / "deeper").mkdir(parents=True)
    (workspace / "src" / "sub" / "keep.py").write_text("precious\n")
    (workspace / "src" / "sub" / "deeper" / "k2").write_text("precious too\n")
    script = (
        "cp -a src/a.py src/b.py /tmp/ && rm -rf src && mkdir -p src/sub/deeper && "
        "cp -a /tmp/a.py /tmp/b.py src/"
    )
    effect = _preview(workspace, ["sh", "-c", script])
    before = _tree(workspace)
    _apply(effect, workspace)
    gone = set(before) - set(_tree(workspace))
    assert gone == {"src/sub/keep.py", "src/sub/deeper/k2"}  # what the apply does
    assert _shown_deleted(effect) == gone  # and what the reviewer must have seen
    assert effect.summary() != "This command would: change no files"
    preview.discard(effect.store)
