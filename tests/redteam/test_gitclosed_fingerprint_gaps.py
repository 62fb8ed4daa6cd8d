"""A previewed effect whose fingerprint cannot take whole what git reads from outside the
workspace is never applied (the preview's fingerprint, git_outside.outside_state_and_gaps).

Two ways the fingerprint failed open. Past its bounds (256 directories of refs, 256
files and directories outside, 256 files command lines name, 1,000 entries of a
directory) the rest was counted, never described: a tag added past the 256th ref
directory, or an included configuration past the 256th file, changed after the
approval and the old effect was applied. And a command line a configuration runs was
read for its paths by a partial shell reading: `!cd /team && sh greet.sh` was taken for
`/team` and the work tree's `greet.sh`, `PATH=/team:$PATH greet.sh` for nothing, and a
change to /team/greet.sh after the approval had the old effect applied. Now either
makes the preview not appliable, saying why to the reviewer: approving runs the command
for real. Real git, real bwrap, the worker's own code path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.tools import git_outside, preview
from tests.approvals.conftest import ask
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.redteam.test_rt4git_outside_programs import SETTINGS
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    approve,
    git,
    outside_program,
    ref_directories,
    repository,
    session_repository,
    team,
    worktree,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

GREET = ["sh", "-c", "git greet > greeting.txt; echo said"]


def _ran_for_real(
    agent: AgentFixture, reviewer_client: Client, session_id: str, argv: list[str], why: str
) -> tuple[ToolCall, Preview]:
    """Ask `argv`, see its preview shown as not appliable (`why` in its note and on the
    approval page), approve it: (the approval's call, its preview row)."""
    approval = ask(agent, {"argv": argv}, session_id=session_id, name="run_command")
    row = Preview.objects.get(call=approval.call)
    assert not row.appliable, row.effect
    assert why in row.note, row.note
    assert "cannot watch everything" in row.note, row.note
    assert why in str(row.effect.get("unwatched")), row.effect
    page = reviewer_client.get(f"/approvals/{approval.pk}/")
    assert page.status_code == 200
    assert "This preview cannot be applied" in page.content.decode()
    assert why in page.content.decode()
    approve(reviewer_client, approval)
    return ToolCall.objects.get(pk=approval.call_id), row


@pytest.mark.parametrize(
    "alias",
    ["!cd {team} && sh greet.sh", "!PATH={team}:$PATH greet.sh"],
)
def test_a_program_only_the_shell_finds_changed_after_the_approval_is_run_not_applied(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
    alias: str,
) -> None:
    outside = team(tmp_path, settings)
    program = outside / "greet.sh"
    program.write_text("#!/bin/sh\necho hello\n")
    program.chmod(0o755)
    session_id, workspace = session_repository(agent)
    git(workspace, "config", "alias.greet", alias.format(team=outside))

    call, _ = _ran_for_real(agent, reviewer_client, session_id, GREET, "alias.greet")
    # Between the approval and the apply, the program outside the workspace changes (in
    # place: /team, the directory the command line names, is as it was).
    program.write_text("#!/bin/sh\necho goodbye\n")
    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.COMPLETED, (call.status, call.content)
    # what the program does now, never the effect previewed under the old one
    assert (workspace / "greeting.txt").read_text() == "goodbye\n"
    assert Preview.objects.get(call=call).outcome == Preview.Outcome.RAN


def test_a_tag_past_the_ref_directories_watched_is_run_not_applied(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    """The main repository of a linked worktree holds more ref directories than the
    fingerprint describes; its tags (`refs/tags/team/`, walked after `refs/heads`) lie
    past them."""
    outside = team(tmp_path, settings)
    session_id, workspace = session_repository(agent, linked_to=outside)
    main = outside / "main"
    sha = git(main, "rev-parse", "HEAD")
    ref_directories(main / ".git" / "refs" / "heads", git_outside.MAX_REF_DIRS + 10, sha)
    git(main, "tag", "team/v1.0")
    argv = ["sh", "-c", "git tag --points-at HEAD > TAGS; echo said"]

    call, _ = _ran_for_real(
        agent, reviewer_client, session_id, argv, f"more than {git_outside.MAX_REF_DIRS}"
    )
    # After the approval, in the main repository: a tag beside it (`refs/tags/team/`, a
    # directory whose change only `refs/tags`' own listing shows, past the bound)
    git(main, "tag", "team/v2.0")
    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.COMPLETED, (call.status, call.content)
    assert (workspace / "TAGS").read_text().split() == ["team/v1.0", "team/v2.0"]


def test_an_included_configuration_past_the_files_watched_is_run_not_applied(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    outside = team(tmp_path, settings)
    session_id, workspace = session_repository(agent)
    included = [outside / f"inc{index:03}.gitconfig" for index in range(git_outside.MAX_OUTSIDE)]
    for path in included:
        path.write_text("[team]\n\tother = 1\n")
    last = included[-1]
    last.write_text("[team]\n\tgreeting = hello\n")
    (workspace / ".git" / "config").write_text(
        "".join(f"[include]\n\tpath = {path}\n" for path in included)
    )
    argv = ["sh", "-c", "git config team.greeting > greeting.txt; echo said"]

    call, _ = _ran_for_real(
        agent, reviewer_client, session_id, argv, f"more than {git_outside.MAX_OUTSIDE}"
    )
    last.write_text("[team]\n\tgreeting = bye!!\n")  # (the same size, in place)
    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.COMPLETED, (call.status, call.content)
    assert (workspace / "greeting.txt").read_text() == "bye!!\n"


# Command lines `_named_files` cannot read whole: the shell's own reading decides which
# file runs ({p}: a program outside the workspace).
UNREAD = [
    ("alias.t", "!cd {d} && sh tool"),
    ("alias.t", "!PATH={d}:$PATH tool"),
    ("core.fsmonitor", "PATH={d} tool"),
    ("core.editor", "env PATH={d} vi"),
    ("core.editor", "/usr/bin/env -C {d} tool"),
    ("filter.team.clean", "sh -c 'cd {d}; sh tool'"),
    ("alias.t", '!f() {{ {p} "$@"; }}; f | head'),
    ("core.pager", "$TEAM/tool"),
    ("core.sshCommand", "ssh -F `cat {p}`"),
    ("credential.helper", "!{p} $(cat {p})"),
    ("diff.external", "{d}/*"),
    ("alias.t", "!sh ../tool"),
    ("alias.t", "!sh ~+/tool"),
    ("alias.c", "commit -F '{d}/a b'"),
    ("alias.t", '!sh {d}/to"ol"'),
    ("alias.c", 'commit -F {d}/to"ol"'),
    ("core.fsmonitor", "{d}/t'oo'l"),
]


@pytest.mark.parametrize(("key", "value"), UNREAD)
def test_a_command_line_the_fingerprint_cannot_read_whole_is_a_gap(
    tmp_path: Path, key: str, value: str
) -> None:
    workspace = repository(tmp_path / "ws")
    program = outside_program(tmp_path)
    git(workspace, "config", key, value.format(p=program, d=program.parent))
    _, gaps = preview.fingerprint_with_gaps(workspace)
    assert any(key.lower() in gap and "cannot read whole" in gap for gap in gaps), gaps


@pytest.mark.parametrize(
    ("key", "value"),
    [
        *((key, value) for key, value in SETTINGS if not key.startswith("alias.")),
        ("alias.t", "!sh {p}"),
        ("alias.t", "!sh ~/x"),
        ("alias.t", "!sh $HOME/x"),
        ("alias.t", '!sh "$HOME"/x'),
        ("alias.t", "!sh '{p}'"),
        ("alias.t", "!sh ${{PWD}}/x"),
        ("alias.lg", "log --pretty=format:'%h %s'"),
        ("filter.lfs.clean", "git-lfs clean -- %f"),
        ("credential.helper", "cache --timeout=3600"),
        ("core.pager", "less -FRX"),
    ],
)
def test_a_plain_command_line_is_no_gap(tmp_path: Path, key: str, value: str) -> None:
    """Plain words, which `_named_files` resolves (the common command lines), keep the
    preview appliable."""
    workspace = repository(tmp_path / "ws")
    program = tmp_path / "bin" / "tool"
    git(workspace, "config", key, value.format(p=program))
    assert preview.fingerprint_with_gaps(workspace)[1] == []


def test_a_configuration_with_a_command_line_of_the_shell_is_read() -> None:
    """A configuration whose command line holds the shell's syntax (no `/` or `~`) is
    read, where before the cheap test passed it by unread."""
    for data in (
        b"[core]\n\tfsmonitor = PATH=x:$PATH y\n",
        b"[core]\n\teditor = env vi\n",
        b"[credential]\n\thelper = !f() { echo x; }; f\n",
        b"[alias]\n\tx = !cd .. && sh x.sh\n",
        b"[core]\n\tpager = less $X\n",
    ):
        assert git_outside._names_files(data, False), data
    for data in (b"[core]\n\tpager = less -R\n", b"[credential]\n\thelper = gcloud.sh\n"):
        assert not git_outside._names_files(data, False), data


def test_each_bound_of_the_fingerprint_is_a_gap(tmp_path: Path) -> None:
    """Past MAX_NAMED files command lines name, MAX_LISTED entries of a hooks directory
    outside, MAX_REF_DIRS ref directories, MAX_OUTSIDE files: each said."""
    main, workspace = worktree(tmp_path, "ws")
    assert preview.fingerprint_with_gaps(workspace)[1] == []
    outside = tmp_path / "team"
    outside.mkdir()
    with (main / ".git" / "config").open("a") as config:
        config.write("[alias]\n")
        for index in range(git_outside.MAX_NAMED + 1):
            config.write(f"\ta{index} = !sh {outside}/p{index}\n")
    gaps = preview.fingerprint_with_gaps(workspace)[1]
    assert any(f"more than {git_outside.MAX_NAMED} files" in gap for gap in gaps), gaps

    git(main, "config", "--remove-section", "alias")
    hooks = main / ".git" / "hooks"
    for index in range(git_outside.MAX_LISTED + 1 - len(os.listdir(hooks))):
        (hooks / f"h{index}").write_text("")
    gaps = preview.fingerprint_with_gaps(workspace)[1]
    assert any(f"more than {git_outside.MAX_LISTED} entries" in gap for gap in gaps), gaps
    assert str(hooks) in " ".join(gaps)


def test_a_configuration_too_large_to_read_is_a_gap(tmp_path: Path) -> None:
    """An included configuration past the 1 MiB read: what it includes in turn is not
    known."""
    workspace = repository(tmp_path / "ws")
    large = tmp_path / "team.gitconfig"
    large.write_text("[include]\n\tpath = /team/more.gitconfig\n" + "#" * (2 << 20) + "\n")
    git(workspace, "config", "include.path", str(large))
    gaps = preview.fingerprint_with_gaps(workspace)[1]
    assert any(f"could not read the git configuration {large}" in gap for gap in gaps), gaps
