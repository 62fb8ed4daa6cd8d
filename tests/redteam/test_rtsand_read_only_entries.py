"""Red team of the sandbox (rtsand): a HARNESS_SANDBOX_READ_ONLY entry shows the sandbox
nothing a program chose.

The entries are bound by path, as root, at every run: the path was resolved, then bwrap
followed it again, with none of the checks a server's paths get. An entry lying where
sandboxed programs write (an agent's workspace, a directory the sandbox user owns: a
server's writable path) was theirs to redirect: one agent's command moved the entry's
parent aside and put a symlink to another agent's workspace in its place, and every later
command, that agent's own included, read the other workspace. Through run_command in the
real sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.sandbox_user import sandbox_user


def _sh(workspace: Path, script: str) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="rtsand", timeout=30, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", script]}))


@pytest.fixture
def other(sandboxed_workspace: Path) -> Path:
    """Another agent's workspace, with a secret of its own (the sandbox user's files)."""
    path = sandboxed_workspace.parent / "other"
    path.mkdir()
    (path / "secret.txt").write_text("OTHER-AGENTS-SECRET\n")
    _sh(path, "true")  # (given to the sandbox user, as its first run does)
    return path


def test_an_entry_a_program_can_redirect_shows_it_nothing(
    sandboxed_workspace: Path, other: Path, settings: Any
) -> None:
    entry = sandboxed_workspace / "tools" / "bin"
    entry.mkdir(parents=True)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    swap = f"mv tools tools.old && mkdir tools && ln -s {other} tools/bin && echo swapped"
    first = ""
    try:
        first = _sh(sandboxed_workspace, swap)
        second = _sh(sandboxed_workspace, f"cat {other}/secret.txt")
    except ToolError as refused:
        second = str(refused)
    assert "OTHER-AGENTS-SECRET" not in second, (first, second)
    assert "HARNESS_SANDBOX_READ_ONLY" in second, second
    # refused from the first run: the entry lies in the workspace root, which programs write
    assert "Harness's own state" in second or "sandboxed programs may write" in second, second


def test_an_entry_in_a_directory_the_sandbox_user_owns_is_refused(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path
) -> None:
    # a server's writable path, say (given to the sandbox user): a server swaps the entry
    # for a symlink between the resolution and bwrap's bind, when it likes
    shared = tmp_path / "shared"
    (shared / "toolchain").mkdir(parents=True)
    user = sandbox_user()
    if user is None:  # (unprivileged: test_rtsandnr_unprivileged_entries.py)
        pytest.skip("the sandbox user is another user only when Harness is root")
    uid, gid = user
    os.chown(shared, uid, gid)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(shared / "toolchain")]
    with pytest.raises(ToolError, match="HARNESS_SANDBOX_READ_ONLY") as refused:
        _sh(sandboxed_workspace, "ls /")
    assert str(shared) in str(refused.value)


def test_an_entry_inside_harness_state_is_refused(
    sandboxed_workspace: Path, other: Path, settings: Any
) -> None:
    # the workspace root (or the data directory) is never shown, an entry inside it neither
    settings.HARNESS_SANDBOX_READ_ONLY = [str(other)]
    # (unprivileged, the workspace root is Harness's to write: refused for that first)
    refusal = "Harness's own state" if os.geteuid() == 0 else "sandboxed programs may write"
    with pytest.raises(ToolError, match=refusal):
        _sh(sandboxed_workspace, f"cat {other}/secret.txt")


def test_an_entry_only_admins_write_is_shown(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path
) -> None:
    # a symlink an admin made (in a directory programs cannot write) is followed
    if os.geteuid() != 0:  # (unprivileged: test_rtsandnr_unprivileged_entries.py)
        pytest.skip("an entry must lie where only others write; as root the test makes one")
    toolchain = tmp_path / "opt" / "toolchain-1.2"
    toolchain.mkdir(parents=True)
    (toolchain / "tool.txt").write_text("a tool\n")
    (tmp_path / "opt" / "toolchain").symlink_to(toolchain)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tmp_path / "opt" / "toolchain")]
    out = _sh(sandboxed_workspace, f"cat {toolchain}/tool.txt")
    assert out == "exit code 0\na tool\n", out


@pytest.mark.django_db
def test_the_start_up_checks_name_such_an_entry(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path
) -> None:
    from django.core.checks import run_checks

    entry = sandboxed_workspace / "tools"
    entry.mkdir()
    _sh(sandboxed_workspace, "true")  # (the workspace is the sandbox user's)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    found = {error.id: error for error in run_checks()}
    assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} reaches" in found["dispatcher.E041"].msg
    assert "remove the entry" in found["dispatcher.E041"].hint  # (not "install bubblewrap")
