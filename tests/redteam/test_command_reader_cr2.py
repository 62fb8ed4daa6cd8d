"""Red-team of the command reader, second round (helper cr2): what cr left open. Programs an
allow rule names for reading (`uniq *`, `yq *`) that write a file they name; code-running
options xargs appends; words and a client's shell directory that reach `.git` through a
symbolic link. Each attack is checked as admission decides it and, where it claims an
effect, run for real in the bubblewrap sandbox (see test_command_reader_cr.py)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.redteam.test_command_reader_cr import FSMONITOR_EDIT, decide, git_init, run
from tests.support.claude_code_hooks import decision, hook_input, pre_tool_use, send
from tests.support.factories import AgentFixture


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    return sandboxed_workspace


# --- programs for reading that write a file they name ---------------------------------------------
# `sort -o` was made unreadable by cr; the same class: an operand or an option that makes a
# program a `PROGRAM *` rule names for reading write (or empty) a workspace file.

WRITERS = [
    # (the writing form, a reading form of the same program)
    (["uniq", "in", "main.py"], ["uniq", "-c", "in"]),
    (["uniq", "-f", "1", "--", "in", "main.py"], ["uniq", "-f", "1", "in"]),
    (["xxd", "in", "main.py"], ["xxd", "-l", "4", "in"]),
    (["xxd", "-r", "-p", "in", "main.py"], ["xxd", "-r", "-p", "in"]),
    (["shuf", "-o", "main.py", "in"], ["shuf", "-n", "1", "in"]),
    (["shuf", "-ro", "main.py", "-n", "1", "in"], ["shuf", "-e", "a"]),
    (
        ["iconv", "-f", "utf-8", "-t", "ascii", "--out=main.py", "in"],
        ["iconv", "-t", "ascii", "in"],
    ),
    (["yq", "-y", "-i", ".kept = false", "main.py"], ["yq", "-y", ".kept", "main.py"]),
    (["yq", "-Yi", ".kept = false", "main.py"], ["yq", "-Y", ".", "main.py"]),
]


@pytest.mark.parametrize(("argv", "reading"), WRITERS, ids=lambda v: " ".join(v))
def test_a_reading_rule_does_not_allow_writing_a_named_file(
    workspace: Path, argv: list[str], reading: list[str]
) -> None:
    (workspace / "main.py").write_text("kept: true\n")
    (workspace / "in").write_text("00000000\n")
    rule = f"{argv[0]} *"
    assert decide(workspace, argv, [rule]) == "ask"
    assert decide(workspace, reading, [rule]) == "allow"
    run(workspace, argv)  # the premise: it wrote main.py
    assert (workspace / "main.py").read_text() != "kept: true\n"


@pytest.mark.parametrize(
    "command",
    [
        "tree -o main.py",
        "tree -aomain.py",
        "tree -R -H . -L 1",
        "yq -s .a f.yaml",
        "yq --inplace .a f.yaml",
        "base64 -o main.py f",
        "xxd f -c",
    ],
)
def test_writing_forms_of_programs_not_installed_here_are_not_allowed(
    workspace: Path, command: str
) -> None:
    argv = command.split()
    assert decide(workspace, argv, [f"{argv[0]} *"]) == "ask"


def test_xargs_words_may_be_a_writing_option(workspace: Path) -> None:
    # `printf -- '-o\nHEAD\n' | xargs tree` runs `tree -o HEAD`: tree and yq are no longer
    # read as programs that write no file they name
    argv = ["sh", "-c", "cat list | xargs tree"]
    assert decide(workspace, argv, ["cat *", "tree *"]) == "ask"
    assert decide(workspace, ["sh", "-c", "cat list | xargs uniq"], ["cat *", "uniq *"]) == "ask"
    assert decide(workspace, ["sh", "-c", "cat list | xargs wc -l"], ["cat *", "wc *"]) == "allow"


# --- code-running options that xargs appends ------------------------------------------------------
# `rg --pre CMD` is unreadable when written; rg is read under xargs (it writes no file it
# names), so a list the agent wrote that holds `--pre=./x` made `cat list | xargs rg TODO`,
# allowed by `cat *` and `rg *`, run ./x.


def test_xargs_appended_words_may_be_a_code_running_option(workspace: Path) -> None:
    script = workspace / "x"
    script.write_text('#!/bin/sh\ntouch pre-ran\ncat "$1"\n')
    script.chmod(0o755)
    (workspace / "notes").write_text("TODO\n")
    (workspace / "list").write_text("--pre=./x\nnotes\n")
    argv = ["sh", "-c", "cat list | xargs rg TODO"]
    assert decide(workspace, argv, ["cat *", "rg *"]) == "ask"
    assert decide(workspace, ["rg", "TODO", "notes"], ["rg *"]) == "allow"
    run(workspace, argv)  # the premise: rg ran ./x
    assert (workspace / "pre-ran").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["bat", "--paging=always", "--pager=./x", "f"],
        ["batcat", "--pager", "./x", "f"],
        ["ag", "--pager", "sh -c id", "x"],
        ["sh", "-c", "cat list | xargs ag x"],
    ],
)
def test_pager_options_of_reading_programs_are_not_allowed(
    workspace: Path, argv: list[str]
) -> None:
    program = argv[0] if argv[0] != "sh" else "ag"
    assert decide(workspace, argv, [f"{program} *", "cat *"]) == "ask"
    assert decide(workspace, [program, "f"], [f"{program} *"]) == "allow"


@pytest.mark.skipif(shutil.which("batcat") is None, reason="needs bat (Debian's batcat)")
def test_bat_runs_the_pager_it_is_given_without_a_terminal(workspace: Path) -> None:
    script = workspace / "x"
    script.write_text("#!/bin/sh\ntouch pager-ran\ncat\n")
    script.chmod(0o755)
    (workspace / "f").write_text("hi\n")
    argv = ["batcat", "--paging=always", "--pager=./x", "f"]
    assert decide(workspace, argv, ["batcat *"]) == "ask"
    run(workspace, argv)  # the premise: it ran ./x, with no terminal
    assert (workspace / "pager-ran").exists()


# --- a word reaching .git through a symbolic link ---------------------------------------------------
# Words were checked for `.git` by their text, and only `cwd` was resolved: with `meta` a
# link to `.git` (a repository may hold one), `sed -i ... meta/config`, allowed by
# `run_command(sed *)`, wrote core.fsmonitor, which the next `git status` ran.


def linked_workspace(workspace: Path) -> Path:
    git_init(workspace)
    (workspace / "meta").symlink_to(".git")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "config").write_text("[core]\n\tbare = false\n")
    (workspace / "src").mkdir()
    (workspace / "lnk").symlink_to("src")
    (workspace / "x").write_text("#!/bin/sh\ntouch hook-ran\n")
    return workspace


def test_a_word_through_a_link_to_the_git_directory_is_not_allowed(workspace: Path) -> None:
    linked_workspace(workspace)
    argv = ["sed", "-i", FSMONITOR_EDIT, "meta/config"]
    assert decide(workspace, argv, ["sed *"]) == "ask"
    run(workspace, argv)  # the premise, in the real sandbox
    run(workspace, ["git", "status"])
    assert (workspace / "fsmonitor-ran").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["cp", "x", "meta/hooks/pre-commit"],
        ["cp", "-t", "meta/hooks", "x"],
        ["cp", "--target-directory=meta/hooks", "x"],
        ["sed", "-imeta/*", "-e", "p", "config"],  # its backup of config goes to meta/config
        ["cat", "meta/config"],
        ["sed", "-i", "s/a/b/", "sub/../meta/config"],
        ["bash", "-c", "cd sub && sed -i s/a/b/ ../meta/config"],
        ["bash", "-c", "cd meta && sed -i s/a/b/ config"],
        ["sed", "-i", "s/a/b/", "sub/config"],  # a link to ../.git/config
    ],
)
def test_links_to_the_git_directory_are_followed_in_every_word(
    workspace: Path, argv: list[str]
) -> None:
    linked_workspace(workspace)
    (workspace / "sub" / "config").unlink()
    (workspace / "sub" / "config").symlink_to("../.git/config")
    assert decide(workspace, argv, [f"{argv[0]} *", "cd *", "sed *"]) == "ask"


def test_links_elsewhere_and_plain_names_still_read(workspace: Path) -> None:
    linked_workspace(workspace)
    assert decide(workspace, ["sed", "-i", "s/a/b/", "sub/config"], ["sed *"]) == "allow"
    assert decide(workspace, ["sed", "-i", "s/a/b/", "lnk/a.py"], ["sed *"]) == "allow"
    assert decide(workspace, ["cp", "x", "lnk/y"], ["cp *"]) == "allow"
    assert decide(workspace, ["grep", "-rn", "config", "."], ["grep *"]) == "allow"
    cd = ["bash", "-c", "cd lnk && sed -i s/a/b/ a.py"]
    assert decide(workspace, cd, ["cd *", "sed *"]) == "allow"


def test_a_writer_through_a_link_to_a_head_file_is_not_allowed(workspace: Path) -> None:
    # `cp x HEAD` is unreadable by its text (a HEAD file makes a directory a git directory);
    # through a link to an existing HEAD it wrote the same file
    (workspace / "d").mkdir()
    (workspace / "d" / "HEAD").write_text("x\n")
    (workspace / "h").symlink_to("d/HEAD")
    assert decide(workspace, ["cp", "x", "h"], ["cp *"]) == "ask"
    assert decide(workspace, ["cat", "h"], ["cat *"]) == "allow"  # reading it writes nothing


# --- a client's shell directory in .git ----------------------------------------------------------
# Claude Code's shell keeps its directory after `cd meta` (a link to .git) and reports it
# as the hook's `cwd`; Harness read only the command, so `sed -i ... config`, allowed by
# `Bash(sed *)`, wrote .git/config on the developer's machine.


def with_rules(fx: AgentFixture, **lists: list[str]) -> None:
    rules = {"allow": [], "ask": [], "deny": [], **lists}
    profiles.update_profile(user=fx.owner, mode="standard", actor="test", **rules)


@pytest.mark.django_db
def test_a_hook_whose_shell_is_in_the_git_directory_is_not_allowed_by_a_rule(
    agent: AgentFixture, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    git_init(project)
    (project / "meta").symlink_to(".git")
    (project / "sub").mkdir()
    with_rules(agent, allow=["Bash(sed *)"])
    session_id = str(uuid.uuid4())
    command = {"command": f"sed -i '{FSMONITOR_EDIT}' config"}

    def ask(cwd: Path | str) -> tuple[str, str]:
        body = pre_tool_use(session_id, "Bash", command, cwd=str(cwd))
        return decision(send(agent, body))

    send(agent, hook_input("SessionStart", session_id, cwd=str(project), source="startup"))
    assert ask(project / "sub")[0] == "allow"  # elsewhere: as before
    for cwd in (project / ".git", project / "meta", project / ".git" / "hooks", "/srv/x/.git"):
        action, reason = ask(cwd)
        assert (action, "No reviewer decided" in reason) == ("deny", True), cwd
    asked = ToolCall.objects.filter(session__external_id=session_id, status=Status.CANCELLED)
    assert asked.count() == 4
    assert ApprovalRequest.objects.filter(call__in=asked).count() == 4
    meta = asked.get(provenance__client_cwd=str(project / "meta"))
    event = AuditEvent.objects.get(subject=f"call:{meta.pk}", kind="call.approval_requested")
    assert event.payload["client_cwd"] == str(project / "meta")  # the record says where


def test_a_hooks_directory_not_on_this_host_is_read_by_its_text(tmp_path: Path) -> None:
    from dispatcher.policy.git_links import client_cwd_in_git_directory

    project = tmp_path / "absent"
    assert client_cwd_in_git_directory(f"{project}/.git", project)
    assert client_cwd_in_git_directory(f"{project}/a/../.GIT/hooks", project)
    assert not client_cwd_in_git_directory(f"{project}/meta", project)  # nothing to resolve
    assert not client_cwd_in_git_directory(f"{project}/.github", project)


# --- a kept verdict is not one for another workspace ----------------------------------------------
# Verdicts on command rules are kept by the call's tool, arguments and rules; cr's check of a
# `cwd` that is a link to `.git` read the disk inside them, so once `sed -i ... config` in
# cwd `meta` was allowed in a workspace where `meta` is a plain directory, the same call was
# allowed in any workspace, where `meta` may be a link to `.git`.


def test_a_verdict_kept_for_one_workspace_does_not_decide_in_another(
    workspace: Path, tmp_path: Path
) -> None:
    argv = ["sed", "-i", FSMONITOR_EDIT, "config"]
    plain = tmp_path / "workspaces" / "plain"
    (plain / "meta").mkdir(parents=True)
    assert decide(plain, argv, ["sed *"], cwd="meta") == "allow"
    linked_workspace(workspace)
    assert decide(workspace, argv, ["sed *"], cwd="meta") == "ask"
    assert decide(workspace, ["cat", "meta/config"], ["cat *"]) == "ask"
    assert decide(plain, ["cat", "meta/config"], ["cat *"]) == "allow"
    assert decide(workspace, ["cat", "meta/config"], ["cat *"]) == "ask"
