"""Red team of the sandbox when Harness does not run as root (rtsandnr): a
HARNESS_SANDBOX_READ_ONLY entry shows the sandbox nothing a program chose.

As root, an entry on whose way the sandbox user may write is refused. As an unprivileged
user it was judged by nothing of the kind: programs write as Harness's own uid there, and
an entry inside an agent's workspace (a person's project, registered as the agent's
workspace) was that agent's to redirect. One command moved the entry's parent aside and
put a symlink to another agent's workspace on its way, and every later command showed
that workspace at the entry (bwrap, as Harness, binds by path whatever Harness may read:
another agent's files, Harness's home). A flipping program won the race against the
check as well: 1 of 183 runs in 20 s read Harness's data directory through it.

Everything else here runs as root, so the sandbox runs in a forked child of this process
that became uid and gid 65534 (tests.tools.test_preview_unprivileged._as_user), with
workspaces and a data directory of that user's own."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox, sandbox_servers
from dispatcher.tools.base import ToolError
from tests.tools.support import require_bwrap
from tests.tools.test_preview_unprivileged import NOBODY, _as_user, _userns_switched_off

BOB_SECRET = "BOB-WORKSPACE-SECRET"
TOOL = "an admin's tool"


def _sh(workspace: Path, script: str) -> str:
    """`sh -c script` run in the sandbox in `workspace`: its output, or the refusal."""
    limits = sandbox.Limits(timeout=30, output_chars=4000)
    try:
        done = sandbox.run(
            ["sh", "-c", script],
            workspace=workspace,
            cwd=workspace,
            env={"PATH": "/usr/bin:/bin"},
            limits=limits,
        )
    except ToolError as refused:
        return f"refused: {refused}"
    return done.output


def _require_root() -> None:
    """Skip unless the tests run as root: only root makes a directory another user owns
    (an admin's, or one Harness's group may write) for the unprivileged child."""
    if os.geteuid() != 0:
        pytest.skip("needs a directory only others write, which only root can make here")


def _require_unprivileged_sandbox() -> None:
    """Skip (saying why) unless the sandbox runs as an unprivileged user here; under
    CI=true fail instead, unless a kernel setting switches user namespaces off."""

    def probed() -> str | None:
        assert os.geteuid() != 0
        return sandbox.probe()

    problem: str | None = _as_user(probed)
    if problem is None:
        return
    message = f"The sandbox does not run as uid {NOBODY} here: {problem}"
    switched_off = _userns_switched_off()
    if os.environ.get("CI") == "true" and switched_off is None:
        pytest.fail("CI=true, no kernel setting switches user namespaces off, and " + message)
    pytest.skip(message + (f" ({switched_off})" if switched_off else ""))


@pytest.fixture
def top(settings: Any) -> Iterator[Path]:
    """A directory root owns (as an admin's /opt would be) holding the unprivileged
    user's data directory, workspace root, alice's workspace (a person's project, outside
    the root) with an entry inside it, and bob's workspace with a secret."""
    require_bwrap()
    top = Path(tempfile.mkdtemp(prefix="harness-rtsandnr-"))
    try:
        os.chmod(top, 0o755)  # noqa: S103 - the unprivileged user passes through
        for name in ("data", "workspaces", "alice/sub/tools", "bob"):
            (top / name).mkdir(parents=True)
        (top / "alice" / "sub" / "tools" / "tool.txt").write_text(f"{TOOL}\n")
        (top / "bob" / "secret.txt").write_text(f"{BOB_SECRET}\n")
        for path in top.rglob("*"):
            if os.geteuid() == 0:
                os.chown(path, NOBODY, NOBODY)
        settings.DATA_DIR = top / "data"
        settings.HARNESS_WORKSPACE_ROOT = top / "workspaces"
        settings.HARNESS_SANDBOX = "bwrap"
        settings.HARNESS_SANDBOX_NETWORK = False
        settings.HARNESS_SANDBOX_READ_ONLY = []
        _require_unprivileged_sandbox()
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_an_entry_in_an_agents_workspace_shows_no_other_workspace(top: Path, settings: Any) -> None:
    alice, bob = top / "alice", top / "bob"
    entry = alice / "sub" / "tools"
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
    redirect = f"mv sub sub.old && mkdir sub && ln -s {bob} sub/tools && echo redirected"

    def runs() -> list[str]:
        return [_sh(alice, redirect), _sh(alice, f"cat {entry}/secret.txt")]

    first, second = _as_user(runs)
    assert BOB_SECRET not in second, (first, second)
    # refused from the first run: the entry lies in a directory programs write
    for seen in (first, second):
        assert seen.startswith("refused: "), seen
        assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} reaches " in seen, seen
        assert "which lies in a directory sandboxed programs may write" in seen, seen


def test_an_entry_in_a_directory_of_harnesss_group_is_refused(top: Path, settings: Any) -> None:
    _require_root()
    # a directory root owns that Harness's group may write (a server's writable path,
    # say): the programs write as that group too, a user namespace keeps it
    shared = top / "shared"
    (shared / "toolchain").mkdir(parents=True)
    os.chmod(shared, 0o775)  # noqa: S103 - what the test is about
    with contextlib.suppress(PermissionError):
        os.chown(shared, 0, NOBODY)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(shared / "toolchain")]
    seen = _as_user(lambda: _sh(top / "alice", "ls /"))
    assert seen.startswith("refused: "), seen
    assert f"reaches {shared / 'toolchain'}, which lies in a directory" in seen, seen


def test_an_entry_only_others_write_is_shown(top: Path, settings: Any) -> None:
    _require_root()
    # root's, as an admin installs a toolchain: shown to the unprivileged user's sandbox
    toolchain = top / "opt" / "toolchain-1.2"
    toolchain.mkdir(parents=True)
    (toolchain / "tool.txt").write_text(f"{TOOL}\n")
    (top / "opt" / "toolchain").symlink_to(toolchain)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(top / "opt" / "toolchain")]
    seen = _as_user(lambda: _sh(top / "alice", f"cat {toolchain}/tool.txt"))
    assert seen == f"{TOOL}\n", seen


def test_a_servers_writable_path_may_not_hold_an_entrys_way(settings: Any) -> None:
    # Root or not: the server writes its writable path, and swapped a step of the entry's
    # way for a symlink between a run's check and bwrap's bind (as root, the path was
    # refused only once given to the sandbox user, every program stopped with it).
    _require_root()
    settings.HARNESS_SANDBOX = "bwrap"
    top = Path(tempfile.mkdtemp(prefix="harness-rtsandnr-"))
    try:
        os.chmod(top, 0o755)  # noqa: S103 - the unprivileged user passes through
        (top / "srv" / "toolchain").mkdir(parents=True)
        (top / "opt").mkdir()
        (top / "opt" / "toolchain").symlink_to(top / "srv" / "toolchain")
        (top / "other").mkdir()
        for entry in (top / "srv" / "toolchain", top / "opt" / "toolchain", top / "srv"):
            settings.HARNESS_SANDBOX_READ_ONLY = [str(top / "other"), str(entry)]
            problem = sandbox_servers.server_path_problem(f"{top / 'srv'}:rw")
            assert problem is not None, entry
            assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} (at {top / 'srv'}" in problem
            # read-only, the server changes nothing of the way
            assert sandbox_servers.server_path_problem(f"{top / 'srv'}:ro") is None
        assert sandbox_servers.server_path_problem(f"{top / 'other'}:rw") is not None
        settings.HARNESS_SANDBOX_READ_ONLY = [str(top / "opt" / "toolchain")]
        assert sandbox_servers.server_path_problem(f"{top / 'other'}:rw") is None
    finally:
        shutil.rmtree(top, ignore_errors=True)
