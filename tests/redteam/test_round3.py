"""Red-team, round 3: attacks on b73677b (a preview's program runs under `timeout
--foreground`, so stopping a preview early kills it) and ec436be (a team admin's analytics
suggest rules only for people wholly within their teams). Each test is an attack; it
passes when the attack fails."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import preview, sandbox, workspace_lock
from dispatcher.tools.run_command import scrubbed_environment
from tests.tools.support import require_bwrap

# --- Previews: nothing a previewed program starts outlives the preview ------------------

LIMIT = 3  # HARNESS_PREVIEW_TIMEOUT in these attacks
SLACK = 2 + 4  # `timeout -k 2`, then the tar, the cgroup's removal and a busy machine


@pytest.fixture
def workspace(settings: Any, tmp_path: Path) -> Iterator[Path]:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW_TIMEOUT = LIMIT
    settings.HARNESS_PREVIEW_MAX_BYTES = 4 << 20
    root = tmp_path / "workspaces"
    settings.HARNESS_WORKSPACE_ROOT = root
    mine = root / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("alpha\nbeta\n")
    (mine / "src").mkdir()
    (mine / "src" / "a.py").write_text("print('a')\n")
    yield mine


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    found: dict[str, tuple[int, int, bytes]] = {}
    for top, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(top, name)
            info = path.lstat()
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, data)
    return found


def _marked(mark: str) -> list[int]:
    """Processes of this machine whose command line or environment holds `mark`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                if mark.encode() in Path(f"/proc/{entry}/{part}").read_bytes():
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


def _gone(mark: str, within: float = 10) -> bool:
    """Whether every process marked `mark` is gone within `within` seconds (a killed
    process disappears once the kernel has reaped it)."""
    deadline = time.monotonic() + within
    while _marked(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _attack(workspace: Path, script: str, mark: str) -> tuple[preview.Effect, float]:
    """Preview `sh -c script` (RT3MARK=mark in its environment, the mark in its argv);
    returns the effect and the wall-clock seconds the preview took to return."""
    before = _tree(workspace)
    started = time.monotonic()
    with workspace_lock.held(workspace):
        effect = preview.run_preview(
            ["env", f"RT3MARK={mark}", "sh", "-c", script, mark],
            cwd=workspace,
            workspace=workspace,
            env=scrubbed_environment(workspace),
        )
    took = time.monotonic() - started
    preview.discard(effect.store)
    assert _tree(workspace) == before  # the preview wrote nothing of the workspace
    return effect, took


def _mark() -> str:
    return f"rt3{uuid.uuid4().hex[:12]}"


# Each: a program that tries to keep running past its preview. Those whose main process
# exits at once end the preview at once (bwrap's pid 1 ends, and the PID namespace with
# it); the others run into the time limit.
ESCAPES = {
    "ignores_sigterm_and_sighup": (
        "trap '' TERM HUP INT QUIT USR1; while :; do sleep 0.2; done",
        "time",
    ),
    "python_ignores_every_catchable_signal": (
        "exec python3 -c 'import signal,time\n"
        "for s in signal.valid_signals():\n"
        "    try: signal.signal(s, signal.SIG_IGN)\n"
        "    except (OSError, ValueError): pass\n"
        "while True: time.sleep(0.2)'",
        "time",
    ),
    "setsid_fork_then_exit": ("setsid -f sh -c 'trap \"\" TERM HUP; sleep 60'; exit 0", ""),
    "setsid_fork_then_wait": ("setsid -f sh -c 'trap \"\" TERM HUP; sleep 60'; sleep 60", "time"),
    "nohup_background_then_exit": ("nohup sleep 60 >/dev/null 2>&1 & exit 0", ""),
    "subshell_background_keeps_stdout": ("(trap '' TERM HUP; sleep 60) & exit 0", ""),
    "python_double_fork_daemon": (
        "python3 -c 'import os,time\n"
        "if os.fork(): os._exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): os._exit(0)\n"
        'os.chdir("/")\n'
        "for fd in range(3): os.close(fd)\n"
        "time.sleep(60)'; sleep 60",
        "time",
    ),
    "exec_under_another_name": ("exec bash -c 'exec -a innocent sleep 60'", "time"),
    "blocks_reading_a_fifo": ("mkfifo /tmp/f; cat /tmp/f", "time"),
    "blocks_reading_stdin": ("cat; sleep 60", "time"),
    "closes_stdout_and_keeps_running": ("exec >&- 2>&-; trap '' TERM; sleep 60", "time"),
    "stops_itself": ("sleep 60 & kill -STOP $$; sleep 60", "time"),
    "output_past_the_cap_then_ignores_sigterm": (
        "trap '' TERM HUP; head -c 9000000 /dev/zero; sleep 60",
        "output",
    ),
    "daemon_writes_past_the_cap_after_the_parent_exited": (
        "setsid -f sh -c 'sleep 0.3; head -c 9000000 /dev/zero; sleep 60'; sleep 60",
        "output",
    ),
    "fork_bomb_under_the_pids_limit": (
        "b() { b | b & }; b; sleep 60",
        "time",
    ),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_a_previewed_program_does_not_outlive_its_preview(workspace: Path, name: str) -> None:
    script, limit = ESCAPES[name]
    mark = _mark()
    effect, took = _attack(workspace, script, mark)
    if limit == "time":
        assert effect.limit in ("time", "memory", "output"), effect
        assert took < LIMIT + SLACK, took
    elif limit == "output":
        assert effect.limit == "output", effect
        assert took < LIMIT, took  # stopped for its output at once, not at the time limit
    else:
        assert effect.limit == "", effect
        assert took < LIMIT, took  # the main process's exit ends the sandbox at once
    assert _gone(mark), (name, _marked(mark))


def test_a_background_child_of_a_normal_run_is_killed_with_it(workspace: Path) -> None:
    """sandbox.run (run_command's real run) is unaffected: a daemon it starts dies when
    the program exits, and a program that ignores SIGTERM dies at the time limit."""
    mark = _mark()
    env = scrubbed_environment(workspace)
    limits = sandbox.Limits(timeout=20, output_chars=10_000)
    argv = ["env", f"RT3MARK={mark}", "sh", "-c", "setsid -f sleep 60; echo started", mark]
    done = sandbox.run(argv, workspace=workspace, cwd=workspace, env=env, limits=limits)
    assert (done.returncode, done.output.strip()) == (0, "started")
    assert _gone(mark)

    mark = _mark()
    argv = ["env", f"RT3MARK={mark}", "sh", "-c", "trap '' TERM; sleep 60", mark]
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        sandbox.run(
            argv,
            workspace=workspace,
            cwd=workspace,
            env=env,
            limits=sandbox.Limits(timeout=2, output_chars=100),
        )
    assert time.monotonic() - started < 2 + SLACK
    assert _gone(mark)

    (workspace / "out.txt").unlink(missing_ok=True)
    done = sandbox.run(
        ["sh", "-c", "echo written > out.txt; cat out.txt"],
        workspace=workspace,
        cwd=workspace,
        env=env,
        limits=limits,
    )
    assert done.output.strip() == "written"
    assert (workspace / "out.txt").read_text() == "written\n"  # a real run writes


def test_a_preview_that_ends_normally_still_reports_its_exit(workspace: Path) -> None:
    """--foreground changed nothing of a program that ends by itself: its status, its
    output and its effect are as before."""
    mark = _mark()
    effect, took = _attack(workspace, "echo hi; echo new > made.txt; exit 3", mark)
    assert (effect.exit_status, effect.limit, effect.output.strip()) == (3, "", "hi")
    assert [c["path"] for c in effect.changes] == ["made.txt"]
    assert took < LIMIT


def test_the_scan_sees_a_previewed_program_while_it_runs(workspace: Path) -> None:
    """The attacks above mean something: their mark is found while the program runs (as
    the sandbox user, in its own PID namespace), and gone once the preview has returned."""
    mark = _mark()
    seen: list[list[int]] = []

    def watch() -> None:
        deadline = time.monotonic() + LIMIT
        while time.monotonic() < deadline and not seen:
            if found := _marked(mark):
                seen.append(found)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    effect, took = _attack(workspace, "trap '' TERM; setsid -f sleep 60; sleep 60", mark)
    watcher.join()
    assert seen and seen[0], "the mark was never seen: the scan would find nothing"
    assert effect.limit == "time" and took < LIMIT + SLACK
    assert _gone(mark)
