"""Red team of the sandbox's lookup shell (sandbox.EXEC_SCRIPT) and its out-of-band exec
report (StartReport, descriptor 9) as Harness runs it here (root): real programs in the
real bwrap sandbox, through run_command's own execute.

Found and closed here: a program under a directory the sandbox user may not search was
reported missing ("was not found ... Check the name"), where execve says "Permission
denied" (setpriv said so before the lookup shell); and the report file was opened by the
launcher, as root and following symlinks, by its name in the temporary directory, so a
name swapped there (a TMPDIR another uid may write) had root append to the file it named,
handed that file writable to the sandbox's shell, and lost the report. The last test
keeps what held: no program reaches descriptor 9 or forges a start failure."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.sandbox_user import sandbox_user


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the lookup shell runs only when Harness is root")
    return sandboxed_workspace


def run_command(workspace: Path, argv: list[str]) -> str:
    """run_command as the worker runs it (an exception is what the model is told)."""
    ctx = ExecutionContext(workspace=workspace, call_id="rt6sand", timeout=30, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": argv}))


def test_a_program_behind_a_directory_it_may_not_search_is_not_executable_not_missing(
    workspace: Path,
) -> None:
    # ./private/tool exists; private/ is mode 0 (the sandbox user owns it and may not
    # search it). execve says EACCES; the lookup shell said "not found", and the model was
    # told to check the name of a program that is there.
    private = workspace / "private"
    private.mkdir()
    (private / "tool").write_text("#!/bin/sh\necho ran\n")
    (private / "tool").chmod(0o755)
    (private / "deeper").mkdir()
    private.chmod(0)
    try:
        for argv in (["./private/tool"], ["./private/deeper/tool"]):
            with pytest.raises(ToolError, match="is not executable: Permission denied"):
                run_command(workspace, argv)
        # what is really missing, under directories it may search, still is
        (workspace / "open").mkdir()
        for argv in (["./open/tool"], ["./missing"], ["missing-rt6sand"], ["/no/such/dir/x"]):
            with pytest.raises(ToolError, match="was not found in the sandbox"):
                run_command(workspace, argv)
    finally:
        private.chmod(0o755)


def test_the_exec_report_is_reached_through_harnesss_descriptor_never_its_name(
    workspace: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    # A temporary directory the sandbox user (or any uid but root) may write, and the
    # report's name swapped there for a symlink to a file of the host between its making
    # and the launcher's open, as such a uid may. The launcher (root) opened the name:
    # it appended "No such file or directory" to the host file and handed it, writable, to
    # the sandbox's shell; and the missing program was reported as one that ran (exit 127).
    shared = tmp_path / "tmpdir"
    shared.mkdir()
    user = sandbox_user()
    assert user is not None
    os.chown(shared, *user)
    victim = tmp_path / "host-file"
    victim.write_text("root's own\n")
    made: list[str] = []
    real = tempfile.mkstemp

    def swapped(*args: Any, **kwargs: Any) -> tuple[int, str]:
        fd, name = real(*args, **kwargs)
        os.unlink(name)
        os.symlink(victim, name)
        made.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setattr(tempfile, "mkstemp", swapped)
    with pytest.raises(ToolError, match="was not found in the sandbox"):
        run_command(workspace, ["missing-rt6sand"])
    assert made, "the report was not made in the temporary directory"
    assert victim.read_text() == "root's own\n"
    assert list(shared.iterdir()) == []  # nothing of the report keeps a name
    monkeypatch.undo()
    out = run_command(workspace, ["sh", "-c", "echo ran; exit 3"])
    assert out.startswith("exit code 3\n") and "ran" in out, out


def test_no_program_reaches_descriptor_9_nor_forges_a_start_failure(workspace: Path) -> None:
    # What held: the program, its children and every process it can see hold no
    # descriptor 9 (nor the report file by any number); a program that writes the lookup
    # shell's words and exits 127 or 126 is reported as the program that ran; argv[0] and
    # the arguments reach it unchanged, names with spaces, newlines and globs included.
    probe = (
        "echo 'No such file or directory' >&9 2>/dev/null && echo wrote-9; "
        "( sleep 0.1 & ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -c harness-exec; wait ); "
        "ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -E ' 9 -> ' ; "
        "echo 'No such file or directory'; exit 127"
    )
    out = run_command(workspace, ["sh", "-c", probe])
    assert out.startswith("exit code 127\n"), out
    assert "wrote-9" not in out and " 9 -> " not in out, out
    assert "\n0\n" in out, out  # no process it sees holds the report file
    odd = workspace / "a b*\nc"
    odd.write_text('#!/bin/sh\nprintf "%s|" "$0" "$@"\n')
    odd.chmod(0o755)
    out = run_command(workspace, ["./a b*\nc", "-", "*", "", "x y"])
    assert out.startswith("exit code 0\n") and "./a b*\nc|-|*||x y|" in out, out
    with pytest.raises(ToolError, match="is not executable"):
        run_command(workspace, ["/proc/self/fd/9"])
