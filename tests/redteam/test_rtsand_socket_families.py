"""Red team of the sandbox (rtsand): a sandboxed program opens no socket of a family no
tool needs.

The seccomp filter refused socket(AF_UNIX) and socket(AF_VSOCK) only: every other
family the kernel has was a sandboxed program's to open (AF_ALG's crypto interface,
AF_TIPC, AF_RDS, AF_CAN, AF_BLUETOOTH, AF_XDP ...), each kernel code, most of it loaded
on demand by that very socket() call, that no tool of an agent needs. On this host's
kernel most of them are not built (socket() failed with EAFNOSUPPORT, the kernel's own
answer, on a kernel that has them it succeeded): the filter now refuses them itself,
EPERM, whatever the kernel has. Through run_command in the real sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

PROBE = r"""
import socket
for family in range(64):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW, socket.SOCK_RDM):
        try:
            socket.socket(family, kind).close()
            print("socket", family, kind, "made")
        except OSError as error:
            print("socket", family, kind, "errno", error.errno)
    try:
        a, b = socket.socketpair(family, socket.SOCK_STREAM)
        print("pair", family, "made")
    except OSError as error:
        print("pair", family, "errno", error.errno)
"""


def _run(workspace: Path) -> list[str]:
    (workspace / "families.py").write_text(PROBE)
    ctx = ExecutionContext(workspace=workspace, call_id="rtsand", timeout=60, output_limit=200_000)
    out = str(RUN_COMMAND.execute(ctx, {"argv": ["python3", "families.py"]}))
    assert out.startswith("exit code 0"), out[:2000]
    return out.splitlines()


def test_no_socket_of_an_exotic_family_is_made(sandboxed_workspace: Path, settings: Any) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True  # the host's network namespace: the most open
    lines = _run(sandboxed_workspace)
    alg, tipc, packet = 38, 30, 17
    for family, kind in ((alg, 5), (tipc, 2), (tipc, 4), (packet, 3), (packet, 2)):
        assert f"socket {family} {kind} errno 1" in lines, [
            line for line in lines if line.startswith(f"socket {family} ")
        ]
    for family in range(64):
        if family in (2, 10, 16):
            continue
        made = [line for line in lines if line.startswith(f"socket {family} ")]
        assert made and all(line.endswith(" errno 1") for line in made), made  # EPERM
        if family != 1:
            assert f"pair {family} errno 1" in lines, family


def test_the_network_and_pipes_of_its_own_still_work(
    sandboxed_workspace: Path, settings: Any
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = False
    lines = _run(sandboxed_workspace)
    for made in ("socket 2 1 made", "socket 2 2 made", "socket 10 1 made", "socket 16 3 made"):
        assert made in lines, made  # TCP, UDP, IPv6, netlink (getaddrinfo, `ip`)
    assert "pair 1 made" in lines  # a pair of Unix streams: pipes of its own
    assert "socket 1 1 errno 1" in lines  # (socket(AF_UNIX) refused as before)
