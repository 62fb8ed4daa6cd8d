"""Red team (rt7): what the git-metadata guard (dispatcher.tools.sandbox_git) still left.

1. The index stayed writable, and git reads an index without checking its paths: one an
   unapproved command crafted with the entry `.git/hooks/post-commit` (or
   `../escape`) had a person's `git checkout -- .` or `git restore .` on the host write
   that file into the git directory (or outside the work tree), and their next commit ran
   it. An index the run changed is now read by git after it, and removed when it names a
   path git itself refuses.

Real sandbox (bwrap), real worker, real host git."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import Status
from dispatcher.policy import profiles
from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import (
    FSMONITOR_EDIT,
    agent_in_sandbox,
    allow,
    host_git,
    repository,
    submit,
)
from tests.redteam.test_git_metadata_guard2 import empty_workspace, plant_program, sandboxed
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def crafted_index(git_dir: Path, paths: list[str], mark: Path) -> bytes:
    """An index (version 2) whose entries name `paths`, each an executable script that
    touches `mark`: what git's own `update-index` refuses to write."""
    script = f"#!/bin/sh\ntouch {mark}\n"
    blob = subprocess.run(
        ["git", f"--git-dir={git_dir}", "hash-object", "-w", "--stdin"],
        input=script,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    entries = b""
    for path in sorted(paths):
        name = path.encode()
        entry = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100755, 0, 0, len(script))
        entry += bytes.fromhex(blob) + struct.pack(">H", len(name)) + name
        entries += entry + b"\0" * (8 - len(entry) % 8)
    data = b"DIRC" + struct.pack(">II", 2, len(paths)) + entries
    return data + hashlib.sha1(data, usedforsecurity=False).digest()  # git's checksum


def test_a_crafted_index_is_removed_before_a_persons_checkout_writes_it(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    escape = f"rt7-escape-{secrets.token_hex(4)}"
    mark = workspace / "hook-ran"
    paths = [".git/hooks/post-commit", f"../{escape}"]
    (workspace / "crafted").write_bytes(crafted_index(workspace / ".git", paths, mark))
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    output = sandboxed(workspace, "cp crafted .git/index && echo done")
    assert output.startswith("exit code 0\ndone"), output
    # the person discards changes and commits: nothing is written, nothing runs
    host_git(workspace, "checkout", "--", ".")
    host_git(workspace, "restore", ".")
    host_git(workspace, "commit", "--allow-empty", "-qm", "next")
    try:
        assert not (workspace / ".git" / "hooks" / "post-commit").exists()
        assert not mark.exists()
        assert not (workspace.parent / escape).exists()
    finally:
        (workspace.parent / escape).unlink(missing_ok=True)
    assert "left the git index '.git/index' naming" in output, output
    assert "it was removed" in output
    assert "next" in host_git(workspace, "log", "--format=%s")


def test_an_index_git_add_writes_stays(agent_in_sandbox: AgentFixture) -> None:
    """`git add` and `git rm --cached` change the index: it is read, and kept."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    (workspace / "a.txt").write_text("one\n")
    (workspace / "b").mkdir()
    (workspace / "b" / "c.txt").write_text("two\n")
    sandbox.give_to_sandbox(workspace)
    output = sandboxed(workspace, "git add a.txt b && git rm -q --cached b/c.txt && echo done")
    assert output.startswith("exit code 0\ndone") and "[harness:" not in output, output
    assert host_git(workspace, "ls-files").split() == ["a.txt"]


def test_a_crafted_index_in_a_nested_or_made_repository_goes_too(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    _, workspace = empty_workspace(fx)
    sub = workspace / "sub"
    sub.mkdir()
    host_git(sub, "init", "-q")
    mark = workspace / "hook-ran"
    crafted = crafted_index(sub / ".git", ["x/../.git/hooks/post-commit"], mark)
    (workspace / "crafted").write_bytes(crafted)
    sandbox.give_to_sandbox(workspace)
    script = "cp crafted sub/.git/index && git init -q new && cp crafted new/.git/index"
    output = sandboxed(workspace, script + " && echo done")
    assert output.startswith("exit code 0\ndone"), output
    for place in (sub, workspace / "new"):
        host_git(place, "checkout", "--", ".")
        host_git(place, "-c", "user.email=a@b", "-c", "user.name=A", "commit", "-qm", "x")
        assert not mark.exists(), place
    assert "left the git index 'sub/.git/index' naming" in output, output
    assert "made the git directory 'new/.git', which holds an index naming" in output
    assert not (workspace / "new" / ".git").exists()


HOOK = "printf '#!/bin/sh\\ntouch {mark}\\n' > {hooks}/pre-commit && chmod +x {hooks}/pre-commit"


def test_a_deep_tree_hides_no_git_directory_the_command_made(
    agent_in_sandbox: AgentFixture,
) -> None:
    """The search after a run stopped past 128 levels, and the call ended with the
    `.git` it made (a hook planted) left in place: a person's commit there ran it. The
    walk has no bound on depth now; a workspace that deep also runs commands again."""
    _, workspace = empty_workspace(agent_in_sandbox)
    mark = workspace / "hook-ran"
    deep = "/".join(["d"] * 200)
    plant = "git init -q sub && " + HOOK.format(mark=mark, hooks="sub/.git/hooks")
    try:
        output = sandboxed(workspace, f"mkdir -p {deep} && {plant} && echo done")
    except ToolError as error:  # (before: "could not be searched afterwards")
        output = str(error)
    host_git(workspace / "sub", "-c", "user.email=a@b", "-c", "user.name=A", "commit", "-qm", "x")
    assert not mark.exists(), output
    assert output.startswith("exit code 0\ndone"), output
    assert "made the git directory 'sub/.git'" in output and "'hooks/pre-commit'" in output
    assert sandboxed(workspace, f"ls {deep} && echo ok").startswith("exit code 0\nok")


def test_many_entries_hide_no_git_directory_the_command_made(
    agent_in_sandbox: AgentFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_WALK_AFTER entries (1,000,000: 34 s of `open` here, within a call's 60)
    the search after a run stopped, and kept the planted `.git`: there is no bound now
    (listing an entry costs a small part of making it). The bound before a run stays (it
    refuses, and nothing runs)."""
    assert sandbox_git.MAX_WALK_AFTER is None
    monkeypatch.setattr(sandbox_git, "MAX_WALK", 100)
    _, workspace = empty_workspace(agent_in_sandbox)
    mark = workspace / "hook-ran"
    plant = "git init -q sub && " + HOOK.format(mark=mark, hooks="sub/.git/hooks")
    output = sandboxed(
        workspace, f"mkdir many && touch $(seq -f many/%g 300) && {plant} && echo done"
    )
    assert output.startswith("exit code 0\ndone"), output
    assert "made the git directory 'sub/.git'" in output, output
    assert not (workspace / "sub" / ".git").exists()
    with pytest.raises(ToolError, match="more than 100 entries"):
        sandboxed(workspace, "echo ran")


@pytest.mark.parametrize(
    ("key", "value", "program", "person"),
    [
        (
            "tar.tgz.command",
            "./gz.sh",
            "gz.sh",
            ["archive", "--format=tgz", "-o", "/dev/null", "HEAD"],
        ),
        ("diff.tool", "../" * 24 + "WORKSPACE/tool.sh", "tool.sh", ["difftool", "-y", "HEAD"]),
    ],
    ids=["archive-compressor", "difftool-name"],
)
def test_more_command_settings_that_run_a_program_of_the_workspace(
    agent_in_sandbox: AgentFixture, key: str, value: str, program: str, person: list[str]
) -> None:
    """`tar.<format>.command` (git archive's compressor) and a diff tool's name (git's
    mergetools source `$(git --exec-path)/mergetools/NAME`: `../../ws/tool.sh`) were
    not among the command-valued keys: an allowed `cp` rewrote what they name, and a
    person's `git archive` or `git difftool` ran it."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    (workspace / "a.txt").write_text("one\n")
    host_git(workspace, "add", "a.txt")
    host_git(workspace, "commit", "-qm", "base")
    (workspace / "a.txt").write_text("two\n")
    host_git(workspace, "config", key, value.replace("WORKSPACE", str(workspace).lstrip("/")))
    plant_program(workspace, "program")
    # (sourced by the difftool's shell: no `cat` of its input)
    (workspace / "evil.sh").write_text(f"#!/bin/sh\ntouch {workspace}/program-ran\n")
    call = submit(fx, session_id, "plant", ["cp", "evil.sh", program])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert not (workspace / program).exists(), call.content  # nothing ran
    assert f"sets {key} = " in call.content and "A reviewer must approve" in call.content
    # the premise: what the copy would have put there, the person's git runs
    shutil.copy(workspace / "evil.sh", workspace / program)
    person_git(workspace, *person)
    assert (workspace / "program-ran").exists()


def person_git(workspace: Path, *args: str) -> None:
    """host_git with no input (a difftool that finds no tool asks on it)."""
    subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=workspace,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )


def submodule(workspace: Path, name: str) -> Path:
    """A submodule at `name` (named so), its git directory absorbed: `.git/modules/NAME`."""
    g = ["-c", "user.email=a@b", "-c", "user.name=A", "-c", "protocol.file.allow=always"]
    path = workspace / name
    path.mkdir()
    host_git(path, "init", "-q", "-b", "main")
    (path / "f").write_text("base\n")
    host_git(path, *g, "add", "f")
    host_git(path, *g, "commit", "-qm", "base")
    host_git(workspace, *g, "submodule", "add", "-q", f"./{name}", name)
    host_git(workspace, *g, "submodule", "absorbgitdirs")
    assert (workspace / ".git" / "modules" / name / "HEAD").exists()
    return path


@pytest.mark.parametrize("name", ["hooks", "refs", "logs"])
def test_a_submodule_named_as_a_git_directory_s_own_is_guarded(
    agent_in_sandbox: AgentFixture, name: str
) -> None:
    """`.git/modules/hooks` (a submodule named `hooks`, as a shared hooks repository
    often is) was skipped as if it were a git directory's own `hooks/`: nothing of it was
    bound, the link trick planted core.fsmonitor in its config, and a person's `git
    status` in the submodule ran it."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    path = submodule(workspace, name)
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to(f"../.git/modules/{name}")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    config = (workspace / ".git" / "modules" / name / "config").read_bytes()
    hook = workspace / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {workspace}/hook-ran\n")
    hook.chmod(0o755)
    # not checked out (`deinit` keeps the git directory; a person's `update --init` uses
    # it, and checks the submodule out), then checked out
    host_git(workspace, "submodule", "deinit", "-f", name)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    for checked_out in (False, True):
        plant = f"cp -r tpl out && sed -i '{FSMONITOR_EDIT}' out/meta/config"
        output = sandboxed(workspace, f"{plant}; cp post-checkout out/meta/hooks/; rm -rf out")
        host_git(workspace, "-c", "protocol.file.allow=always", "submodule", "update", "--init")
        host_git(path, "status")
        host_git(workspace, "status")
        ran = [mark.name for mark in workspace.rglob("*-ran")]
        assert ran == [], (checked_out, ran, output)
        assert (workspace / ".git" / "modules" / name / "config").read_bytes() == config
        assert "Device or resource busy" in output or "Read-only" in output, output


def test_an_effect_rule_never_writes_a_submodule_named_as_a_git_directory_s_own() -> None:
    for path in (".git/modules/refs/config", ".git/modules/logs/hooks/pre-commit"):
        assert sandbox_git.guarded_path(path), path
    assert not sandbox_git.guarded_path(".git/refs/heads/main")
    assert not sandbox_git.guarded_path(".git/modules/lib/logs/HEAD")


def test_a_rebase_stopped_in_a_submodule_keeps_its_state_and_autostash(
    agent_in_sandbox: AgentFixture,
) -> None:
    """An allowed `git rebase --autostash` in a submodule that stopped on a conflict: its
    `rebase-merge/` (a directory new in `.git/modules/lib`) was removed as a git
    directory no one judged, and with it the autostash: the person's uncommitted change
    was gone, and `git rebase --abort` found no rebase."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    lib = submodule(workspace, "lib")
    g = ["-c", "user.email=a@b", "-c", "user.name=A"]
    host_git(lib, *g, "checkout", "-qb", "other")
    (lib / "f").write_text("other\n")
    host_git(lib, *g, "commit", "-qam", "other")
    host_git(lib, *g, "checkout", "-q", "main")
    (lib / "f").write_text("mine\n")
    host_git(lib, *g, "commit", "-qam", "mine")
    (lib / "g").write_text("committed\n")
    host_git(lib, *g, "add", "g")
    host_git(lib, *g, "commit", "-qm", "g")
    (lib / "g").write_text("uncommitted work\n")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    rebase = "cd lib && git -c user.email=a@b -c user.name=A rebase --autostash other"
    output = sandboxed(workspace, rebase)
    assert "CONFLICT" in output and "Created autostash" in output, output
    host_git(lib, "rebase", "--abort")
    assert (lib / "g").read_text() == "uncommitted work\n", output
    assert "[harness:" not in output, output


def test_an_effect_rule_does_not_apply_a_crafted_index(
    agent_in_sandbox: AgentFixture, settings: Any
) -> None:
    """An effect rule's write is Harness's own (preview_apply), outside the sandbox and
    its check of the index: `effect(write: **)` applied an index crafted with
    `.git/hooks/post-commit`, written through a link the same command made. The ask
    stands; a person's checkout and commit run nothing."""
    fx = agent_in_sandbox
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = 5
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=["effect(write: **, network: none)"],
        ask=[],
        deny=[],
        actor="test",
    )
    session_id, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    mark = workspace / "hook-ran"
    crafted = crafted_index(workspace / ".git", [".git/hooks/post-commit"], mark)
    (workspace / "crafted").write_bytes(crafted)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = "ln -s .git meta && cp crafted meta/index && rm meta"
    call = submit(fx, session_id, "plant", ["bash", "-c", script])
    if call.status == Status.QUEUED:
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
    host_git(workspace, "checkout", "--", ".")
    host_git(workspace, "commit", "--allow-empty", "-qm", "next")
    assert not mark.exists(), (call.status, call.decided_by)
    assert (workspace / ".git" / "index").read_bytes() != crafted
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by)


def test_a_submodule_s_relative_hooks_path_is_judged_from_its_work_tree(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`core.hooksPath = ../githooks` in `.git/modules/lib/config` was taken relative to
    the workspace (outside it), but git runs the submodule's hooks in `lib/`: it is
    `githooks/` of the workspace, which an allowed `cp` filled; a person's commit in the
    submodule ran it."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    lib = submodule(workspace, "lib")
    host_git(lib, "config", "core.hooksPath", "../githooks")
    (workspace / "githooks").mkdir()
    (workspace / "pre-commit").write_text(f"#!/bin/sh\ntouch {workspace}/hook-ran\n")
    (workspace / "pre-commit").chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    call = submit(fx, session_id, "plant", ["cp", "pre-commit", "githooks/pre-commit"])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    host_git(
        lib, "-c", "user.email=a@b", "-c", "user.name=A", "commit", "--allow-empty", "-qm", "x"
    )
    assert not (workspace / "hook-ran").exists(), call.content
    assert "sets core.hookspath = '../githooks'" in call.content, call.content
    assert "A reviewer must approve this command" in call.content


def test_a_git_file_naming_a_tilde_path_is_judged_as_git_reads_it(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`sub/.git` holding `gitdir: ~/gd`: git takes it relative (`sub/~/gd`, in the
    workspace, bound by nothing); the guard expanded `~` to its own home, outside."""
    _, workspace = empty_workspace(agent_in_sandbox)
    sub = workspace / "sub"
    (sub / "~").mkdir(parents=True)
    host_git(sub / "~", "init", "-q", "--bare", "gd")
    (sub / ".git").write_text("gitdir: ~/gd\n")
    assert host_git(sub, "rev-parse", "--git-dir").strip() == str(sub / "~" / "gd")
    sandbox.give_to_sandbox(workspace)
    with pytest.raises(ToolError, match="'sub/.git' is a file naming a git directory inside"):
        sandboxed(
            workspace,
            f"printf '[core]\\n\\tfsmonitor = touch {workspace}/x-ran\\n' >> sub/~/gd/config",
        )
    host_git(sub, "status")
    assert not (workspace / "x-ran").exists()


def test_a_submodule_eight_levels_deep_is_guarded(agent_in_sandbox: AgentFixture) -> None:
    """The walk of `.git/modules` stopped at 8 levels: the git directory of a submodule
    at `a/b/c/d/e/f/g/h` (`.git/modules/a/.../h`, 9 levels) was bound by nothing, the
    link trick planted core.fsmonitor in its config, and a person's `git status` ran it."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    name = "a/b/c/d/e/f/g/h"
    (workspace / name).parent.mkdir(parents=True)
    path = submodule(workspace, name)
    git_dir = workspace / ".git" / "modules" / name
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to(f"../.git/modules/{name}")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    config = (git_dir / "config").read_bytes()
    for checked_out in (False, True):  # (`deinit` keeps the git directory)
        if not checked_out:
            host_git(workspace, "submodule", "deinit", "-f", name)
            os.chown(workspace, 0, 0)
            sandbox.give_to_sandbox(workspace)
        plant = f"cp -r tpl out && sed -i '{FSMONITOR_EDIT}' out/meta/config; rm -rf out"
        output = sandboxed(workspace, plant)
        host_git(workspace, "-c", "protocol.file.allow=always", "submodule", "update", "--init")
        host_git(path, "status")
        assert not list(workspace.rglob("fsmonitor-ran")), output
        assert (git_dir / "config").read_bytes() == config
        assert "Device or resource busy" in output, output
