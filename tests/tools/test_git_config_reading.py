"""The file tools' git check reads each configuration by git once per content
(sandbox_git._configuration's memo), and a changed configuration at once.

An approved write_file's check in the worker (`write_file.changed_since`: the path may have
become git metadata since the ask) and every unapproved write's refusal ask
`sandbox_git.hook_paths`, which had git read the host's `/etc/gitconfig` twice and the
repository's `config` once, a subprocess each: 13-15 ms of the 21 ms from a reviewer's
approval to the agent's answer (docs/benchmarks.md, S5). git's reading is a function of
the bytes alone, so it is kept by their digest; what changes the bytes is read again."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tracemalloc
import uuid
from pathlib import Path

import pytest

from dispatcher.tools import sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.write_file import TOOL as WRITE_FILE

PERSON = "#!/bin/sh\necho person-gate\n"


@pytest.fixture
def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `git` first on PATH that notes each configuration git is asked to read, then
    runs the real git: the log of the readings."""
    real = shutil.which("git")
    assert real is not None
    shim, log = tmp_path / "shim", tmp_path / "readings.log"
    shim.mkdir()
    script = shim / "git"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(0o755)
    log.write_text("")
    monkeypatch.setenv("PATH", f"{shim}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return log


def _count(log: Path) -> int:
    return sum("config --file -" in line for line in log.read_text().splitlines())


def _repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository whose configuration, and the host's, no other test has (its own
    comment line): their first reading here is git's."""
    system = tmp_path / "gitconfig"
    system.write_text(f"# {uuid.uuid4()}\n[user]\n\tname = Host\n")
    monkeypatch.setattr(sandbox_git, "SYSTEM_CONFIG", system)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    subprocess.run(
        ["git", "init", "-q", str(workspace)],
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    config = workspace / ".git" / "config"
    config.write_text(config.read_text() + f"# {uuid.uuid4()}\n")
    (workspace / ".githooks").mkdir()
    (workspace / ".githooks" / "pre-commit").write_text(PERSON)
    return workspace


def _write(workspace: Path, relative: str) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="w", timeout=30, output_limit=4000)
    try:
        return str(WRITE_FILE.execute(ctx, {"path": relative, "content": "agent\n"}))
    except ToolError as refused:
        return f"refused: {refused}"


def test_a_configuration_read_again_runs_no_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: Path
) -> None:
    workspace = _repository(tmp_path, monkeypatch)
    assert sandbox_git.hook_paths(workspace) == []
    first = _count(readings)
    assert first >= 2, readings.read_text()  # (the host's and the repository's, by git)
    for _ in range(3):
        assert sandbox_git.hook_paths(workspace) == []
    assert _count(readings) == first, readings.read_text()


def test_a_changed_configuration_is_read_again_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: Path
) -> None:
    workspace = _repository(tmp_path, monkeypatch)
    assert sandbox_git.hook_paths(workspace) == []
    assert _write(workspace, ".githooks/pre-commit").startswith("Wrote")
    (workspace / ".githooks" / "pre-commit").write_text(PERSON)
    config = workspace / ".git" / "config"
    config.write_text(config.read_text() + "[core]\n\thooksPath = .githooks\n")
    before = _count(readings)
    assert sandbox_git.hook_paths(workspace) == [".githooks"]
    assert _count(readings) > before  # (the new bytes, read by git)
    said = _write(workspace, ".githooks/pre-commit")
    assert said.startswith("refused: '.githooks/pre-commit' is a git hook"), said
    assert (workspace / ".githooks" / "pre-commit").read_text() == PERSON


def test_a_configuration_git_cannot_read_is_refused_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readings: Path
) -> None:
    workspace = _repository(tmp_path, monkeypatch)
    config = workspace / ".git" / "config"
    config.write_text(config.read_text() + "[core\n")  # (git refuses this file)
    for _ in range(2):
        before = _count(readings)
        why = sandbox_git.hook_paths(workspace)
        assert isinstance(why, str) and "could not be read" in why, why
        assert _count(readings) > before  # (asked again: a failure is never kept)


def test_a_configuration_git_reads_as_much_more_is_not_kept_in_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # git repeats a section's name in each of its keys: a 63 KiB `config` of a 1000-letter
    # section and 31 K lines `a` reads as 31 M characters of keys. The memo kept that
    # reading, 64 of them in a worker (up to 512 MiB each): what the worker holds after the
    # check is what it held before it, and the reading is as right.
    workspace = _repository(tmp_path, monkeypatch)
    config = workspace / ".git" / "config"
    name = "s" * 1000
    lines = (60 << 10) // 2
    config.write_text(
        f"{config.read_text()}[{name}]\n{'a\n' * lines}[core]\n\thooksPath = .githooks\n"
    )
    assert len(config.read_bytes()) <= 64 << 10
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(2):
            assert sandbox_git.hook_paths(workspace) == [".githooks"]
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 4 << 20, f"{held >> 20} MiB held after the check"
    said = _write(workspace, ".githooks/pre-commit")
    assert said.startswith("refused: '.githooks/pre-commit' is a git hook"), said
