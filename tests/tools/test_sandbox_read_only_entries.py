"""HARNESS_SANDBOX_READ_ONLY entries are bound by the descriptor of what was judged.

Judged by path, then bound by path (bwrap's --ro-bind-try), an entry was looked up twice:
whoever could change a step of its way between the two (a host user who owns a directory
on it, which the judge lets through as no sandboxed program's) had bwrap, as root, show
every program what the judge refuses: Harness's data directory, another agent's
workspace. Now each step is held by an O_PATH descriptor as it is judged, and bwrap binds
the last one (--ro-bind-fd), so what is shown is exactly what was judged, or nothing.

An entry that is itself where sandboxed programs write (a directory the sandbox user
owns: an agent's workspace, a server's writable path) is refused too: what one agent's
program wrote there, every other agent's program read and ran."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, sandbox, sandbox_servers, workspace_lock
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.run_command import scrubbed_environment
from tests.tools.support import require_bwrap

SECRET = "HARNESS-DATA-ROW"
TOOL = "an admin's tool"
OTHER_USER = 4242  # a host user who is neither root nor the sandbox user
RENAME_EXCHANGE = 2
BWRAP_REFUSED = "The sandbox could not start the command"


def _sh(workspace: Path, script: str) -> str:
    """`sh -c script` through run_command: its output, or the refusal."""
    ctx = ExecutionContext(workspace=workspace, call_id="ro", timeout=30, output_limit=4000)
    try:
        return str(RUN_COMMAND.execute(ctx, {"argv": ["sh", "-c", script]}))
    except ToolError as refused:
        return f"refused: {refused}"


def _exchange(first: Path, second: Path) -> None:
    """renameat2(RENAME_EXCHANGE): the two names swap at once (neither ever missing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    done = libc.renameat2(
        at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), RENAME_EXCHANGE
    )
    if done != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


@pytest.fixture
def owner(settings: Any) -> tuple[int, int]:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    user = sandbox._owner()
    if os.geteuid() != 0 or user is None:
        # (unprivileged, every directory the test can make is Harness's own, where programs
        # write: tests/redteam/test_rtsandnr_unprivileged_entries.py runs these as 65534)
        pytest.skip("needs directories other users own, which only root can make here")
    return user


@pytest.fixture
def layout(owner: tuple[int, int], settings: Any, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A workspace; Harness's data directory holding a row the sandbox user could read
    were it shown; and an entry, opt/shared/tools, in a directory another host user owns
    (shared), with a symlink beside it to the data directory."""
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the sandbox user passes through
    root = tmp_path / "workspaces"
    workspace = root / "mine"
    workspace.mkdir(parents=True)
    settings.HARNESS_WORKSPACE_ROOT = root
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "row.txt").write_text(f"{SECRET}\n")
    settings.DATA_DIR = data
    shared = tmp_path / "opt" / "shared"
    (shared / "tools").mkdir(parents=True)
    (shared / "tools" / "tool.txt").write_text(f"{TOOL}\n")
    (shared / "decoy").symlink_to(data)
    os.chown(shared, OTHER_USER, OTHER_USER)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(shared / "tools")]
    yield {"workspace": workspace, "data": data, "shared": shared, "entry": shared / "tools"}


def test_an_entry_judged_safe_is_shown(layout: dict[str, Path]) -> None:
    entry = layout["entry"]
    assert sandbox.read_only_problem(str(entry)) is None
    out = _sh(layout["workspace"], f'cat "{entry}/tool.txt"; touch "{entry}/new"')
    assert TOOL in out and "Read-only file system" in out, out
    # a symlink to Harness's data directory, as the entry, is refused
    assert sandbox.read_only_problem(str(layout["shared"] / "decoy")) == (
        f"lies in {layout['data']}, Harness's own state"
    )


def test_an_entry_swapped_after_it_was_judged_shows_what_was_judged(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The owner of opt/shared swaps the entry for the symlink to the data directory once
    # the command line is built (everything judged by then), before bwrap mounts it.
    entry, decoy = layout["entry"], layout["shared"] / "decoy"
    build = sandbox.bwrap_command

    def build_then_swap(*args: Any, **kwargs: Any) -> list[str]:
        command = build(*args, **kwargs)
        _exchange(entry, decoy)
        return command

    monkeypatch.setattr(sandbox, "bwrap_command", build_then_swap)
    out = _sh(layout["workspace"], f'cat "{entry}/tool.txt" "{entry}/row.txt"')
    assert SECRET not in out, out
    assert TOOL in out, out
    assert entry.is_symlink()  # (it was swapped)


def _swapping(entry: Path, decoy: Path) -> Callable[[], None]:
    """Start swapping `entry` with `decoy` over and over; returns what stops it."""
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        while not stop.is_set():
            _exchange(entry, decoy)
            swaps[0] += 1

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()

    def finish() -> None:
        stop.set()
        thread.join()
        assert swaps[0] > 0
        if entry.is_symlink():  # (back as it was)
            _exchange(entry, decoy)

    return finish


def test_an_entry_swapped_over_and_over_never_shows_what_the_judge_refuses(
    layout: dict[str, Path],
) -> None:
    # The same, racing: each run is either refused (the judge saw the symlink; or bwrap,
    # which binds the descriptor's path and checks that what it mounted is the
    # descriptor's, found it moved meanwhile) or shows the tool (the directory judged);
    # the data directory never.
    entry = layout["entry"]
    finish = _swapping(entry, layout["shared"] / "decoy")
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(seen) < 40:
            seen.append(_sh(layout["workspace"], f'cat "{entry}/row.txt" "{entry}/tool.txt"'))
    finally:
        finish()
    leaked = [out for out in seen if SECRET in out]
    assert not leaked, f"{len(leaked)} of {len(seen)} runs read the data directory: {leaked[0]}"
    shown = [out for out in seen if TOOL in out]
    refused = [out for out in seen if out.startswith("refused: ")]
    odd = [out for out in seen if out not in shown and out not in refused]
    assert not odd, odd
    for out in refused:
        assert "HARNESS_SANDBOX_READ_ONLY entry" in out or BWRAP_REFUSED in out, out


def test_a_missing_entry_binds_nothing_and_stops_nothing(
    layout: dict[str, Path], settings: Any
) -> None:
    entry = layout["shared"] / "later"
    settings.HARNESS_SANDBOX_READ_ONLY = [str(entry), str(layout["entry"])]
    assert sandbox.read_only_problem(str(entry)) is None
    out = _sh(layout["workspace"], f'ls "{entry}"; cat "{layout["entry"]}/tool.txt"')
    assert "No such file or directory" in out and TOOL in out, out
    assert sandbox.read_only_extras() == [layout["entry"]]


def test_an_entry_the_sandbox_user_owns_is_refused(
    layout: dict[str, Path], owner: tuple[int, int], settings: Any
) -> None:
    # In a directory only root writes, the entry itself is a workspace (or a server's
    # writable path): given to the sandbox user, what alice's program wrote there bob's
    # command read, and ran. Through a symlink an admin made, the same.
    alice, bob = layout["shared"].parent / "alice", layout["workspace"]
    alice.mkdir()
    (alice / "tool.sh").write_text("echo planted-by-alice\n")
    os.chown(alice, *owner)
    os.chown(alice / "tool.sh", *owner)
    (layout["shared"].parent / "link").symlink_to(alice)
    for entry in (alice, layout["shared"].parent / "link"):
        settings.HARNESS_SANDBOX_READ_ONLY = [str(entry)]
        problem = f"leads to {alice}, which sandboxed programs may write"
        assert sandbox.read_only_problem(str(entry)) == problem
        out = _sh(bob, f'sh "{alice}/tool.sh"')
        assert "planted-by-alice" not in out, out
        assert out.startswith("refused: "), out
        assert f"HARNESS_SANDBOX_READ_ONLY entry {entry} {problem}" in out, out


def test_an_entry_others_may_write_is_refused(layout: dict[str, Path], settings: Any) -> None:
    # a world-writable file (or directory) is the sandbox user's to write as well
    tool = layout["entry"] / "tool.txt"
    tool.chmod(0o666)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(tool)]
    assert sandbox.read_only_problem(str(tool)) == (
        f"leads to {tool}, which sandboxed programs may write"
    )
    tool.chmod(0o644)
    assert sandbox.read_only_problem(str(tool)) is None
    out = _sh(layout["workspace"], f'cat "{tool}"')
    assert TOOL in out, out


def test_a_server_sees_the_entry_judged_when_it_starts(layout: dict[str, Path]) -> None:
    # A stdio server's sandbox binds the entries by the descriptors this process holds
    # (its launcher opens them again, as it does the server's own paths): swapped after
    # the judgement, the entry still shows the directory judged, never the data.
    entry, decoy = layout["entry"], layout["shared"] / "decoy"
    script = f'cat "{entry}/tool.txt" "{entry}/row.txt" 2>&1; exit 0'
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(["/bin/sh", "-c", script], [], held)
        _exchange(entry, decoy)
        done = subprocess.run(
            argv,
            env=sandbox_servers.LAUNCHER_ENVIRONMENT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
    out = done.stdout.decode()
    assert SECRET not in out, out
    assert TOOL in out, (out, done.stderr)


def test_a_preview_sees_the_entry_judged(
    layout: dict[str, Path], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The preview runs bwrap in a mount namespace of its own: the entries' descriptors
    # reach it through that namespace's script, and the entry judged is what it shows,
    # swapped after the judgement too.
    settings.HARNESS_PREVIEW_TIMEOUT = 10
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    workspace, entry = layout["workspace"], layout["entry"]
    build = sandbox.bwrap_command

    def build_then_swap(*args: Any, **kwargs: Any) -> list[str]:
        command = build(*args, **kwargs)
        _exchange(entry, layout["shared"] / "decoy")
        return command

    monkeypatch.setattr(sandbox, "bwrap_command", build_then_swap)
    argv = ["sh", "-c", f'cat "{entry}/tool.txt" "{entry}/row.txt" 2>&1; exit 0']
    with workspace_lock.held(workspace):
        effect = preview.run_preview(
            argv, cwd=workspace, workspace=workspace, env=scrubbed_environment(workspace)
        )
    try:
        assert TOOL in effect.output and SECRET not in effect.output, effect.output
    finally:
        preview.discard(effect.store)


# Run in a process of its own with a low RLIMIT_NOFILE: as the walk of the entries starts
# (the run's checks of its workspace before it had their descriptors), every descriptor
# but one is taken; the walk opens `/` with it and finds none for its first step.
OUT_OF_DESCRIPTORS = r"""
import os, resource, sys
from pathlib import Path
import django
django.setup()
from django.conf import settings
settings.HARNESS_SANDBOX = "bwrap"
settings.HARNESS_SANDBOX_NETWORK = False
settings.HARNESS_SANDBOX_READ_ONLY = [sys.argv[1]]
settings.HARNESS_WORKSPACE_ROOT = Path(sys.argv[3])
from dispatcher.tools import sandbox
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL
workspace = Path(sys.argv[2])
ctx = ExecutionContext(workspace=workspace, call_id="fd", timeout=30, output_limit=4000)
print("WARM", TOOL.execute(ctx, {"argv": ["true"]}).splitlines()[0], flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
judge = sandbox._judged_read_only_entries

def short_of_descriptors(held_by_caller):
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    os.close(held.pop())
    try:
        return judge(held_by_caller)
    finally:
        for fd in held:
            os.close(fd)

sandbox._judged_read_only_entries = short_of_descriptors
try:
    said = "RAN " + TOOL.execute(ctx, {"argv": ["touch", "made"]})
except ToolError as refused:
    said = f"REFUSED {refused}"
print(said, flush=True)
"""


def test_harness_out_of_descriptors_says_so_and_runs_nothing(layout: dict[str, Path]) -> None:
    # (the step it could not open was taken for one a program may have placed: "reaches
    # ..., which lies in a directory sandboxed programs may write", an operator sent to
    # look for a fault in a sound entry)
    workspace, entry = layout["workspace"], layout["entry"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            OUT_OF_DESCRIPTORS,
            str(entry),
            str(workspace),
            str(workspace.parent),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )
    assert "WARM exit code 0" in done.stdout, (done.stdout, done.stderr)
    said = done.stdout.split("WARM exit code 0", 1)[1]
    assert "REFUSED Harness ran out of file descriptors" in said, (said, done.stderr)
    assert "this process has none left: EMFILE" in said and str(entry) in said, said
    assert "try again" in said and "sandboxed programs may write" not in said, said
    assert not (workspace / "made").exists()  # fail closed: nothing ran
