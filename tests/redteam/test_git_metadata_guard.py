"""Red team (gitro): a link the command reader cannot see. A link made by the same command,
or by an earlier call of the same message (every call of a message is decided before any
runs), leads an allowed write into `.git`: `cp -r tpl out && sed -i ... out/meta/config`,
with `tpl/meta -> ../.git` from the repository, is allowed by `cp *` and `sed *` and
planted core.fsmonitor, which the next `git status` ran. A command no person approved now
runs with the workspace's git metadata that makes git run programs read-only
(dispatcher.tools.sandbox_git); a reviewer's approval runs as before. Real decisions
(admission), the real worker (execution.execute_call), the real bwrap sandbox and git."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from dispatcher import execution
from dispatcher.models import AgentSession, Status, ToolCall
from dispatcher.policy import profiles
from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.run_command import scrubbed_environment
from tests.approvals.conftest import start_session
from tests.policy.conftest import submit as submit_call
from tests.support.factories import AgentFixture
from tests.tools.support import require_bwrap

pytestmark = pytest.mark.django_db

FSMONITOR_EDIT = "s/bare = false/bare = false\\n\\tfsmonitor = touch fsmonitor-ran/"
PLANT = f"cp -r tpl out && sed -i '{FSMONITOR_EDIT}' out/meta/config"


@pytest.fixture
def agent_in_sandbox(settings: Any, agent: AgentFixture, tmp_path: Path) -> AgentFixture:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = False
    return agent


def allow(fx: AgentFixture, *rules: str) -> None:
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[f"run_command({rule})" for rule in rules],
        ask=[],
        deny=[],
        actor="test",
    )


def repository(fx: AgentFixture, *, module: bool = False) -> tuple[str, Path]:
    session_id = start_session(fx)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    host_git(workspace, "init", "-q")
    host_git(workspace, "config", "user.email", "a@example.org")
    host_git(workspace, "config", "user.name", "A")
    if module:  # a submodule's git directory
        host_git(workspace, "init", "-q", "--bare", ".git/modules/lib")
    sandbox.give_to_sandbox(workspace)
    return session_id, workspace


def host_git(workspace: Path, *args: str) -> str:
    """git as a person runs it on the host, in the workspace."""
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def submit(fx: AgentFixture, session_id: str, call_id: str, argv: list[str]) -> ToolCall:
    return submit_call(fx, session_id, call_id, "run_command", {"argv": argv})


def run_allowed(fx: AgentFixture, session_id: str, call_id: str, argv: list[str]) -> ToolCall:
    """A call a rule allows, run by the worker; the call as it ended."""
    call = submit(fx, session_id, call_id, argv)
    assert call.status == Status.QUEUED, (call.status, call.reason)
    assert call.decided_by.startswith("rule:allow:"), call.decided_by
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED, call.content
    return call


def test_a_link_made_by_the_command_no_longer_plants_git_configuration(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    allow(fx, "cp *", "sed *", "git status")
    session_id, workspace = repository(fx)
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to("../.git")
    config = (workspace / ".git" / "config").read_bytes()

    call = run_allowed(fx, session_id, "plant", ["bash", "-c", PLANT])
    assert (workspace / ".git" / "config").read_bytes() == config
    assert call.content.startswith("exit code 4\n"), call.content  # sed: cannot rename
    assert "Device or resource busy" in call.content
    assert "ran without a person's approval" in call.content
    assert "A command a reviewer approves may change it" in call.content

    # neither the next allowed `git status` nor a person's runs anything
    run_allowed(fx, session_id, "status", ["git", "status"])
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


def test_hooks_and_a_new_commondir_cannot_be_planted_through_a_link(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to("../.git")
    planted = workspace / "planted"
    (planted / "hooks").mkdir(parents=True)
    (planted / "info").mkdir()
    (planted / "hooks" / "pre-commit").write_text("#!/bin/sh\ntouch hook-ran\n")
    (planted / "hooks" / "pre-commit").chmod(0o755)
    (planted / "info" / "attributes").write_text("* filter=x\n")
    (workspace / "elsewhere").mkdir()
    (planted / "commondir").write_text("../elsewhere\n")
    hooks = workspace / ".git" / "hooks"
    for sample in hooks.iterdir():
        sample.unlink()
    hooks.rmdir()  # a repository without hooks/: nothing to bind; made, then removed

    script = "cp -r tpl out && cp -r planted/. out/meta/ && cp -r objects out/meta/modules/lib/"
    call = run_allowed(fx, session_id, "plant", ["bash", "-c", script])
    assert not (workspace / ".git" / "commondir").exists()
    assert not (workspace / ".git" / "hooks").exists()
    assert not (workspace / ".git" / "info" / "attributes").exists()
    assert "'commondir', 'hooks'" in call.content and "it was removed" in call.content
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "hook-ran").exists()
    assert "x" in host_git(workspace, "log", "--format=%s")  # the repository still works


def test_a_reviewer_approved_git_config_still_writes(
    agent_in_sandbox: AgentFixture, reviewer: Any
) -> None:
    fx = agent_in_sandbox
    allow(fx)  # standard mode: run_command asks
    session_id, workspace = repository(fx)
    call = submit(fx, session_id, "cfg", ["git", "config", "core.x", "y"])
    assert call.status == Status.PENDING_APPROVAL
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED and call.content.startswith("exit code 0"), call.content
    assert host_git(workspace, "config", "core.x").strip() == "y"


def test_an_allowed_git_config_of_a_harmless_key_still_writes_and_only_config(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    allow(fx, "git *")
    session_id, workspace = repository(fx)
    call = run_allowed(fx, session_id, "name", ["git", "config", "user.name", "Bob"])
    assert call.content.startswith("exit code 0"), call.content
    assert host_git(workspace, "config", "user.name").strip() == "Bob"
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    host_git(workspace, "branch", "base")
    current = host_git(workspace, "branch", "--show-current").strip()
    call = run_allowed(fx, session_id, "upstream", ["git", "branch", "-u", "base"])
    assert call.content.startswith("exit code 0"), call.content
    assert host_git(workspace, "config", f"branch.{current}.merge").strip() == "refs/heads/base"
    # `git -C . config ...` is not that form: .git/config stays read-only, and it says so
    (workspace / "sub").mkdir()
    call = run_allowed(fx, session_id, "c", ["git", "-C", "sub", "config", "user.name", "Eve"])
    assert "ran without a person's approval" in call.content, call.content
    assert host_git(workspace, "config", "user.name").strip() == "Bob"


def test_git_add_commit_checkout_and_stash_allowed_by_a_rule_still_work(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    allow(fx, "git *")
    session_id, workspace = repository(fx)
    (workspace / "a.txt").write_text("one\n")
    run_allowed(fx, session_id, "add", ["git", "add", "a.txt"])
    call = run_allowed(fx, session_id, "commit", ["git", "commit", "-qm", "first"])
    assert call.content.startswith("exit code 0"), call.content
    call = run_allowed(fx, session_id, "branch", ["git", "checkout", "-qb", "feature"])
    assert call.content.startswith("exit code 0"), call.content
    (workspace / "a.txt").write_text("two\n")
    call = run_allowed(fx, session_id, "stash", ["git", "stash", "-q"])
    assert call.content.startswith("exit code 0"), call.content
    assert host_git(workspace, "log", "--format=%s").strip() == "first"
    assert host_git(workspace, "branch", "--show-current").strip() == "feature"
    assert (workspace / "a.txt").read_text() == "one\n"
    assert "stash@{0}" in host_git(workspace, "stash", "list")


def test_the_program_cannot_move_the_bound_metadata_aside(agent_in_sandbox: AgentFixture) -> None:
    """Each directory from `.git` to a guarded entry is a mount point in the sandbox: the
    program cannot rename `.git` (or `config`, `hooks`) away and make another in its place,
    nor replace one by a rename over it; a submodule's git directory is guarded too."""
    fx = agent_in_sandbox
    allow(fx, "bash *")
    session_id, workspace = repository(fx, module=True)
    module = workspace / ".git" / "modules" / "lib"
    before = {
        path: path.read_bytes() for path in (workspace / ".git" / "config", module / "config")
    }
    tricks = [
        "mv .git .g && mkdir .git && cp -r .g/. .git/",
        "mv .git/config c2",
        "cp .git/config c3 && mv c3 .git/config",
        "mv .git/hooks h2",
        "mv .git/modules m2",
        "mv .git/modules/lib l2",
        "echo '[core] fsmonitor = touch x' >> .git/modules/lib/config",
        "ln -sf /tmp/x .git/config",
    ]
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=30, output_limit=20_000)
    for trick in tricks:
        output = str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", trick]}))
        assert not output.startswith("exit code 0"), (trick, output)
    for path, data in before.items():
        assert path.read_bytes() == data
    assert (workspace / ".git" / "hooks").is_dir()


def test_bwrap_refuses_a_git_directory_swapped_after_it_was_judged(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """The race: `.git` is judged and held by descriptor, then swapped for a symlink to a
    decoy before bwrap binds it. bwrap checks that what lies at the target is the held
    directory, so nothing runs (the decoy would have been guarded, the real one not)."""
    workspace = tmp_path / "workspaces" / "raced"
    workspace.mkdir(parents=True)
    host_git(workspace, "init", "-q")
    sandbox.give_to_sandbox(workspace)
    fd = sandbox.open_unredirected(workspace)
    guard = sandbox_git.guard(workspace, fd, sandbox_git.ALL)
    try:
        (workspace / ".git").rename(workspace / "real")
        (workspace / "decoy").mkdir()
        (workspace / ".git").symlink_to("decoy")
        binds = [sandbox.Bind(workspace, workspace, writable=True, fd=fd)]
        binds += [sandbox.Bind(e.target, e.target, e.writable, fd=e.fd) for e in guard.entries]
        limits = sandbox.Limits(timeout=30, output_chars=2000)
        with sandbox._call_cgroups(limits) as cgroups:
            command = sandbox._limit_command(limits, cgroups) + sandbox.sandbox_command(
                ["sh", "-c", "echo planted >> real/config"],
                binds=binds,
                cwd=workspace,
                limits=limits,
                network=False,
                extras=[],
            )
            done = sandbox._run_process(
                command,
                cwd=workspace,
                env=scrubbed_environment(workspace),
                limits=limits,
                sandboxed=True,
                pass_fds=(fd, *(e.fd for e in guard.entries)),
            )
    finally:
        guard.close()
        os.close(fd)
    assert done.returncode == 1 and "Race condition" in done.output, done.output
    assert "planted" not in (workspace / "real" / "config").read_text()


def test_a_symlinked_hooks_directory_stops_an_unapproved_command(tmp_path: Path) -> None:
    require_bwrap()
    workspace = tmp_path / "w"
    workspace.mkdir()
    host_git(workspace, "init", "-q")
    hooks = workspace / ".git" / "hooks"
    for sample in hooks.iterdir():
        sample.unlink()
    hooks.rmdir()
    (workspace / "githooks").mkdir()
    hooks.symlink_to("../githooks")
    fd = sandbox.open_unredirected(workspace)
    try:
        with pytest.raises(ToolError, match="a reviewer must approve|A reviewer must approve"):
            sandbox_git.guard(workspace, fd, sandbox_git.ALL)
        sandbox_git.guard(workspace, fd, sandbox_git.NONE).close()
    finally:
        os.close(fd)


def test_an_effect_rule_never_allows_writing_the_git_metadata() -> None:
    """A previewed effect applied because an effect rule allows it is a write no person
    approved, made by Harness itself (preview_apply), not in the sandbox: an effect that
    writes what the guard keeps read-only asks."""
    from dispatcher.policy import effect_rules

    rule = effect_rules.parse("effect(write: **)")

    def effect(path: str, kind: str = "file") -> dict[str, Any]:
        change = {"path": path, "change": "changed", "kind": kind}
        return {"changes": [change], "appliable": True, "network_attempted": False}

    for path in (".git/config", ".git/hooks/pre-commit", ".git/modules/a/b/commondir"):
        assert not rule.allows(effect(path)), path
    assert not rule.allows(effect(".git/info", "dir"))
    assert not rule.allows(effect(".git"))  # a file `gitdir: ELSEWHERE`
    for path in (".git/objects/info/packs", ".git/refs/heads/config", "config"):
        assert rule.allows(effect(path)), path
    assert not rule.allows(effect(".git/index"))  # (rt7: a crafted index; Harness applies it)
    assert rule.allows(effect(".git", "dir"))


def test_a_checkout_that_brings_a_link_lets_the_next_call_of_its_message_plant_nothing(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git checkout evil` (a branch holding `meta -> .git`) and `sed -i ... meta/config`,
    sent in one message: both are decided before either runs, when `meta` is no link."""
    fx = agent_in_sandbox
    allow(fx, "git *", "sed *")
    session_id, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    host_git(workspace, "checkout", "-qb", "evil")
    (workspace / "meta").symlink_to(".git")
    host_git(workspace, "add", "meta")
    host_git(workspace, "commit", "-qm", "link")
    host_git(workspace, "checkout", "-q", "-")
    assert not (workspace / "meta").exists()
    sandbox.give_to_sandbox(workspace)
    config = (workspace / ".git" / "config").read_bytes()
    calls = [
        {"id": "co", "name": "run_command", "arguments": {"argv": ["git", "checkout", "evil"]}},
        {
            "id": "sed",
            "name": "run_command",
            "arguments": {"argv": ["sed", "-i", FSMONITOR_EDIT, "meta/config"]},
        },
    ]
    response = Client().post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps({"calls": calls}),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code in (200, 202), response.content
    ids = [call["id"] for call in response.json()["calls"]]
    assert [ToolCall.objects.get(pk=i).status for i in ids] == [Status.QUEUED] * 2
    for call_id in ids:
        execution.execute_call(call_id)
    checkout, sed = (ToolCall.objects.get(pk=i) for i in ids)
    assert checkout.content.startswith("exit code 0"), checkout.content
    assert (workspace / "meta").is_symlink()  # the premise: the link arrived
    assert "ran without a person's approval" in sed.content, sed.content
    assert (workspace / ".git" / "config").read_bytes() == config
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


def test_a_submodule_git_directory_the_command_made_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    """Only the submodules' git directories that existed were bound: `.git/modules/lib`
    made through the link, with `core.fsmonitor` in its config, stayed, and a person's
    `git status` (recursing into the submodule `lib`, whose `.git` file names it) ran it.
    A directory made in `.git/modules` (or `modules` itself, `worktrees/...`) is removed."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    gitlink = "160000,1111111111111111111111111111111111111111,lib"
    host_git(workspace, "update-index", "--add", "--cacheinfo", gitlink)
    host_git(workspace, "commit", "-qm", "submodule lib")
    (workspace / "tpl").mkdir()
    (workspace / "tpl" / "meta").symlink_to("../.git")
    module = workspace / "planted" / "modules" / "lib"
    (module / "refs").mkdir(parents=True)
    # (`objects/` apart: a directory with HEAD, objects/ and refs/ is a git directory to
    # git, and one in the work tree with that config lets no unapproved command run)
    (workspace / "objects").mkdir()
    (module / "HEAD").write_text("ref: refs/heads/main\n")
    (module / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        '\tfsmonitor = "touch ../fsmonitor-ran; true"\n\tworktree = ../../../lib\n'
    )
    (workspace / "lib").mkdir()  # the submodule's work tree, naming its git directory
    (workspace / "lib" / ".git").write_text("gitdir: ../.git/modules/lib\n")
    sandbox.give_to_sandbox(workspace)

    script = "cp -r tpl out && cp -r planted/. out/meta/ && cp -r objects out/meta/modules/lib/"
    call = run_allowed(fx, session_id, "plant", ["bash", "-c", script])
    assert call.content.startswith("exit code 0"), call.content
    assert "'modules'" in call.content and "it was removed" in call.content, call.content
    assert not (workspace / ".git" / "modules").exists()
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


def test_a_new_directory_in_an_existing_modules_directory_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    """With `.git/modules/lib` there (bound), `.git/modules/evil` (a git directory no one
    judged), a link `modules/lnk`, and `modules/lib/modules/x` (a nested submodule's) made
    by the command are removed; git's own `logs/` in a submodule's git directory stays."""
    fx = agent_in_sandbox
    session_id, workspace = repository(fx, module=True)
    script = (
        "mkdir -p .git/modules/evil/hooks .git/modules/lib/modules/x .git/modules/lib/logs"
        " && ln -s ../../elsewhere .git/modules/lnk && echo made"
    )
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=30, output_limit=20_000)
    output = str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]}))
    assert output.startswith("exit code 0\nmade"), output
    assert "'modules/evil', 'modules/lib/modules', 'modules/lnk'" in output, output
    modules = workspace / ".git" / "modules"
    assert sorted(path.name for path in modules.iterdir()) == ["lib"]
    assert (modules / "lib" / "logs").is_dir()
    assert not (modules / "lib" / "modules").exists()


def test_what_a_command_made_is_removed_even_when_it_timed_out(
    agent_in_sandbox: AgentFixture,
) -> None:
    """The removal ran only when the program ended by itself: planting a hook and then
    sleeping past the timeout left `.git/hooks/pre-commit`, which a person's commit ran."""
    fx = agent_in_sandbox
    session_id, workspace = repository(fx)
    hooks = workspace / ".git" / "hooks"
    for sample in hooks.iterdir():
        sample.unlink()
    hooks.rmdir()
    script = (
        "mkdir .git/hooks && printf '#!/bin/sh\\ntouch hook-ran\\n' > .git/hooks/pre-commit"
        " && chmod +x .git/hooks/pre-commit && echo ../elsewhere > .git/commondir && sleep 60"
    )
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=3, output_limit=20_000)
    with pytest.raises(TimeoutError):
        RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]})
    assert not hooks.exists() and not (workspace / ".git" / "commondir").exists()
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "hook-ran").exists()


def test_a_hooks_tree_thousands_of_levels_deep_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    """shutil.rmtree recursed once per level: a made `hooks/` 5,000 levels deep ended the
    call with a RecursionError (no message) and left `hooks/pre-commit` in place."""
    fx = agent_in_sandbox
    session_id, workspace = repository(fx)
    hooks = workspace / ".git" / "hooks"
    for sample in hooks.iterdir():
        sample.unlink()
    hooks.rmdir()
    deep = "import os\nos.chdir('.git/hooks')\nfor i in range(5000):\n os.mkdir('d'); os.chdir('d')"
    script = (
        "mkdir .git/hooks && printf '#!/bin/sh\\ntouch hook-ran\\n' > .git/hooks/pre-commit"
        f' && chmod +x .git/hooks/pre-commit && python3 -c "{deep}" && echo made'
    )
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=30, output_limit=20_000)
    output = str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]}))
    assert output.startswith("exit code 0\nmade"), output
    assert "'hooks'" in output and "it was removed" in output, output
    assert (
        sorted(path.name for path in (workspace / ".git").iterdir() if "removed" in path.name) == []
    )
    assert not hooks.exists()
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "hook-ran").exists()


def plant_files(workspace: Path) -> None:
    """What the agent copies (from its repository, say): a configuration with
    core.fsmonitor, and a hooks directory with a pre-commit hook."""
    (workspace / "evil.gitconfig").write_text('[core]\n\tfsmonitor = "touch fsmonitor-ran; true"\n')
    (workspace / "evilhooks").mkdir()
    (workspace / "evilhooks" / "pre-commit").write_text("#!/bin/sh\ntouch hook-ran\n")
    (workspace / "evilhooks" / "pre-commit").chmod(0o755)
    os.chown(workspace, 0, 0)  # given again to the sandbox user at the run


@pytest.mark.parametrize(
    ("setting", "value", "plant"),
    [
        ("include.path", "../shared.gitconfig", ["cp", "evil.gitconfig", "shared.gitconfig"]),
        (
            "includeIf.gitdir:/.path",
            "../shared.gitconfig",
            ["cp", "evil.gitconfig", "shared.gitconfig"],
        ),
        ("core.hooksPath", "githooks", ["cp", "-r", "evilhooks", "githooks"]),
    ],
)
def test_a_configuration_that_reads_a_file_of_the_workspace_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture, setting: str, value: str, plant: list[str]
) -> None:
    """`.git/config` was bound read-only, but what it includes (`[include] path =
    ../shared.gitconfig`) or takes hooks from (`core.hooksPath = githooks`) lay in the
    work tree, which the command wrote: the next `git status` ran the fsmonitor it
    planted, a person's commit its hook. No unapproved command runs in such a workspace."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", setting, value)
    plant_files(workspace)
    call = submit(fx, session_id, "plant", plant)
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert "A reviewer must approve this command" in call.content, call.content
    assert f"sets {setting.lower()} = {value!r}, inside the workspace" in call.content
    host_git(workspace, "status")
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "fsmonitor-ran").exists() and not (workspace / "hook-ran").exists()


def test_a_git_file_naming_a_git_directory_in_the_workspace_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A `.git` file (`gitdir: gd`) was bound read-only, and the git directory it names,
    inside the workspace, not at all: `gd/config` took core.fsmonitor."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    shutil.rmtree(workspace / ".git")
    host_git(workspace, "init", "-q", "--separate-git-dir=gd", ".")
    plant_files(workspace)
    call = submit(fx, session_id, "plant", ["cp", "evil.gitconfig", "gd/config"])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert "naming a git directory inside the workspace" in call.content, call.content
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


def test_an_effect_rule_never_writes_what_the_git_configuration_includes(
    agent_in_sandbox: AgentFixture, settings: Any
) -> None:
    """An effect rule's write is Harness's own (preview_apply), outside the sandbox: with
    `.git/config` including `../shared.gitconfig`, `effect(write: **)` applied the copy
    of a configuration with core.fsmonitor there. The ask stands in such a workspace."""
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
    host_git(workspace, "config", "include.path", "../shared.gitconfig")
    plant_files(workspace)
    call = submit(fx, session_id, "plant", ["cp", "evil.gitconfig", "shared.gitconfig"])
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by)
    assert not (workspace / "shared.gitconfig").exists()
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()


@pytest.mark.parametrize("link", [".git/modules", ".git/modules/lib"])
def test_a_symlinked_submodule_git_directory_stops_an_unapproved_command(
    agent_in_sandbox: AgentFixture, link: str
) -> None:
    """`.git/modules/lib -> ../../mods/lib` (or `.git/modules -> ../mods`) was passed over:
    git uses the directory it names, in the work tree, which nothing bound, so
    `mods/lib/config` took core.fsmonitor and a person's `git status` ran it."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    gitlink = "160000,1111111111111111111111111111111111111111,lib"
    host_git(workspace, "update-index", "--add", "--cacheinfo", gitlink)
    host_git(workspace, "commit", "-qm", "submodule lib")
    git_dir = workspace / "mods" / "lib"
    host_git(workspace, "init", "-q", "--bare", str(git_dir))
    host_git(workspace, "--git-dir", str(git_dir), "config", "core.bare", "false")
    host_git(workspace, "--git-dir", str(git_dir), "config", "core.worktree", "../../../lib")
    if link == ".git/modules":
        (workspace / ".git" / "modules").symlink_to("../mods")
    else:
        (workspace / ".git" / "modules").mkdir()
        (workspace / ".git" / "modules" / "lib").symlink_to("../../mods/lib")
    (workspace / "lib").mkdir()
    (workspace / "lib" / ".git").write_text("gitdir: ../.git/modules/lib\n")
    plant_files(workspace)
    call = submit(fx, session_id, "plant", ["cp", "evil.gitconfig", "mods/lib/config"])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert "a symbolic link" in call.content and "A reviewer must approve" in call.content
    host_git(workspace, "status")
    assert not (workspace / "fsmonitor-ran").exists()
