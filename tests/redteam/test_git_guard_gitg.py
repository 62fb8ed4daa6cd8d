"""Gaps the git metadata guard (dispatcher/tools/sandbox_git.py) listed or left: a
symbolic link a person keeps as a submodule's `objects/` (put back as an empty directory
after every unapproved command), the `git config` read of each `.git` a command makes
(no bound: ten thousand made repositories were ten thousand subprocesses in the
workspace's lock), `~` in a pointer (expanded with Harness's home, not the person's),
and the `exec` lines of a rebase todo an unapproved command left (the person's `git
rebase --continue` ran them on the host). Real bwrap, real git."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G, submodule
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def test_a_symlinked_objects_directory_of_a_submodule_is_kept(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """A person keeps a submodule's objects elsewhere (`.git/modules/x/objects ->
    /srv/store/x`): after any unapproved command the guard took the link for objects/ the
    run removed, unlinked it and made an empty directory in its place, and the submodule
    lost every object (`git log` in it failed). A link that was there is kept; one the run
    replaced is put back as the same link, never followed."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    submodule(workspace, "x")
    host_git(workspace, *G, "commit", "-qm", "with x")
    git_dir = workspace / ".git" / "modules" / "x"
    store = tmp_path / "store"
    shutil.move(git_dir / "objects", store)
    (git_dir / "objects").symlink_to(store)
    assert "base" in host_git(workspace / "x", "log", "--format=%s")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)

    output = sandboxed(workspace, "echo done")
    assert output.startswith("exit code 0\ndone"), output
    assert (git_dir / "objects").is_symlink(), output
    assert os.readlink(git_dir / "objects") == str(store)
    assert "base" in host_git(workspace / "x", "log", "--format=%s")

    # replaced by the run (with a directory, or removed): put back as the link it was
    objects = ".git/modules/x/objects"
    for script in (f"rm {objects} && mkdir {objects}", f"rm {objects} && ln -s /tmp {objects}"):
        output = sandboxed(workspace, f"{script} && echo done")
        assert output.startswith("exit code 0\ndone"), output
        assert (git_dir / "objects").is_symlink(), output
        assert os.readlink(git_dir / "objects") == str(store), output
        assert "put back" in output and "objects" in output, output
        assert "base" in host_git(workspace / "x", "log", "--format=%s")
    assert list(store.iterdir()), "the objects the link names are untouched"


PLAIN_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
MAKE_MANY = (
    'python3 -c "import os\nfor i in range({count}):\n'
    "    os.makedirs(f'r/{{i:05}}/.git')\n"
    "    open(f'r/{{i:05}}/.git/config', 'w').write(open('plain.gitconfig').read())\n\""
    " && echo done"
)


def test_the_git_directories_a_command_makes_are_read_within_a_bound(
    agent_in_sandbox: AgentFixture,
) -> None:
    """Each `.git` an unapproved command made cost a `git config` subprocess (two with an
    index), with no bound: 10,000 made repositories were 10,000 subprocesses in the
    workspace's lock (about 16 ms each here: minutes, past the call's time limit, whose
    kill left the rest unjudged). Past MAX_CONFIG_READS (or CONFIG_READ_SECONDS) a made
    `.git` is removed unread, as one whose configuration cannot be read, and the model
    is told once."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    (workspace / "plain.gitconfig").write_text(PLAIN_CONFIG)
    sandbox.give_to_sandbox(workspace)
    count = sandbox_git.MAX_CONFIG_READS + 300
    output = sandboxed(workspace, MAKE_MANY.format(count=count))
    assert output.startswith("exit code 0\ndone"), output[:2000]
    kept = sorted(path.parent.name for path in (workspace / "r").glob("*/.git"))
    assert 0 < len(kept) <= sandbox_git.MAX_CONFIG_READS, len(kept)
    # those read are kept (a plain configuration); the rest removed unread
    removed = count - len(kept)
    assert f"made {removed} more git directories" in output, output[-3000:]
    assert f"at most {sandbox_git.MAX_CONFIG_READS} git configurations" in output
    assert output.count("[harness:") == 1, output[-3000:]  # told once, not 300 times
    # the next unapproved command runs as before: the kept ones are nested repositories
    # now, more than the guard binds, so it says a reviewer must approve it
    with pytest.raises(ToolError, match="more than 128 directories"):
        sandboxed(workspace, "echo again")


def test_a_few_made_repositories_are_judged_one_by_one_as_before(
    agent_in_sandbox: AgentFixture,
) -> None:
    """Within the bound nothing changes: each made `.git` is read; one that plants
    something is removed and named."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    (workspace / "plain.gitconfig").write_text(PLAIN_CONFIG)
    sandbox.give_to_sandbox(workspace)
    script = "git init -q a && git init -q b && git -C b config core.fsmonitor ./x.sh && echo done"
    output = sandboxed(workspace, script)
    assert output.startswith("exit code 0\ndone"), output
    assert (workspace / "a" / ".git").is_dir() and not (workspace / "b" / ".git").exists()
    assert "made the git directory 'b/.git', which sets core.fsmonitor" in output, output
    assert "more git directories" not in output


def person_git(workspace: Path, home: Path, *args: str) -> str:
    """git as a person whose HOME is `home` runs it on the host, in the workspace."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, *args],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def test_a_hooks_path_under_the_home_of_whoever_runs_git_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`core.hooksPath = ~/<workspace>/githooks`: the guard expanded `~` with Harness's
    own home (`/root/<workspace>/githooks`, outside), bound nothing, and an allowed `cp`
    planted `githooks/pre-commit`, which the person's commit (their HOME holding the
    workspace) ran. git takes `~` from the HOME of whoever runs it, which Harness cannot
    know: such a pointer is taken to be inside, so no unapproved command runs."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    home = workspace.parent  # the person's HOME, which holds the workspace
    assert os.path.expanduser("~") != str(home)
    (workspace / "githooks").mkdir()
    host_git(workspace, "config", "core.hooksPath", f"~/{workspace.name}/githooks")
    mark = workspace / "hook-ran"
    (workspace / "evil.sh").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (workspace / "evil.sh").chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    try:
        output = sandboxed(workspace, "cp evil.sh githooks/pre-commit && echo done")
    except ToolError as error:
        output = str(error)
    person_git(workspace, home, "commit", "--allow-empty", "-qm", "person")
    assert not mark.exists(), output
    assert "under '~', the home of whoever runs git" in output, output
    assert "nothing ran" in output
    assert not (workspace / "githooks" / "pre-commit").exists()


def test_home_pointers_are_judged_as_git_expands_them(agent_in_sandbox: AgentFixture) -> None:
    """`~user/...` is that user's home from the password database, whoever runs git: one
    outside the workspace passes as before; an include of `~/...` is the runner's and
    refuses, naming why."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    root_home = pwd.getpwnam("root").pw_dir
    host_git(workspace, "config", "core.hooksPath", "~root/.harness-no-such-hooks")
    sandbox.give_to_sandbox(workspace)
    output = sandboxed(workspace, "echo done")
    assert output.startswith("exit code 0\ndone"), output
    assert sandbox_git._expand_home("~root/x") == os.path.join(root_home, "x")
    assert sandbox_git._expand_home("~/x") is None
    assert sandbox_git._expand_home("~no-such-user-h/x") is None
    host_git(workspace, "config", "--unset", "core.hooksPath")
    host_git(workspace, "config", "include.path", "~/team.gitconfig")
    with pytest.raises(ToolError, match="under '~', the home of whoever runs git"):
        sandboxed(workspace, "echo done")


def test_exec_lines_a_command_leaves_in_a_rebase_todo_do_not_run_at_the_persons_continue(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git rebase -i -x CMD`, stopped at a `break` before its first pick, left `exec
    CMD` lines in `.git/rebase-merge/git-rebase-todo` (writable: an allowed rebase must
    go on); the person's `git rebase --continue` ran CMD on the host, outside the
    sandbox. The lines the run added are made comments; the picks go on."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    for name in ("a", "b", "c"):
        (workspace / name).write_text(f"{name}\n")
        host_git(workspace, *G, "add", name)
        host_git(workspace, *G, "commit", "-qm", name)
    mark = workspace / "exec-ran"
    os.chown(workspace, 0, 0)  # given again, with what the person's git made
    sandbox.give_to_sandbox(workspace)
    script = (
        f"GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git -c user.email=a@b -c user.name=A "
        f"rebase -q -i -x 'touch {mark}' HEAD~2; echo stopped"
    )
    output = sandboxed(workspace, script)
    assert "stopped" in output, output
    assert not mark.exists(), output
    assert (workspace / ".git" / "rebase-merge").is_dir(), output
    todo = (workspace / ".git" / "rebase-merge" / "git-rebase-todo").read_text()
    person = host_git(workspace, *G, "rebase", "--continue")
    assert not mark.exists(), (output, person)
    assert "pick" in todo and f"# exec touch {mark}" in todo, todo
    assert "left `exec` lines in the rebase under way in '.git'" in output, output
    assert "c" in host_git(workspace, "log", "-1", "--format=%s")
    assert not (workspace / ".git" / "rebase-merge").exists(), person


def test_a_persons_own_exec_lines_are_kept(agent_in_sandbox: AgentFixture) -> None:
    """A rebase the person started with `-x` keeps its exec lines through an unapproved
    command (only those the run added are made comments)."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    for name in ("a", "b"):
        (workspace / name).write_text(f"{name}\n")
        host_git(workspace, *G, "add", name)
        host_git(workspace, *G, "commit", "-qm", name)
    env = {**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i '1i break'"}
    subprocess.run(
        ["git", "-c", "safe.directory=*", *G, "rebase", "-q", "-i", "-x", "true", "HEAD~1"],
        cwd=workspace,
        env=env,
        capture_output=True,
        check=False,
    )
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    output = sandboxed(workspace, "echo done")
    assert output.startswith("exit code 0\ndone") and "[harness:" not in output, output
    todo = (workspace / ".git" / "rebase-merge" / "git-rebase-todo").read_text()
    assert "\nexec true" in "\n" + todo, todo


LINKED = {
    "rebase-merge a link": "mv .git/rebase-merge rm && ln -s ../rm .git/rebase-merge",
    "todo a link": (
        "mv .git/rebase-merge/git-rebase-todo todo && "
        "ln -s ../../todo .git/rebase-merge/git-rebase-todo"
    ),
}


@pytest.mark.parametrize("how", sorted(LINKED))
def test_a_rebase_todo_behind_a_link_is_removed(agent_in_sandbox: AgentFixture, how: str) -> None:
    """The todo read through a link the run made (`.git/rebase-merge -> ../rm`, or the
    todo itself a link) was not read by the guard, but git follows it: the link goes."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    for name in ("a", "b"):
        (workspace / name).write_text(f"{name}\n")
        host_git(workspace, *G, "add", name)
        host_git(workspace, *G, "commit", "-qm", name)
    mark = workspace / "exec-ran"
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = (
        f"GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git -c user.email=a@b -c user.name=A "
        f"rebase -q -i -x 'touch {mark}' HEAD~1; {LINKED[how]} && echo linked"
    )
    output = sandboxed(workspace, script)
    assert "linked" in output, output
    person = host_git(workspace, *G, "rebase", "--continue")
    assert not mark.exists(), (output, person)
    assert "as a symbolic link or special file" in output, output
