"""Red team of the sandbox (rtsbx): a sandboxed program must not leave the host a file
that runs as its uid.

The workspace is bound nosuid inside the sandbox only; on the host its file system
usually honours the set-user-ID and set-group-ID bits. A program that made `cp
/usr/bin/python3 p; chmod 6755 p` in its workspace handed the sandbox user (owner of
every workspace when Harness is root) or, when Harness is not root, Harness's own uid
(owner of the data directory and its keys) to anyone on the host who runs `p`. Every
way to set those bits is tried from a real sandbox, as run_command runs it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

SET_ID = stat.S_ISUID | stat.S_ISGID

# Each way of giving a file the set-user-ID or set-group-ID bit, with the result printed.
ATTEMPTS = r"""
import ctypes, os, shutil
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def attempt(name, action):
    try:
        action()
        print(name, "went through")
    except OSError as error:
        print(name, "refused", error.errno)

shutil.copy("/usr/bin/id", "chmodded")
for bits in (0o4755, 0o2755, 0o6755):
    attempt(f"chmod {bits:o}", lambda: os.chmod("chmodded", bits))
    attempt(f"fchmod {bits:o}", lambda: os.fchmod(os.open("chmodded", os.O_RDONLY), bits))

def syscall(number, *args):
    if libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args]) == -1:
        raise OSError(ctypes.get_errno(), "refused")

AT_FDCWD = -100
attempt("fchmodat2", lambda: syscall(452, AT_FDCWD, ctypes.addressof(ctypes.create_string_buffer(b"chmodded")), 0o4755, 0))
attempt("open O_CREAT 4755", lambda: os.open("created-u", os.O_CREAT | os.O_WRONLY, 0o4755))
attempt("open O_CREAT 2755", lambda: os.open("created-g", os.O_CREAT | os.O_WRONLY, 0o2755))
attempt("creat 4755", lambda: syscall(85, ctypes.addressof(ctypes.create_string_buffer(b"creat-u")), 0o4755))

def tmpfile():
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4755)
    os.link(f"/proc/self/fd/{fd}", "tmpfile-u", follow_symlinks=True)

attempt("O_TMPFILE 4755", tmpfile)
attempt("mknod 4755", lambda: os.mknod("mknod-u", stat.S_IFREG | 0o4755))

# openat2 carries its mode in memory: it is not available, and libc does not need it
how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
attempt("openat2", lambda: syscall(437, AT_FDCWD, ctypes.addressof(ctypes.create_string_buffer(b"openat2-u")), ctypes.addressof(how), 24))

# what programs do every day still works
attempt("chmod 755", lambda: os.chmod("chmodded", 0o755))
attempt("chmod 1777 dir", lambda: (os.mkdir("sticky"), os.chmod("sticky", 0o1777)))
attempt("open O_CREAT 755", lambda: os.open("plain", os.O_CREAT | os.O_WRONLY, 0o755))
attempt("open O_RDONLY", lambda: os.close(os.open("plain", os.O_RDONLY)))
"""


def run_command(workspace: Path, argv: list[str]) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="rtsbx", timeout=30, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": argv}))


def test_no_set_user_or_group_id_file_is_made_in_the_workspace(sandboxed_workspace: Path) -> None:
    workspace = sandboxed_workspace
    (workspace / "attempts.py").write_text("import stat\n" + ATTEMPTS)
    out = run_command(workspace, ["python3", "attempts.py"])
    assert out.startswith("exit code 0"), out
    for name in (
        "chmod 4755",
        "chmod 2755",
        "chmod 6755",
        "fchmod 4755",
        "fchmod 2755",
        "fchmod 6755",
        "fchmodat2",
        "open O_CREAT 4755",
        "open O_CREAT 2755",
        "creat 4755",
        "O_TMPFILE 4755",
        "mknod 4755",
    ):
        assert f"{name} refused 1\n" in out, (name, out)
    assert "openat2 refused 38\n" in out, out  # ENOSYS: libc falls back to openat
    for name in ("chmod 755", "chmod 1777 dir", "open O_CREAT 755", "open O_RDONLY"):
        assert f"{name} went through" in out, (name, out)
    # what the host sees: no file of the workspace runs as anyone but its caller
    marked = [
        (path.name, oct(path.lstat().st_mode))
        for path in workspace.rglob("*")
        if path.lstat().st_mode & SET_ID
    ]
    assert marked == [], marked
    assert os.stat(workspace / "chmodded").st_mode & 0o7777 == 0o755
