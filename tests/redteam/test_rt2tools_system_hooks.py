"""A relative `core.hooksPath` of the host's system git configuration (red team of the
file tools' git refusal).

`/etc/gitconfig` setting `core.hooksPath = .githooks` (an organisation's way to have
every repository take its hooks from the repository's own `.githooks/`) names a hooks
directory in every work tree that no repository's configuration shows. The guard read
only the repositories' own configuration: `hook_paths` gave nothing, so a write_file no
person approved overwrote the person's `.githooks/pre-commit` (its mode kept), and their
next commit ran the agent's code; a sandboxed command could write it too. Now the system
configuration's value is judged as the repository's own would be (bound read-only,
refused to the file tools), unless the repository sets its own."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.write_file import TOOL as WRITE_FILE
from tests.tools.support import require_bwrap

PERSON = "#!/bin/sh\necho person-gate\n"
AGENT = "#!/bin/sh\necho agent-ran\n"


def _git(workspace: Path, *args: str, system: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "user.email=a@b", "-c", "user.name=A", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_SYSTEM": str(system)},
    )
    return done.stdout + done.stderr


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "gitconfig"
    config.write_text("[core]\n\thooksPath = .githooks\n")
    monkeypatch.setattr(sandbox_git, "SYSTEM_CONFIG", config)
    return config


def _repository(tmp_path: Path, system: Path) -> tuple[Path, Path]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q", system=system)
    (workspace / ".githooks").mkdir()
    hook = workspace / ".githooks" / "pre-commit"
    hook.write_text(PERSON)
    hook.chmod(0o755)
    return workspace, hook


def _write(workspace: Path, relative: str) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="w", timeout=30, output_limit=4000)
    try:
        return str(WRITE_FILE.execute(ctx, {"path": relative, "content": AGENT}))
    except ToolError as refused:
        return f"refused: {refused}"


def test_an_unapproved_write_of_a_system_configured_hook_is_refused(
    tmp_path: Path, system: Path
) -> None:
    workspace, hook = _repository(tmp_path, system)
    assert "person-gate" in _git(workspace, "commit", "--allow-empty", "-qm", "x", system=system)
    assert sandbox_git.hook_paths(workspace) == [".githooks"]
    said = _write(workspace, ".githooks/pre-commit")
    assert said.startswith("refused: '.githooks/pre-commit' is a git hook"), said
    assert hook.read_text() == PERSON
    out = _git(workspace, "commit", "--allow-empty", "-qm", "y", system=system)
    assert "agent-ran" not in out and "person-gate" in out, out
    assert _write(workspace, "src.txt").startswith("Wrote"), "other files are written"


def test_a_repositorys_own_hooks_path_is_the_one_taken(tmp_path: Path, system: Path) -> None:
    workspace, _hook = _repository(tmp_path, system)
    (workspace / "hooks-of-its-own").mkdir()
    _git(workspace, "config", "core.hooksPath", "hooks-of-its-own", system=system)
    assert sandbox_git.hook_paths(workspace) == ["hooks-of-its-own"]


def test_a_sandboxed_command_cannot_plant_a_system_configured_hook(
    tmp_path: Path, system: Path, settings: Any
) -> None:
    workspace, hook = _repository(tmp_path, system)
    out = _plant(settings, workspace, tmp_path)
    assert hook.read_text() == PERSON, out
    assert "Read-only file system" in out, out


def _plant(settings: Any, workspace: Path, owned: Path) -> str:
    """What a sandboxed command writing `.githooks/pre-commit` in `workspace` says (the
    files under `owned` given to the sandbox user first)."""
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    subprocess.run(["chown", "-R", "65534:65534", str(owned)], check=False)
    ctx = ExecutionContext(workspace=workspace, call_id="c", timeout=30, output_limit=4000)
    script = f"printf '{AGENT}' > .githooks/pre-commit; echo done"
    try:
        return str(RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", script]}))
    except ToolError as refused:
        return f"refused: {refused}"


def _linked_worktree(tmp_path: Path, system: Path) -> tuple[Path, Path]:
    """A workspace that is a linked worktree of a repository outside it (its `.git` a
    file naming `main/.git/worktrees/ws`), with the person's `.githooks/pre-commit`."""
    main = tmp_path / "main"
    main.mkdir()
    _git(main, "init", "-q", system=system)
    _git(main, "commit", "--allow-empty", "-qm", "init", system=system)
    workspace = tmp_path / "ws"
    _git(main, "worktree", "add", "-q", str(workspace), system=system)
    assert (workspace / ".git").is_file()
    (workspace / ".githooks").mkdir()
    hook = workspace / ".githooks" / "pre-commit"
    hook.write_text(PERSON)
    hook.chmod(0o755)
    return workspace, hook


def test_a_linked_worktrees_system_configured_hook_is_refused(tmp_path: Path, system: Path) -> None:
    # (last stop's fix read /etc/gitconfig's value only beside a configuration inside
    # the workspace: a linked worktree has none there, its configuration is the main
    # repository's, outside, and `.githooks/` was bound by nothing)
    workspace, hook = _linked_worktree(tmp_path, system)
    assert "person-gate" in _git(workspace, "commit", "--allow-empty", "-qm", "x", system=system)
    assert sandbox_git.hook_paths(workspace) == [".githooks"]
    said = _write(workspace, ".githooks/pre-commit")
    assert said.startswith("refused: '.githooks/pre-commit' is a git hook"), said
    assert hook.read_text() == PERSON
    assert _write(workspace, "src.txt").startswith("Wrote"), "other files are written"


def test_a_linked_worktrees_own_hooks_path_is_the_one_taken(tmp_path: Path, system: Path) -> None:
    workspace, _hook = _linked_worktree(tmp_path, system)
    (workspace / "hooks-of-its-own").mkdir()
    _git(tmp_path / "main", "config", "core.hooksPath", "hooks-of-its-own", system=system)
    assert sandbox_git.hook_paths(workspace) == ["hooks-of-its-own"]


def test_a_sandboxed_command_cannot_plant_a_linked_worktrees_system_configured_hook(
    tmp_path: Path, system: Path, settings: Any
) -> None:
    workspace, hook = _linked_worktree(tmp_path, system)
    out = _plant(settings, workspace, workspace)
    assert hook.read_text() == PERSON, out
    assert "Read-only file system" in out, out
