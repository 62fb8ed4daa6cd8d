"""Red team of the sandbox (rtsbx): no Unix socket of the host through a socket pair.

The seccomp filter refuses socket(AF_UNIX) so that, with HARNESS_SANDBOX_NETWORK=true
(the host's network namespace), the host's abstract Unix sockets stay out of reach. But
socketpair(AF_UNIX, SOCK_DGRAM) was allowed, and a datagram socket sends to any address
it names: `sendto(b"...", "\\0name")` from a real sandbox reached a host service's abstract
datagram socket."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

SENDER = r"""
import socket, sys
name = "\0" + sys.argv[1]
for kind, label in ((socket.SOCK_DGRAM, "dgram"), (3, "raw"), (socket.SOCK_SEQPACKET, "seqpacket"), (socket.SOCK_STREAM, "stream")):
    try:
        a, b = socket.socketpair(socket.AF_UNIX, kind)
    except OSError as error:
        print(label, "pair refused", error.errno)
        continue
    print(label, "pair made")
    try:
        a.sendto(label.encode(), name)
        print(label, "sent")
    except OSError as error:
        print(label, "send failed", error.errno)
    try:
        a.bind("\0" + sys.argv[1] + "-taken-" + label)
        print(label, "bound")
    except OSError as error:
        print(label, "bind failed", error.errno)
"""


@pytest.fixture
def host_service() -> Iterator[tuple[str, socket.socket]]:
    """An abstract datagram socket of the host, as a service listens on one."""
    name = f"rtsbx-{uuid.uuid4().hex}"
    service = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    service.bind("\0" + name)
    service.setblocking(False)
    yield name, service
    service.close()


def test_a_socket_pair_reaches_no_abstract_socket_of_the_host(
    sandboxed_workspace: Path, settings: Any, host_service: tuple[str, socket.socket]
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True  # the host's network namespace
    name, service = host_service
    (sandboxed_workspace / "sender.py").write_text(SENDER)
    ctx = ExecutionContext(
        workspace=sandboxed_workspace, call_id="rtsbx", timeout=30, output_limit=20_000
    )
    out = str(RUN_COMMAND.execute(ctx, {"argv": ["python3", "sender.py", name]}))
    assert out.startswith("exit code 0"), out
    with pytest.raises(BlockingIOError):  # nothing arrived
        print("received", service.recvfrom(100))
    assert "dgram pair refused 1" in out and "raw pair refused 1" in out, out
    assert "dgram sent" not in out and "raw sent" not in out, out
    # pairs of connected sockets still work (pipes between its own processes); a name given
    # with a send is ignored there, their peer is fixed
    assert "stream pair made" in out and "seqpacket pair made" in out, out
