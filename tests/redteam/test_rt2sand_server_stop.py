"""Red team of the sandbox (rt2sand): a stdio server's stop leaves its exit in its log,
and its launcher's own processes take none of its process limit.

rtsand made the server's stderr a pipe copied to the log by `cat`, in the launcher's
process group and cgroup. A server that does not exit when its stdin ends is stopped by
the MCP SDK with SIGTERM to that group: the launcher's shells and the copier died of it
with bwrap, so the exit report was never written (the log ended on the server's last
line, saying nothing of the stop), what was still in the pipe was lost, and the stop
waited out the SDK's 2 s before SIGKILL. The copier and the launcher's two subshells
also counted in the server's pids cgroup: a server could start 253 processes of its 256.
Real MCP servers (Python's standard library) under the real SDK client and sandbox."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from mcp.client import stdio as sdk

from dispatcher.tools.sandbox import EXIT_REPORT  # noqa
from dispatcher.tools.sandbox_servers import SERVER_LIMITS
from dispatcher.tools.sources.upstream import Endpoint, open_session

SERVER = r"""
import json, os, sys, time
mode = sys.argv[1]
def forks():
    kids = []
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    for kid in kids:
        os.kill(kid, 9)
        os.waitpid(kid, 0)
    return str(len(kids))
seen = forks() if mode == "count" else "x"
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
             "serverInfo": {"name": "x", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "look", "description": seen, "inputSchema": {"type": "object"}}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
for i in range(2000):
    os.write(2, b"%05d " % i + b"y" * 200 + b"\n")
os.write(2, b"LAST-LINE before the stop\n")
while mode == "hang":
    time.sleep(1)
"""


def _session(tmp_path: Path, name: str, mode: str) -> tuple[str, float]:
    script = tmp_path / f"{name}.py"
    script.write_text(SERVER)
    endpoint = Endpoint(
        server_id=1,
        version=1,
        name=name,
        transport="stdio",
        command=("/usr/bin/python3", str(script), mode),
        paths=(str(tmp_path),),
    )

    async def talk() -> tuple[str, float]:
        async with open_session(endpoint) as session:
            listed = await session.list_tools()
            began = time.monotonic()
        return str(listed.tools[0].description), time.monotonic() - began

    return asyncio.run(talk())


def test_a_server_stopped_by_sigterm_has_its_exit_and_its_last_lines_logged(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's wait from SIGTERM to SIGKILL made long (2 s): a group that outlives the
    # SIGTERM shows as that wait, not as a second a loaded host's stop could take as well
    monkeypatch.setattr(sdk, "FORCE_KILL_TIMEOUT", 30.0)
    _, took = _session(tmp_path, "hangs", "hang")
    log = Path(settings.DATA_DIR) / "mcp-servers" / "hangs.stderr.log"
    deadline = time.monotonic() + 5
    while EXIT_REPORT.encode() not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    written = log.read_bytes()
    assert b"LAST-LINE before the stop\n" in written, written[-300:]
    assert written.endswith(f"{EXIT_REPORT} 143\n".encode()), written[-300:]  # 128+SIGTERM
    # The group ended at SIGTERM: no wait for the SIGKILL
    assert took < sdk.PROCESS_TERMINATION_TIMEOUT + sdk.FORCE_KILL_TIMEOUT / 2, took
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert str(tmp_path / "hangs.py") not in left.stdout, left.stdout


def test_a_server_starts_as_many_processes_as_its_limit(
    sandboxed_workspace: Path, settings: Any, tmp_path: Path
) -> None:
    started, _ = _session(tmp_path, "counts", "count")
    assert started == str(SERVER_LIMITS.processes), started
    log = Path(settings.DATA_DIR) / "mcp-servers" / "counts.stderr.log"
    deadline = time.monotonic() + 5
    while EXIT_REPORT.encode() not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_bytes().endswith(f"{EXIT_REPORT} 0\n".encode())
