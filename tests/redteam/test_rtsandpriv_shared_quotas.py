"""What the kernel counts per host uid, which every sandboxed program shares (the sandbox
user when Harness is root, Harness's own uid otherwise): one program, A, takes all it can
and holds it while another, B (another agent's, in another workspace), starts.

Measured here (Linux 6.18, as root, default limits): A took 128 inotify instances, 9 POSIX
message queues of 80 KiB (819200 bytes, RLIMIT_MSGQUEUE) and 96367 queued real-time
signals (RLIMIT_SIGPENDING); while it held them B could make no inotify instance
(EMFILE), no message queue (EMFILE) and queue no real-time signal (EAGAIN). Message
queues are closed here: the launcher sets RLIMIT_MSGQUEUE to 0, so no program holds any
(docs/security.md, "What is left"). Harness itself, root, keeps its own."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox

# Takes what it can of each per-uid count (or, with "check", one of each) and prints it;
# with "hold" it then says so in a file and keeps everything until the file "done" exists.
PROGRAM = r"""
import ctypes, errno, json, os, resource, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
def error(): return errno.errorcode.get(ctypes.get_errno(), "?")
most = 1 if sys.argv[1] == "check" else 1000000
took = {}
held = []
while len(held) < most:
    fd = libc.inotify_init1(0)
    if fd < 0: break
    held.append(fd)
took["inotify"] = (len(held), "ok" if len(held) == most else error())
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
queues = []
while len(queues) < min(most, 1000):
    attr = Attr(0, 10, 8192, 0)
    q = rt.mq_open(f"/q{len(queues)}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
    if q < 0: break
    queues.append(q)
took["mqueue"] = (len(queues), "ok" if len(queues) == most else error())
try:
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (819200, 819200))
    took["raise"] = "raised"
except ValueError:  # (Python's word for EPERM here)
    took["raise"] = "EPERM"
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
class Value(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
queued = 0
while queued < most and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), Value(1)) == 0:
    queued += 1
took["sigqueue"] = (queued, "ok" if queued == most else error())
print(json.dumps(took), flush=True)
if sys.argv[1] == "hold":
    open("holding", "w").close()
    while not os.path.exists("done"):
        time.sleep(0.05)
"""


def _run(workspace: Path, mode: str) -> str:
    done = sandbox.run(
        ["python3", "program.py", mode],
        workspace=workspace,
        cwd=workspace,
        env={"PATH": "/usr/bin:/bin", "HOME": sandbox.HOME},
        limits=sandbox.Limits(timeout=120, output_chars=4000),
    )
    assert done.returncode == 0, done.output
    return done.output


def _took(output: str) -> dict[str, Any]:
    value = json.loads(output)
    assert isinstance(value, dict), output
    return value


@pytest.fixture
def two(sandboxed_workspace: Path) -> tuple[Path, Path]:
    other = sandboxed_workspace.parent / "other-agent"
    other.mkdir()
    for workspace in (sandboxed_workspace, other):
        (workspace / "program.py").write_text(PROGRAM)
    return sandboxed_workspace, other


def test_a_program_takes_no_message_queue_bytes_from_another(two: tuple[Path, Path]) -> None:
    a, b = two
    alone = _took(_run(b, "check"))
    results: dict[str, str] = {}
    holder = threading.Thread(target=lambda: results.setdefault("a", _run(a, "hold")))
    holder.start()
    try:
        while not (a / "holding").exists():
            assert holder.is_alive(), results
            time.sleep(0.05)
        during = _took(_run(b, "check"))
        if os.geteuid() == 0:  # Harness itself, root, keeps its own inotify instances
            harness_inotify = ctypes.CDLL(None, use_errno=True).inotify_init1(0)
            assert harness_inotify >= 0, "Harness (root) lost its inotify instances"
            os.close(harness_inotify)
    finally:
        (a / "done").touch()
        holder.join(timeout=60)
    took = _took(results["a"])
    # A holds no message queue (RLIMIT_MSGQUEUE is 0, and its hard limit is not its to raise)
    assert took["mqueue"][0] == 0 and took["raise"] == "EPERM", took
    # so what B can do with them is what it could do alone (none either)
    assert during["mqueue"] == alone["mqueue"], (alone, during)
    # what the sandbox user's other counts still share (docs/security.md): A filled them
    assert took["inotify"][1] == "EMFILE" and took["sigqueue"][1] == "EAGAIN", took
