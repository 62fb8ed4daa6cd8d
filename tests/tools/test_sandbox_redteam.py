"""A red-team read of the sandbox as Harness runs here (root): what the sandbox user may
be given on the host. Each test is a hole that was found and closed; the real walk, the
real write_file and a real sandboxed program, seen from the host."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox, sandbox_servers
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.write_file import TOOL as WRITE_FILE
from tests.tools.support import require_bwrap


@pytest.fixture
def as_root_sandbox(settings: Any, tmp_path: Path) -> Path:
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the hand-over to the sandbox user happens only when Harness is root")
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_WORKSPACE_ROOT = tmp_path / "workspaces"
    workspace = tmp_path / "workspaces" / "mine"
    workspace.mkdir(parents=True)
    return workspace


def run(workspace: Path, script: str) -> sandbox.Completed:
    return sandbox.run(
        ["sh", "-c", script],
        workspace=workspace,
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin"},
        limits=sandbox.Limits(timeout=30, output_chars=20_000),
    )


def test_a_workspace_holding_harness_data_does_not_give_the_data_away(
    as_root_sandbox: Path, settings: Any
) -> None:
    # An admin gave an agent a workspace that holds Harness's data directory (a project
    # checkout with var/ inside, say): the first run's walk must not hand the audit key
    # and the database to the sandbox user.
    data = as_root_sandbox / "var" / "data"
    data.mkdir(parents=True)
    settings.DATA_DIR = data
    key = data / "audit.key"
    key.write_bytes(b"secret")
    key.chmod(0o600)
    (as_root_sandbox / "mine.txt").write_text("mine\n")
    sandbox.give_to_sandbox(as_root_sandbox)  # what a run (or a server's :rw path) starts with
    assert key.stat().st_uid == 0 and data.stat().st_uid == 0
    assert (as_root_sandbox / "mine.txt").stat().st_uid == sandbox.sandbox_user()[0]  # type: ignore[index]


def test_write_file_keeps_the_owner_of_a_file_with_another_name_outside(
    as_root_sandbox: Path, tmp_path: Path
) -> None:
    # A file hard-linked into the workspace (git clone --local, a pnpm store) keeps its
    # owner in the first run's walk; write_file must not give it away either.
    outside = tmp_path / "host-file"
    outside.write_text("host\n")
    outside.chmod(0o644)
    os.link(outside, as_root_sandbox / "linked.txt")
    assert run(as_root_sandbox, "true").returncode == 0
    ctx = ExecutionContext(workspace=as_root_sandbox, call_id="t", timeout=20, output_limit=2000)
    # write_file refuses a file with another name (it would write the other name too:
    # tests/redteam/test_preview_effect_sweep.py), so nothing is written or given away.
    with pytest.raises(ToolError, match="hard link"):
        WRITE_FILE.execute(ctx, {"path": "linked.txt", "content": "edited\n"})
    assert outside.stat().st_uid == 0
    done = run(as_root_sandbox, "echo program >> linked.txt; echo rc=$?")
    assert "rc=0" not in done.output
    assert outside.read_text() == "host\n"


@pytest.fixture
def uncached_probe() -> Iterator[None]:
    sandbox._probe.cache_clear()
    yield
    sandbox._probe.cache_clear()


def test_the_probe_refuses_a_program_that_keeps_capabilities(
    as_root_sandbox: Path, uncached_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher that changes the uid but lets CAP_SETUID through (ambient): the file owner, /proc/sys and the filter all look right, and the
    # program can setuid(0). The probe must say so.
    def keeps_caps(user: tuple[int, int] | None, argv: list[str]) -> list[str]:
        uid, gid = user or (0, 0)
        return [
            "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=+setuid,+setgid",
            "--ambient-caps=+setuid,+setgid",
            "--",
            *argv,
        ]

    monkeypatch.setattr(sandbox, "_as_user", keeps_caps)
    problem = sandbox.probe()
    assert problem is not None and "the program holds capabilities (CapEff)" in problem


# The family is an int; the kernel reads its low 32 bits. Run by the system's python3.
UNIX_SOCKET_SCRIPT = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for family in (1, 0x100000001, 0xFFFFFFFF00000001):
    ctypes.set_errno(0)
    fd = libc.syscall(ctypes.c_long(41), ctypes.c_ulong(family), ctypes.c_long(1), ctypes.c_long(0))
    print(hex(family), "made" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
"""


def test_an_af_unix_socket_is_refused_whatever_the_high_bits_of_the_family(
    as_root_sandbox: Path,
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the script calls socket(2) by its x86_64 number")
    (as_root_sandbox / "unix.py").write_text(UNIX_SOCKET_SCRIPT)
    done = run(as_root_sandbox, "python3 unix.py")
    assert done.returncode == 0, done.output
    assert done.output.split("\n")[:3] == [
        "0x1 EPERM",
        "0x100000001 EPERM",
        "0xffffffff00000001 EPERM",
    ]


def test_a_workspace_holding_harness_data_is_refused(as_root_sandbox: Path, settings: Any) -> None:
    # Hidden by a tmpfs at its path, the data directory was still reachable: a first run
    # renames its parent (the program's own directory), and at the next run the tmpfs
    # covers the old path while the data sits, visible, under the new name.
    data = as_root_sandbox / "var" / "data"
    data.mkdir(parents=True)
    settings.DATA_DIR = data
    (data / "harness.sqlite3").write_text("the database\n")
    (data / "harness.sqlite3").chmod(0o644)
    with pytest.raises(ToolError, match="holds Harness's own directories"):
        run(as_root_sandbox, "mv var moved")
    with pytest.raises(ToolError, match="holds Harness's own directories"):
        run(as_root_sandbox, "cat moved/data/harness.sqlite3")
    assert (data / "harness.sqlite3").read_text() == "the database\n"


def test_a_writable_server_path_holding_harness_data_is_refused(
    as_root_sandbox: Path, settings: Any
) -> None:
    data = as_root_sandbox / "var" / "data"
    data.mkdir(parents=True)
    settings.DATA_DIR = data
    problem = sandbox_servers.server_path_problem(f"{as_root_sandbox}:rw")
    assert problem is not None and "holds Harness's own state" in problem
    assert sandbox_servers.server_path_problem(f"{as_root_sandbox}:ro") is None


def test_a_hidden_directory_directly_in_the_workspace_cannot_be_renamed_into_view(
    as_root_sandbox: Path, settings: Any
) -> None:
    state = as_root_sandbox / "var"
    state.mkdir()
    settings.DATA_DIR = state
    (state / "harness.sqlite3").write_text("the database\n")
    (state / "harness.sqlite3").chmod(0o644)
    first = run(as_root_sandbox, "mv var moved; echo mv=$?")
    assert "mv=0" not in first.output
    second = run(as_root_sandbox, "cat moved/harness.sqlite3 var/harness.sqlite3")
    assert "the database" not in second.output
    assert state.stat().st_uid == 0
