"""Red team (gitg): what the git-metadata guard (dispatcher.tools.sandbox_git) left open.

1. A workspace with no `.git`: an unapproved command ran `git init` and wrote
   `.git/config` with core.fsmonitor (or a hook) through a link, and a person's `git
   status` on the host ran it. A git directory a command no person approved made is now
   judged after the run, and removed unless it holds only what git itself makes.
2. Repositories nested in the workspace (`sub/.git`): nothing of theirs was bound, and
   one a command made was not looked at.
3. A configuration whose command-valued keys name a program of the workspace
   (`filter.x.clean = ./clean.sh`, `core.fsmonitor = ./fsmon`, `alias.t = !./t`): the
   command rewrote the program, and the person's git ran it.

Real decisions (admission), the real worker, the real bwrap sandbox and git."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import AgentSession, Status
from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from tests.approvals.conftest import start_session
from tests.redteam.test_git_metadata_guard import (
    FSMONITOR_EDIT,
    agent_in_sandbox,
    allow,
    host_git,
    repository,
    run_allowed,
    submit,
)
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

EVIL_CONFIG = (
    "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
    '\tfsmonitor = "touch fsmonitor-ran; true"\n'
)


def empty_workspace(fx: AgentFixture) -> tuple[str, Path]:
    session_id = start_session(fx)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    assert not (workspace / ".git").exists()
    return session_id, workspace


def sandboxed(workspace: Path, script: str) -> str:
    """`bash -c script` run as a command no person approved (the guard's ALL)."""
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=30, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]}))


def test_git_init_and_a_planted_fsmonitor_in_a_workspace_without_git_are_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git *` and `cp *` allow `git init` and a copy through a link (`tpl/meta ->
    ../.git`, dangling until the init) onto `.git/config`; a person's `git status` ran
    the fsmonitor it planted."""
    fx = agent_in_sandbox
    allow(fx, "git *", "cp *", "echo *")
    session_id, workspace = empty_workspace(fx)
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to("../.git")
    (workspace / "evil.gitconfig").write_text(EVIL_CONFIG)
    sandbox.give_to_sandbox(workspace)
    script = "git init -q && cp -r tpl out && cp evil.gitconfig out/meta/config && echo done"
    call = run_allowed(fx, session_id, "plant", ["bash", "-c", script])
    assert call.content.startswith("exit code 0\ndone"), call.content
    assert "made the git directory '.git'" in call.content, call.content
    assert "core.fsmonitor" in call.content and "it was removed" in call.content
    assert not (workspace / ".git").exists()
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


def test_a_plain_git_init_add_and_commit_allowed_by_a_rule_still_work(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    allow(fx, "git *")
    session_id, workspace = empty_workspace(fx)
    (workspace / "a.txt").write_text("one\n")
    outputs = [
        run_allowed(fx, session_id, name, argv).content
        for name, argv in [
            ("init", ["git", "init", "-q"]),
            ("email", ["git", "config", "user.email", "a@example.org"]),
            ("name", ["git", "config", "user.name", "A"]),
            ("add", ["git", "add", "a.txt"]),
            ("commit", ["git", "commit", "-qm", "first"]),
            ("branch", ["git", "checkout", "-qb", "feature"]),
        ]
    ]
    for output in outputs:
        assert output.startswith("exit code 0") and "[harness:" not in output, output
    assert host_git(workspace, "log", "--format=%s").strip() == "first"
    assert host_git(workspace, "branch", "--show-current").strip() == "feature"


HOOK = "printf '#!/bin/sh\\ntouch hook-ran\\n' > {hooks}/pre-commit && chmod +x {hooks}/pre-commit"


@pytest.mark.parametrize(
    ("script", "where", "why"),
    [
        (
            "git init -q && printf '[core]\\n\\tfsmonitor = touch fsmonitor-ran\\n' >> .git/config",
            ".git",
            "sets core.fsmonitor = 'touch fsmonitor-ran'",
        ),
        ("git init -q && " + HOOK.format(hooks=".git/hooks"), ".git", "'hooks/pre-commit'"),
        (
            "git init -q && echo '* filter=x' > .git/info/attributes",
            ".git",
            "'info/attributes'",
        ),
        (
            "git init -q && echo ../elsewhere > .git/commondir",
            ".git",
            "holds 'commondir'",
        ),
        (
            "git init -q gd && mv gd/.git real && echo 'gitdir: real' > .git",
            ".git",
            "is a '.git' file",
        ),
        ("git init -q real && ln -s real/.git .git", ".git", "is a symbolic link"),
        (
            "mkdir -p a/b && git -C a/b init -q && " + HOOK.format(hooks="a/b/.git/hooks"),
            "a/b/.git",
            "'hooks/pre-commit'",
        ),
    ],
    ids=["fsmonitor", "hook", "attributes", "commondir", "git-file", "git-link", "nested"],
)
def test_a_git_directory_the_command_made_that_runs_programs_is_removed(
    agent_in_sandbox: AgentFixture, script: str, where: str, why: str
) -> None:
    """Each made in one command no person approved; each removed, and said why. A person's
    `git status` and `git commit` there (in the directory it was made in) run nothing."""
    fx = agent_in_sandbox
    _, workspace = empty_workspace(fx)
    output = sandboxed(workspace, script + " && echo done")
    assert output.startswith("exit code 0\ndone"), output
    assert f"made the git directory '{where}'" in output and why in output, output
    assert "it was removed" in output
    assert not os.path.lexists(workspace / where)
    place = (workspace / where).parent
    host_git(place, "status")
    host_git(place, "commit", "--allow-empty", "-qm", "x")
    ran = [path.name for path in workspace.rglob("*-ran")]
    assert ran == [], ran


def test_a_nested_repository_that_existed_is_bound_read_only(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`sub/.git` (a repository nested in the workspace's files) was not bound: the link
    trick planted core.fsmonitor in `sub/.git/config`, which a person's `git status` in
    `sub` ran. Its hooks are read-only too, and it cannot be moved aside."""
    fx = agent_in_sandbox
    allow(fx, "cp *", "sed *")
    session_id, workspace = repository(fx)
    sub = workspace / "vendor" / "sub"
    sub.mkdir(parents=True)
    host_git(sub, "init", "-q")
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to("../vendor/sub/.git")
    os.chown(workspace, 0, 0)  # given again to the sandbox user
    sandbox.give_to_sandbox(workspace)
    config = (sub / ".git" / "config").read_bytes()
    plant = f"cp -r tpl out && sed -i '{FSMONITOR_EDIT}' out/meta/config"
    call = run_allowed(fx, session_id, "plant", ["bash", "-c", plant])
    assert "Device or resource busy" in call.content, call.content
    assert "ran without a person's approval" in call.content
    assert (sub / ".git" / "config").read_bytes() == config
    for trick in [
        HOOK.format(hooks="vendor/sub/.git/hooks"),
        "mv vendor/sub/.git vendor/sub/g2",
        "mv vendor/sub/.git/hooks h2",
    ]:
        output = sandboxed(workspace, trick)
        assert not output.startswith("exit code 0"), (trick, output)
    host_git(sub, "status")
    host_git(sub, "commit", "--allow-empty", "-qm", "x")
    assert not (sub / "fsmonitor-ran").exists() and not (sub / "hook-ran").exists()


def test_a_nested_repository_moved_with_its_directory_is_kept(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A nested `.git` that was there is no new one where the command moves it (with its
    directory): a person's settings in it (not what `git init` writes) stay, and a new
    one with a hook made where it was is removed."""
    fx = agent_in_sandbox
    _, workspace = empty_workspace(fx)
    sub = workspace / "sub"
    sub.mkdir()
    host_git(sub, "init", "-q")
    host_git(sub, "config", "core.autocrlf", "input")
    sandbox.give_to_sandbox(workspace)
    script = "mv sub moved && mkdir sub && git -C sub init -q && " + HOOK.format(
        hooks="sub/.git/hooks"
    )
    output = sandboxed(workspace, script + " && echo done")
    assert output.startswith("exit code 0\ndone"), output
    assert "made the git directory 'sub/.git'" in output, output
    assert "moved/.git" not in output
    assert host_git(workspace / "moved", "config", "core.autocrlf").strip() == "input"
    assert not (workspace / "sub" / ".git").exists()


def test_a_nested_git_file_naming_an_unguarded_git_directory_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`lib/.git` naming `gd` in the work tree: `gd/config` is no git directory anything
    binds. One naming a guarded submodule git directory (`../.git/modules/lib`) runs."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx, module=True)
    (workspace / "lib").mkdir()
    (workspace / "lib" / ".git").write_text("gitdir: ../.git/modules/lib\n")
    sandbox.give_to_sandbox(workspace)
    assert sandboxed(workspace, "echo ok").startswith("exit code 0\nok")
    host_git(workspace, "init", "-q", "--bare", "gd")
    (workspace / "lib" / ".git").write_text("gitdir: ../gd\n")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    (workspace / "evil.gitconfig").write_text(EVIL_CONFIG)
    call = submit(fx, session_id, "plant", ["cp", "evil.gitconfig", "gd/config"])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert "'lib/.git' is a file naming a git directory inside" in call.content, call.content
    assert "A reviewer must approve this command" in call.content
    host_git(workspace / "lib", "status")
    assert not (workspace / "lib" / "fsmonitor-ran").exists()


def test_a_workspace_too_large_to_search_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search for nested repositories is bounded; past the bound, fail closed."""
    _, workspace = empty_workspace(agent_in_sandbox)
    for index in range(30):
        (workspace / f"f{index}").write_text("x")
    monkeypatch.setattr(sandbox_git, "MAX_WALK", 20)
    with pytest.raises(ToolError, match="more than 20 entries.*A reviewer must approve"):
        sandboxed(workspace, "echo ran")
    fd = sandbox.open_unredirected(workspace)
    try:  # a reviewer's approval (NONE) searches nothing
        sandbox_git.guard(workspace, fd, sandbox_git.NONE).close()
    finally:
        os.close(fd)
    monkeypatch.setattr(sandbox_git, "MAX_WALK", 100)
    monkeypatch.setattr(sandbox_git, "MAX_WALK_AFTER", 100)
    with pytest.raises(ToolError, match="could not be searched afterwards"):
        sandboxed(workspace, "mkdir many && cd many && touch $(seq 200)")


def plant_program(workspace: Path, name: str) -> None:
    """The agent's copy source: a script that leaves a mark where it runs."""
    (workspace / "evil.sh").write_text(f"#!/bin/sh\ntouch {workspace}/{name}-ran\ncat\n")
    (workspace / "evil.sh").chmod(0o755)
    os.chown(workspace, 0, 0)  # given again to the sandbox user at the run


@pytest.mark.parametrize(
    ("pairs", "program", "person"),
    [
        (
            [("filter.x.clean", "./clean.sh"), ("filter.x.smudge", "cat")],
            "clean.sh",
            ["add", "a.txt"],
        ),
        ([("core.fsmonitor", "./fsmon.sh")], "fsmon.sh", ["status"]),
        ([("alias.t", "!./t.sh")], "t.sh", ["t"]),
        ([("diff.x.textconv", "sh conv.sh")], "conv.sh", ["diff", "HEAD", "--", "a.txt"]),
        ([("core.fsmonitor", "tools/fsmon.sh")], "tools/fsmon.sh", ["status"]),
    ],
    ids=["filter", "fsmonitor", "alias", "textconv-interpreter", "fsmonitor-subdir"],
)
def test_a_configuration_that_runs_a_program_of_the_workspace_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture,
    pairs: list[tuple[str, str]],
    program: str,
    person: list[str],
) -> None:
    """`.git/config` was read-only, but the program it names lay in the work tree, which
    an allowed `cp` rewrote; the person's git then ran it."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    (workspace / "a.txt").write_text("one\n")
    (workspace / ".gitattributes").write_text("a.txt filter=x diff=x\n")
    host_git(workspace, "add", "a.txt", ".gitattributes")
    host_git(workspace, "commit", "-qm", "base")
    (workspace / "a.txt").write_text("two\n")
    for key, value in pairs:
        host_git(workspace, "config", key, value)
    plant_program(workspace, "program")
    (workspace / program).parent.mkdir(exist_ok=True)
    call = submit(fx, session_id, "plant", ["cp", "evil.sh", program])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    key, value = pairs[0]
    assert f"sets {key} = {value!r}, a command line that may run a program of the workspace" in (
        call.content
    ), call.content
    assert "A reviewer must approve this command" in call.content
    assert not (workspace / program).exists()
    host_git(workspace, *person)
    assert not (workspace / "program-ran").exists()
    # the premise: what the copy would have put there, the person's git runs (a.txt
    # changed again: `git add` of a file its index entry matches runs no filter)
    (workspace / "a.txt").write_text("three, longer\n")
    shutil.copy(workspace / "evil.sh", workspace / program)
    host_git(workspace, *person)
    assert (workspace / "program-ran").exists()


def test_common_command_settings_still_run(agent_in_sandbox: AgentFixture) -> None:
    """git-lfs's filters, a pager with options, git aliases: nothing of the workspace."""
    fx = agent_in_sandbox
    allow(fx, "git *")
    session_id, workspace = repository(fx)
    for key, value in [
        ("filter.lfs.clean", "git-lfs clean -- %f"),
        ("filter.lfs.smudge", "git-lfs smudge -- %f"),
        ("filter.lfs.process", "git-lfs filter-process"),
        ("filter.lfs.required", "true"),
        ("core.pager", "less -FRX"),
        ("core.editor", "/usr/bin/vim"),
        ("core.fsmonitor", "false"),
        ("alias.lg", "log --oneline --graph"),
        ("alias.last", "!git log -1 HEAD"),
        ("credential.helper", "cache --timeout=3600"),
        ("diff.tool", "vimdiff"),
    ]:
        host_git(workspace, "config", key, value)
    sandbox.give_to_sandbox(workspace)
    call = run_allowed(fx, session_id, "status", ["git", "status", "--short"])
    assert call.content.startswith("exit code 0"), call.content


@pytest.mark.parametrize(
    ("key", "value", "runs"),
    [
        ("filter.lfs.clean", "git-lfs clean -- %f", False),
        ("filter.lfs.process", "git-lfs filter-process", False),
        ("core.pager", "less -R", False),
        ("core.pager", "/usr/bin/less", False),
        ("alias.st", "status -sb", False),
        ("alias.last", "!git log -1 HEAD", False),
        ("credential.helper", "store", False),
        ("submodule.lib.update", "rebase", False),
        ("core.fsmonitor", "true", False),
        ("core.fsmonitor", "./x", True),
        ("core.fsmonitor", "x/y", True),
        ("core.fsmonitor", "sh x", True),
        ("core.fsmonitor", "python3 -m x", True),
        ("core.pager", "less; ./x", True),
        ("core.pager", "$PWD/x", True),
        ("core.editor", "vim -S x", True),
        ("core.sshcommand", "ssh -F cfg", True),
        ("alias.x", "!f() { ./x; }; f", True),
        ("alias.x", "--exec-path=. x", True),
        ("alias.x", "difftool -x ./x", True),
        ("credential.helper", "!./x", True),
        ("merge.x.driver", "~/x %O %A %B", True),
        ("gpg.program", "WORKSPACE/x", True),
        ("remote.origin.uploadpack", "./x", True),
    ],
)
def test_which_command_settings_may_run_a_program_of_the_workspace(
    tmp_path: Path, key: str, value: str, runs: bool
) -> None:
    workspace = tmp_path / "w"
    value = value.replace("WORKSPACE", str(workspace))
    assert sandbox_git._runs_workspace_program(workspace, key, value) is runs


def test_an_effect_rule_never_writes_a_nested_repository_configuration() -> None:
    from dispatcher.policy import effect_rules

    rule = effect_rules.parse("effect(write: **)")

    def effect(path: str, kind: str = "file") -> dict[str, Any]:
        change = {"path": path, "change": "changed", "kind": kind}
        return {"changes": [change], "appliable": True, "network_attempted": False}

    for path in ("sub/.git/config", "a/b/.git/hooks/pre-commit", "sub/.git/modules/x/config"):
        assert not rule.allows(effect(path)), path
    assert not rule.allows(effect("sub/.git"))  # a file `gitdir: ...`
    assert not rule.allows(effect("sub/.git/index"))  # (rt7: a crafted index)
    assert rule.allows(effect("sub/.git/objects/ab/cd")) and rule.allows(effect("sub/config"))


def test_removed_without_following_a_link(agent_in_sandbox: AgentFixture, tmp_path: Path) -> None:
    """A made `.git` that links out of the workspace is unlinked, not emptied."""
    _, workspace = empty_workspace(agent_in_sandbox)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    os.chown(outside, 0, 0)
    output = sandboxed(workspace, f"ln -s {outside} .git && echo done")
    assert "made the git directory '.git'" in output, output
    assert not os.path.lexists(workspace / ".git")
    assert (outside / "keep").read_text() == "x"
    shutil.rmtree(outside)
