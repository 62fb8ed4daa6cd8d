"""Red-team attacks on two sandbox changes: HOME as a private tmpfs of each run
(sandbox.HOME), and a stdio MCP server's paths bound by the descriptor of the directory
judged (sandbox_servers.sandboxed_argv, REOPEN). Real programs in the real sandbox."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox, sandbox_servers
from dispatcher.tools.base import ToolError
from tests.redteam.test_sandbox_root_sweep import (  # noqa: F401
    exchanging,
    run_command,
    workspace,
)
from tests.tools.support import require_bwrap


@pytest.fixture
def sandbox_on(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False


# --- a server's read-only path -------------------------------------------------------------


def test_a_read_only_server_path_swapped_before_the_bind_shows_nothing_else(
    sandbox_on: None, tmp_path: Path
) -> None:
    # A read-only path was bound by path (bwrap --ro-bind, as root): a program that can
    # write the directory holding it (another server's writable path, an agent's
    # workspace) exchanging it with a symlink between the check and the mount had bwrap,
    # root, bind the symlink's target: any directory of the host, read by the server.
    outside = tmp_path / "victim"  # a person's directory (say /root/.ssh), readable by all
    outside.mkdir()
    (outside / "f").write_text("theirs\n")
    shared = tmp_path / "shared"  # another server's writable path, holding this one
    (shared / "sub").mkdir(parents=True)
    os.symlink(outside, shared / "alt")
    user = sandbox._owner()
    if user is not None:  # given to the sandbox user, as a writable server path is
        for p in (shared, shared / "sub"):
            os.chown(p, *user)
        os.lchown(shared / "alt", *user)
    stop, thread, swaps = exchanging(shared / "sub", shared / "alt")
    target = shared / "sub"
    leaked = started = 0
    try:
        for attempt in range(1000):  # (most are refused mid-exchange: a few start)
            if attempt >= 150 and started >= 3:
                break
            with contextlib.ExitStack() as held:
                try:
                    argv = sandbox_servers.sandboxed_argv(
                        ["/bin/sh", "-c", 'cat "$0/f"', str(target)], [f"{target}:ro"], held
                    )
                except ToolError:  # (judged mid-exchange: refused, nothing started)
                    continue
                done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
            leaked += b"theirs" in done.stdout
            started += b"No such file" in done.stderr  # the judged directory, bound
    finally:
        stop.set()
        thread.join()
    assert leaked == 0, f"another directory was shown to the server {leaked} times"
    assert swaps[0] > 1000 and started >= 1, (swaps, started)


def test_a_server_with_several_paths_sees_each_and_holds_no_descriptor_of_them(
    sandbox_on: None, tmp_path: Path
) -> None:
    # Every path is bound by a descriptor the launcher opens as root (10 and up, beside
    # the seccomp filter's 3): none may stay open in the server (a descriptor of a
    # directory outlives the bind and leads to its parent with openat("..")).
    one, two, docs = tmp_path / "one", tmp_path / "two", tmp_path / "docs"
    for folder in (one, two, docs):
        folder.mkdir()
    (docs / "d").write_text("doc\n")
    note = tmp_path / "note.txt"
    note.write_text("note\n")
    for path in (docs, tmp_path):
        path.chmod(0o755)
    note.chmod(0o644)
    script = (
        'ls /proc/self/fd; echo a > "$0/a" && echo b > "$1/b" && cat "$2/d" "$3"; '
        'echo x > "$2/x" 2>/dev/null || echo docs-read-only; '
        'echo x > "$3" 2>/dev/null || echo note-read-only; pwd'
    )
    paths = [str(one), f"{two}:rw", f"{docs}:ro", f"{note}:ro"]
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(
            ["/bin/sh", "-c", script, str(one), str(two), str(docs), str(note)], paths, held
        )
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr)
    fds, rest = out.split("\n", 4)[:4], out.split("\n", 4)[4]
    assert fds == ["0", "1", "2", "3"], out  # 3: ls's own reading of /proc/self/fd
    assert rest == f"doc\nnote\ndocs-read-only\nnote-read-only\n{one}\n", out
    assert (one / "a").read_text() == "a\n" and (two / "b").read_text() == "b\n"
    assert not (docs / "x").exists() and note.read_text() == "note\n"


# --- what a server's program needs, found from its command ------------------------------------


def test_a_venv_the_server_may_write_names_no_directory_to_show_it(
    sandbox_on: None, settings: Any, tmp_path: Path
) -> None:
    # program_binds shows a virtual environment's base interpreter, the `home` its
    # pyvenv.cfg names. A venv inside a directory sandboxed programs write (the server's
    # own writable path, an agent's workspace) has a pyvenv.cfg they write: its `home`
    # had bwrap, as root, show the server any directory of the host at the next start
    # (another agent's workspace, /run's sockets), which the server can force by exiting.
    settings.HARNESS_WORKSPACE_ROOT = tmp_path / "workspaces"
    other = tmp_path / "workspaces" / "other-agent"  # another agent's workspace
    other.mkdir(parents=True)
    (other / "f").write_text("theirs\n")
    sandbox.give_to_sandbox(other)
    mine = tmp_path / "server"  # the server's writable path, holding its venv
    (mine / "venv" / "bin").mkdir(parents=True)
    tool = mine / "venv" / "bin" / "tool"
    tool.write_text('#!/bin/sh\ncat "$1/f"\n')
    tool.chmod(0o755)
    # (written by the server's program at its last start: the path is its own)
    (mine / "venv" / "pyvenv.cfg").write_text(f"home = {other}/bin\n")
    with contextlib.ExitStack() as held:
        try:
            argv = sandbox_servers.sandboxed_argv([str(tool), str(other)], [str(mine)], held)
        except ToolError as error:
            assert "pyvenv.cfg" in str(error), error
            return
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert b"theirs" not in done.stdout, "another agent's workspace was shown to the server"
    assert b"No such file" in done.stderr, done.stderr


# --- HOME -------------------------------------------------------------------------------------


def test_no_workspace_lies_in_the_runs_home(sandbox_on: None, settings: Any) -> None:
    # HOME is a tmpfs at /run/home "where no workspace may lie", but a workspace inside
    # Harness's own workspace root passed the system-directory rule (/run): with the root
    # at /run/home/.config, an agent's workspace `pip` (or `hg`, `git`...) was where
    # programs read their per-user configuration, written by the agent.
    root = Path(sandbox.HOME) / ".config"
    settings.HARNESS_WORKSPACE_ROOT = root
    for place in (root / "pip", root / "a" / "b"):
        reason = sandbox.exposed_state(place)
        assert reason is not None and "as HOME" in reason, (place, reason)


def test_a_workspace_in_the_runs_home_runs_nothing(sandbox_on: None, settings: Any) -> None:
    home = Path(sandbox.HOME)
    if home.exists():
        pytest.skip(f"{home} exists on this host")
    root = home / ".config"
    settings.HARNESS_WORKSPACE_ROOT = root
    inside = root / "pip"
    inside.mkdir(parents=True)
    try:
        (inside / "pip.conf").write_text("[global]\nindex-url = http://planted.invalid/\n")
        try:
            out = run_command(inside, ["python3", "-m", "pip", "config", "list"])
        except ToolError as error:
            assert "as HOME" in str(error), error
            return
        assert "planted" not in out, out
    finally:
        shutil.rmtree(home)


def test_a_program_link_the_server_may_write_leads_to_no_directory_shown(
    sandbox_on: None, tmp_path: Path
) -> None:
    # program_binds shows the npm prefix of a named file inside node_modules, for the
    # file as named and for what its symlinks lead to. A link in the server's writable
    # path (an npm prefix it installs into: node_modules/.bin/server) is the server's to
    # point anywhere: at the next start bwrap, as root, showed the project around any
    # node_modules of the host (another agent's workspace, a project under /root, its .env).
    victim = tmp_path / "project"  # someone's project, with its secrets
    (victim / "node_modules" / "x").mkdir(parents=True)
    (victim / "node_modules" / "x" / "index.js").write_text("//\n")
    (victim / ".env").write_text("SECRET=theirs\n")
    mine = tmp_path / "server"  # the server's writable path, an npm prefix
    (mine / "node_modules" / ".bin").mkdir(parents=True)
    link = mine / "node_modules" / ".bin" / "server"
    # (made by the server's program at its last start: the path is its own)
    os.symlink(victim / "node_modules" / "x" / "index.js", link)
    script = 'cat "$1/.env"'
    with contextlib.ExitStack() as held:
        try:
            argv = sandbox_servers.sandboxed_argv(
                ["/bin/sh", "-c", script, str(link), str(victim)], [str(mine)], held
            )
        except ToolError as error:
            assert "sandboxed programs" in str(error), error
            return
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert b"theirs" not in done.stdout, "a directory the link led to was shown to the server"


def test_a_server_whose_program_lies_in_its_writable_path_writes_it(
    sandbox_on: None, tmp_path: Path
) -> None:
    # The npm prefix of a program inside the server's writable path was bound again,
    # read-only and by path, over the writable bind of the descriptor judged: the server
    # could not write its own path, and a symlink exchanged in at the mount was followed.
    mine = tmp_path / "server"
    (mine / "node_modules" / "x").mkdir(parents=True)
    program = mine / "node_modules" / "x" / "run.sh"
    program.write_text('f="${0%/*}/../../f"; echo written > "$f" && cat "$f"\n')
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(["/bin/sh", str(program)], [str(mine)], held)
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert f"--ro-bind {mine} " not in " ".join(argv) + " ", argv
    assert done.stdout == b"written\n", done


# --- what held, locked in ----------------------------------------------------------------------


def test_a_server_started_after_its_descriptors_closed_fails_closed_at_once(
    sandbox_on: None, tmp_path: Path
) -> None:
    # The launcher opens this process's descriptors again by number: once one is closed
    # (the session over) and its number reused for another directory of this process,
    # the launcher bound that one writable. It must stop before bwrap, saying so.
    mine, other = tmp_path / "server", tmp_path / "other"
    for folder in (mine, other):
        folder.mkdir()
    other.chmod(0o777)  # (writable by all: what is bound shows in what is written)
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(
            ["/bin/sh", "-c", 'echo x > "$0/planted"', str(mine)], [str(mine)], held
        )
    spec = next(arg for arg in argv if arg.startswith(f"/proc/{os.getpid()}/fd/"))
    number = int(spec.split("/")[4].split("=")[0])
    reused = os.open(other, os.O_PATH | os.O_DIRECTORY)
    try:
        os.dup2(reused, number)  # (another directory under the number held)
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    finally:
        os.close(reused)
        if number != reused:
            os.close(number)
    assert not (other / "planted").exists(), "the number's new directory was bound"
    assert done.returncode != 0 and b"is gone" in done.stderr, done
    with contextlib.ExitStack() as held:  # and with the number free: gone, at once
        argv = sandbox_servers.sandboxed_argv(["/bin/true"], [str(mine)], held)
    done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    assert done.returncode != 0, done


def test_many_server_paths_take_descriptors_past_the_filters(
    sandbox_on: None, tmp_path: Path
) -> None:
    # Descriptors 10 and up, one a path: none may land on the seccomp filter's 3.
    folders = [tmp_path / f"p{i}" for i in range(12)]
    for folder in folders:
        folder.mkdir()
    paths = [str(f) if i % 2 else f"{f}:ro" for i, f in enumerate(folders)]
    for folder in folders:
        folder.chmod(0o755)
    script = 'for d in "$@"; do [ -d "$d" ] || exit 9; done; ls /proc/self/fd | wc -l'
    with contextlib.ExitStack() as held:
        argv = sandbox_servers.sandboxed_argv(
            ["/bin/sh", "-c", script, "sh", *map(str, folders)], paths, held
        )
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == b"4", done


def test_a_home_left_busy_with_the_sandbox_off_still_gives_the_result(
    workspace: Path,  # noqa: F811 - the fixture
    settings: Any,
) -> None:
    # With HARNESS_SANDBOX=off nothing ends what a program left running: one still writing
    # in the run's HOME made its removal fail, and the call ended in an OSError, not its
    # result. The result stands; the directory is removed as far as it can be.
    settings.HARNESS_SANDBOX = "off"
    script = (
        'setsid sh -c \'i=0; while [ $i -lt 800 ]; do mkdir -p "$HOME/a$i"; '
        "i=$((i+1)); done' 2>/dev/null & "
        'for i in $(seq 20); do mkdir -p "$HOME/x$i/y/z"; done; echo "$HOME"'
    )
    out = run_command(workspace, ["sh", "-c", script])
    home = Path(out.splitlines()[-1])
    try:
        assert out == f"exit code 0\n{home}\n", out
    finally:  # (once the program left running is done)
        time.sleep(4)
        shutil.rmtree(home, ignore_errors=True)


def test_no_per_user_file_is_planted_in_home_within_the_run(workspace: Path) -> None:  # noqa: F811
    # HOME is new at every run, but it was writable: one command an allow rule for `cp`
    # and one for `hg status` let run (`sh -c 'cp -r dot/. /run/home/ && hg status'`,
    # read as those two) copied the agent's .hgrc, .curlrc or user site-packages there
    # and the next program read it. HOME is empty and read-only; caches go to /tmp.
    (workspace / "dot").mkdir()
    (workspace / "dot" / ".curlrc").write_text("output = /tmp/x\n")
    out = run_command(workspace, ["sh", "-c", 'cp -r dot/. "$HOME"/; ls -A "$HOME"'])
    assert ".curlrc" not in out.splitlines(), out
