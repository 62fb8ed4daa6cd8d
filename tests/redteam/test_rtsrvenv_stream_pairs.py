"""Red team of the sandbox (rtsrvenv): a connected Unix socket pair reaches no host socket.

socketpair(AF_UNIX) stays allowed for streams and sequenced packets (a program's pipes
between its own processes); the datagram kinds are refused (test_rtsbx_unix_datagrams).
A connected pair whose peer was closed, or shut down, is connected still: connect() to a
host's abstract socket of its kind (the host's network namespace, network allowed) and
listen() on a name bound to it fail. From a real sandbox, as run_command runs it."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

PROGRAM = r"""
import socket, sys
name, kind = "\0" + sys.argv[1], int(sys.argv[2])
for how in ("closed", "shut down"):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    b.close() if how == "closed" else a.shutdown(socket.SHUT_RDWR)
    try:
        a.connect(name)
        a.sendall(b"reached")
        print(how, "connected")
    except OSError as error:
        print(how, "connect failed", error.errno)
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    b.close()
    try:
        a.bind(name + "-squat")
        a.listen()
        print(how, "listening")
    except OSError as error:
        print(how, "listen failed", error.errno)
"""


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_SEQPACKET])
def test_a_connected_pair_connects_to_no_host_socket(
    sandboxed_workspace: Path, settings: Any, kind: int
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True  # the host's network namespace
    name = f"rtsrvenv-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, kind) as service:
        service.bind("\0" + name)
        service.listen(5)
        service.setblocking(False)
        (sandboxed_workspace / "pair.py").write_text(PROGRAM)
        ctx = ExecutionContext(
            workspace=sandboxed_workspace, call_id="rtsrvenv", timeout=30, output_limit=20_000
        )
        argv = ["python3", "pair.py", name, str(int(kind))]
        out = str(RUN_COMMAND.execute(ctx, {"argv": argv}))
        assert out.startswith("exit code 0"), out
        with pytest.raises(BlockingIOError):  # nobody came
            print("accepted", service.accept())
    assert "connected" not in out.replace("connect failed", ""), out
    assert "listening" not in out, out
    assert out.count("connect failed 106") == 2, out  # EISCONN: the pair's peer is fixed
