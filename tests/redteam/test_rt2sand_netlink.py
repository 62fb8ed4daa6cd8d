"""Red team of the sandbox (rt2sand): a sandboxed program opens netlink for routes and
socket diagnostics only.

rtsand's filter allowed AF_NETLINK whole, for getaddrinfo and `ip`: every netlink
protocol the kernel has was a program's to open. NETLINK_USERSOCK lets any uid send to
another process's socket by its port id: with HARNESS_SANDBOX_NETWORK on (the host's
network namespace), a compiled program in the sandbox sent a message to a host process
listening on one, the very channel socket(AF_UNIX) is refused for. The rest
(NETLINK_GENERIC, KOBJECT_UEVENT, AUDIT, NETFILTER, XFRM, CONNECTOR, ...) is kernel code
no tool needs. Compiled C (the host's gcc) and real tools, through run_command in the
real sandbox."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

USERSOCK = r"""
#include <errno.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!strcmp(argv[1], "table")) {  /* which netlink protocols open */
    for (int p = 0; p < 32; p++) {
      int fd = socket(AF_NETLINK, SOCK_RAW, p);
      printf("netlink %d %s\n", p, fd >= 0 ? "made" : strerror(errno));
      if (fd >= 0) close(fd);
    }
    return 0;
  }
  int fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_USERSOCK);
  if (fd < 0) { printf("socket %s\n", strerror(errno)); return 0; }
  struct sockaddr_nl a = {.nl_family = AF_NETLINK, .nl_pid = atoi(argv[2])};
  if (!strcmp(argv[1], "listen")) {
    if (bind(fd, (void *)&a, sizeof a)) { printf("bind %s\n", strerror(errno)); return 1; }
    printf("listening\n");
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > (ssize_t)NLMSG_HDRLEN) printf("RECEIVED %.*s\n", (int)(n - NLMSG_HDRLEN), buf + NLMSG_HDRLEN);
    return 0;
  }
  char buf[256] = {0};
  struct nlmsghdr *h = (void *)buf;
  size_t len = strlen(argv[3]);
  h->nlmsg_len = NLMSG_LENGTH(len);
  memcpy(NLMSG_DATA(h), argv[3], len);
  ssize_t sent = sendto(fd, buf, h->nlmsg_len, 0, (void *)&a, sizeof a);
  printf("send %s\n", sent < 0 ? strerror(errno) : "done");
  return 0;
}
"""
PORT = "48213"


def _run(workspace: Path, argv: list[str]) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="rt2sand", timeout=60, output_limit=50_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": argv}))


@pytest.fixture
def program(sandboxed_workspace: Path, tmp_path: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc on this host to compile the probe")
    source = tmp_path / "usersock.c"
    source.write_text(USERSOCK)
    binary = sandboxed_workspace / "usersock"
    subprocess.run([gcc, "-static", "-O1", "-o", str(binary), str(source)], check=True)
    binary.chmod(0o755)
    return binary


def test_a_program_reaches_no_host_process_over_netlink(
    sandboxed_workspace: Path, program: Path, settings: Any
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True  # the host's network namespace
    listener = subprocess.Popen(
        [str(program), "listen", PORT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline() == b"listening\n"
        sent = _run(sandboxed_workspace, ["./usersock", "send", PORT, "FROM-THE-SANDBOX"])
        try:
            heard, _ = listener.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            heard = b""
    finally:
        listener.kill()
        listener.wait()
    assert b"FROM-THE-SANDBOX" not in heard, (sent, heard)
    assert "socket Operation not permitted" in sent, sent


def test_only_route_and_diagnostics_open(
    sandboxed_workspace: Path, program: Path, settings: Any
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = True
    table = _run(sandboxed_workspace, ["./usersock", "table"]).splitlines()
    assert "netlink 0 made" in table and "netlink 4 made" in table, table
    for protocol in (2, 6, 7, 9, 10, 11, 12, 15, 16):  # those this kernel has
        assert f"netlink {protocol} Operation not permitted" in table, table


@pytest.mark.parametrize("network", [True, False])
def test_the_tools_that_use_netlink_still_work(
    sandboxed_workspace: Path, settings: Any, network: bool
) -> None:
    settings.HARNESS_SANDBOX_NETWORK = network
    script = (
        "ip -o addr show lo; ss -tan | head -1; "
        'python3 -c \'import socket; print("python", socket.getaddrinfo("localhost", 80)[0][4])\'; '
        'if command -v node >/dev/null; then node -e \'require("dns").lookup("localhost",'
        ' (e, a) => console.log("node", e, a))\'; else echo node null 127.0.0.1; fi'
    )
    out = _run(sandboxed_workspace, ["sh", "-c", script])
    assert out.startswith("exit code 0"), out
    assert "inet 127.0.0.1/8" in out, out  # ip (NETLINK_ROUTE)
    assert "State" in out and "Local Address" in out, out  # ss
    assert "python ('127.0.0.1', 80)" in out, out  # getaddrinfo
    assert "node null 127.0.0.1" in out, out


INET = r"""
import socket
for family in (socket.AF_INET, socket.AF_INET6):
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
        for protocol in (0, 6, 17, 33, 115, 132, 256, 262):
            try:
                socket.socket(family, kind, protocol).close()
                print("inet", int(family), int(kind), protocol, "made")
            except OSError as error:
                print("inet", int(family), int(kind), protocol, "errno", error.errno)
"""


def test_no_internet_protocol_the_kernel_loads_on_demand(
    sandboxed_workspace: Path, settings: Any
) -> None:
    """SCTP, DCCP, L2TP over IP and SMC: modules the first socket() loaded (not built on
    this host's kernel: the kernel's own EPROTONOSUPPORT before, EPERM now)."""
    settings.HARNESS_SANDBOX_NETWORK = True
    (sandboxed_workspace / "inet.py").write_text(INET)
    lines = _run(sandboxed_workspace, ["python3", "inet.py"]).splitlines()
    for family in (2, 10):
        for kind in (1, 5, 2):
            for protocol in (33, 115, 132, 256):
                assert f"inet {family} {kind} {protocol} errno 1" in lines, lines
        assert f"inet {family} 1 0 made" in lines and f"inet {family} 1 6 made" in lines
        assert f"inet {family} 2 17 made" in lines, lines
