"""Red team of the sandbox as Harness runs it here (root): real programs in the real bwrap
sandbox, through run_command's own execute (its environment, its limits) or sandbox.run.

Found and closed here: a program's output taken for the sandbox's own complaint (the call
reported "Nothing ran" after the program ran, its output dropped); a pty's line
discipline, kernel code loaded on demand, a program's to change; and the core dump
limit, which a core_pattern pipe's helper (run as host root at a crash) ignores unless
it is 1, a program's to lower. The last test keeps what held."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.sandbox_user import SandboxUnavailable


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    return sandboxed_workspace


def run_command(workspace: Path, argv: list[str]) -> str:
    """run_command as the worker runs it (an exception is what the model is told)."""
    ctx = ExecutionContext(
        workspace=workspace, call_id="rtsandbox", timeout=30, output_limit=20_000
    )
    return str(RUN_COMMAND.execute(ctx, {"argv": argv}))


def python(workspace: Path, code: str) -> str:
    return run_command(workspace, ["python3", "-c", code])


# --- the program's words are not the sandbox's ---------------------------------------------


def test_a_program_that_prints_bwraps_complaint_is_reported_as_the_program_that_ran(
    workspace: Path,
) -> None:
    # The first line "bwrap: ..." with exit status 1 was taken for bubblewrap's failure to
    # set the sandbox up: the call ended in "The sandbox could not start the command ...
    # Nothing ran; an operator must look at the sandbox configuration", after the program
    # ran (and wrote `proof`), and everything else it printed was dropped.
    out = run_command(
        workspace,
        [
            "sh",
            "-c",
            'echo ran > proof; echo "bwrap: Can\'t mount proc on /newroot/proc"; '
            "echo 'what it did besides'; exit 1",
        ],
    )
    assert (workspace / "proof").read_text() == "ran\n"
    assert out.startswith("exit code 1\n"), out
    assert "what it did besides" in out, out


def test_a_program_that_prints_setprivs_complaint_keeps_its_output(workspace: Path) -> None:
    # setpriv (which starts the program as the sandbox user) says "failed to execute" and
    # exits 126 or 127 when the program is missing; a program that said so itself had all
    # else it printed dropped, and the call read "Command 'sh' was not found".
    out = run_command(
        workspace,
        [
            "sh",
            "-c",
            "printf 'setpriv: failed to execute sh: No such file or directory\\n"
            "removed what it removed\\n'; exit 127",
        ],
    )
    assert out.startswith("exit code 127\n"), out
    assert "removed what it removed" in out, out


def test_a_program_whose_whole_output_is_setprivs_complaint_is_reported_as_it_ran(
    workspace: Path,
) -> None:
    # Its whole output one "setpriv: failed to execute X: No such file or directory" line
    # and status 127: the call read "Command ... was not found in the sandbox" (the model
    # told the program does not exist) after it ran and wrote `proof`. Whether the program
    # was executed is told out of band now (sandbox.EXEC_FD), never read from its output.
    forged = workspace / "forged"
    forged.write_text(
        "#!/bin/sh\necho ran > proof\n"
        "echo 'setpriv: failed to execute ./forged: No such file or directory'\nexit 127\n"
    )
    forged.chmod(0o755)
    for argv in (["./forged"], ["sh", "-c", "echo ran > proof; exec ./forged"]):
        (workspace / "proof").unlink(missing_ok=True)
        out = run_command(workspace, argv)
        assert (workspace / "proof").read_text() == "ran\n"
        assert out.startswith("exit code 127\n"), out
        assert "setpriv: failed to execute ./forged: No such file or directory" in out, out
    forged.write_text(
        "#!/bin/sh\necho 'setpriv: failed to execute ./forged: Permission denied'\nexit 126\n"
    )
    out = run_command(workspace, ["./forged"])
    assert out.startswith("exit code 126\n"), out


def test_the_sandboxs_own_failures_are_still_told_apart(workspace: Path) -> None:
    # What the distinction must not lose: a program that is not there, one that is not
    # executable, and bwrap failing its setup (a working directory it cannot enter).
    with pytest.raises(ToolError, match="was not found in the sandbox"):
        run_command(workspace, ["no-such-program-rtsandbox"])
    with pytest.raises(ToolError, match="was not found in the sandbox"):
        run_command(workspace, ["./no-such-program-rtsandbox"])
    (workspace / "plain.sh").write_text("echo hi\n")
    with pytest.raises(ToolError, match="is not executable"):
        run_command(workspace, ["./plain.sh"])
    # A program found runs whatever its name: one named like an option of the shell that
    # looks it up, and one reached through PATH.
    (workspace / "-x").write_text('#!/bin/sh\necho dash-x ran "$@"\n')
    (workspace / "-x").chmod(0o755)
    assert "dash-x ran a" in run_command(workspace, ["./-x", "a"])
    assert run_command(workspace, ["echo", "hi"]).strip().endswith("hi")
    with pytest.raises(SandboxUnavailable, match="Nothing ran"):
        sandbox.run(
            ["true"],
            workspace=workspace,
            cwd=workspace / "not-there",
            env={"PATH": "/usr/bin:/bin"},
            limits=sandbox.Limits(timeout=30, output_chars=2000),
        )


# --- kernel code a program reaches ----------------------------------------------------------


LINE_DISCIPLINE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
master, tty = os.openpty()
print("pty", os.ttyname(tty))
n_tty = ctypes.c_int(0)
for request in (0x5423, 0x100005423):  # TIOCSETD; and with bits the kernel ignores
    result = libc.syscall(16, tty, ctypes.c_ulong(request), ctypes.byref(n_tty))
    print("TIOCSETD", hex(request), "set" if result == 0 else f"refused {ctypes.get_errno()}")
"""


def test_a_ptys_line_discipline_is_not_the_programs_to_change(workspace: Path) -> None:
    # The sandbox's /dev has ptys (/dev/ptmx). TIOCSETD attaches a line discipline to one:
    # N_HDLC, N_GSM0710, N_NULL ..., kernel code no tool needs, each loaded as a module on
    # demand where the kernel autoloads them (dev.tty.ldisc_autoload, 1 by default), as the
    # socket families the filter refuses were. Setting N_TTY (always there) succeeded.
    out = python(workspace, LINE_DISCIPLINE)
    assert "pty /dev/pts/" in out, out
    assert out.count("refused 1") == 2, out
    assert " set" not in out, out


CORE_LIMIT = r"""
import ctypes, os, resource, subprocess
print("core", resource.getrlimit(resource.RLIMIT_CORE))
for limit in ((0, 0), (0, 1), (1, 1)):
    try:
        resource.setrlimit(resource.RLIMIT_CORE, limit)
        print("changed to", limit)
    except (OSError, ValueError) as error:
        print("refused", getattr(error, "errno", error))
libc = ctypes.CDLL(None, use_errno=True)
zero = (ctypes.c_ulong * 2)(0, 0)
print("setrlimit", libc.syscall(160, 4, zero), ctypes.get_errno())  # the old call itself
print("core after", resource.getrlimit(resource.RLIMIT_CORE))
crash = subprocess.run(["python3", "-c", "import os; os.kill(os.getpid(), 11)"])
print("crashed", crash.returncode, sorted(name for name in os.listdir(".") if "core" in name))
"""


def test_a_crash_reaches_no_core_dump_helper(workspace: Path) -> None:
    # With core_pattern a pipe (apport on Ubuntu, systemd-coredump on systemd hosts) a
    # crash starts that helper as root in the host's namespaces, reading the crashing
    # process's memory and /proc, whatever RLIMIT_CORE is, 0 included: only a limit of 1
    # stops it (and no core file is that small). The limit was 0, and a program could set
    # it to 0 again from 1 anyway: lowering a limit needs no privilege.
    out = python(workspace, CORE_LIMIT)
    assert "core (1, 1)" in out, out
    assert "changed to" not in out, out
    assert out.count("refused") == 3, out  # (Python says EPERM as "not allowed to raise")
    assert "setrlimit -1 1" in out, out  # EPERM
    assert "core after (1, 1)" in out, out
    assert "crashed -11 []" in out, out  # and no core file where it crashed


# --- what held ----------------------------------------------------------------------------------


HELD = r"""
import ctypes, errno, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, action):
    try:
        print(name, "open", str(action())[:80])
    except OSError as error:
        print(name, "blocked", error.errno)
print("env", sorted(os.environ))
print("fds", sorted(os.listdir("/proc/self/fd")))
for pid in sorted(p for p in os.listdir("/proc") if p.isdigit()):
    attempt(f"environ {pid}", lambda: open(f"/proc/{pid}/environ", "rb").read())
attempt("kill 1", lambda: os.kill(1, signal.SIGKILL))
attempt("sysrq", lambda: open("/proc/sysrq-trigger", "w").write("h"))
attempt("core_pattern", lambda: open("/proc/sys/kernel/core_pattern", "w").write("|/x"))
attempt("link passwd", lambda: os.link("/usr/bin/passwd", "passwd"))
attempt("mem of 1", lambda: open("/proc/1/mem", "rb"))
attempt("cwd of 1", lambda: os.listdir("/proc/1/cwd"))
attempt("redis", lambda: socket.create_connection(("127.0.0.1", 6379), timeout=2))
attempt("postgres", lambda: socket.create_connection(("127.0.0.1", 5432), timeout=2))
attempt("run", lambda: os.listdir("/run/postgresql"))
attempt("var lib", lambda: os.listdir("/var/lib"))
attempt("root home", lambda: os.listdir("/root"))
attempt("modify_ldt", lambda: libc.syscall(154, 0, None, 0) or os.strerror(ctypes.get_errno()))
print("setid", libc.syscall(90, b"mine", 0o4755), ctypes.get_errno())  # chmod u+s of nothing
"""


def test_what_a_program_reaches_of_the_host_held(workspace: Path) -> None:
    out = python(workspace, HELD)
    lines = out.splitlines()
    env = next(line for line in lines if line.startswith("env "))
    assert "HARNESS" not in env and "DATABASE" not in env and "REDIS" not in env, env
    assert "SECRET" not in out, out
    assert "fds ['0', '1', '2', '3']" in out, out  # 3: listdir's own; no status pipe
    opened = [line for line in lines if " open " in line and not line.startswith("modify_ldt")]
    assert not [line for line in opened if not line.startswith("environ ")], out
    # the only environ readable is the program's own processes', the scrubbed one
    for line in (line for line in lines if line.startswith("environ ") and " open " in line):
        assert "HARNESS_SECRET" not in line and "DATABASE_URL" not in line, line
    assert "setid -1 1" in out, out
