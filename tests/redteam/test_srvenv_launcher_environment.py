"""A stdio server's configured environment is its own, never its launcher's (srvenv).

The launcher of a sandboxed server (the shell, prlimit, REOPEN and bwrap on the host as
Harness, root here; setpriv as root inside the sandbox) ran with the server's configured
variables, and LD_PRELOAD naming a library an agent's sandboxed program built ran it as
root on the host. Now the launcher runs with a fixed environment and the variables are
applied after the drop to the sandbox user, never through an argv (/proc/<pid>/cmdline is
world-readable; the values are often keys). Through the real registration request, the
real sandbox, a library built by a real sandboxed program and a real MCP server that
reports its environment."""

from __future__ import annotations

import asyncio
import html
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from dispatcher.tools import sandbox_servers
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.sources import upstream
from dispatcher.tools.sources.models import McpServer
from tests.mcp.conftest import text_of
from tests.redteam.test_rtsbx_server_environment import LIBRARY
from tests.teams.world import org_client
from tests.tools.support import sandbox_uid

SERVER = """
import json, os
from mcp.server.mcpserver import MCPServer

server = MCPServer("environment-test", log_level="WARNING")


@server.tool(description="The server's environment.")
def environ() -> str:
    return json.dumps(dict(os.environ))


server.run("stdio")
"""


def _processes() -> list[tuple[int, bytes, bytes, int]]:
    """Every process of the host: (pid, cmdline, environ, real uid)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:  # (gone meanwhile)
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
        found.append((int(entry), cmdline, environ, int(uids.split()[1])))
    return found


@pytest.mark.django_db
def test_the_configured_environment_reaches_the_server_alone(
    sandboxed_workspace: Path, tmp_path: Path
) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the agent's program could not build its library")
    if os.geteuid() != 0:
        pytest.skip("the launcher runs as root only when Harness does")
    workspace = sandboxed_workspace
    (workspace / "lib.c").write_text(LIBRARY)
    ctx = ExecutionContext(workspace=workspace, call_id="srvenv", timeout=60, output_limit=4000)
    built = RUN_COMMAND.execute(ctx, {"argv": ["gcc", "-shared", "-fPIC", "-o", "lib.so", "lib.c"]})
    assert str(built).startswith("exit code 0"), built
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)
    script = tmp_path / "environment_server.py"
    script.write_text(SERVER)
    script.chmod(0o644)
    secret = f"sk-{uuid.uuid4().hex}"
    configured = {
        "API_KEY": secret,
        "FOO": "bar",
        "LANG": "C.UTF-8",
        "LD_PRELOAD": str(workspace / "lib.so"),
        "MARK_DIR": str(marks),
    }

    # An organization admin gives the server the workspace (read-only) and the marks: the
    # library is there for the server to load, as its admin configured.
    answer = org_client("admin").post(
        "/tools/servers/add",
        {
            "name": "preloaded",
            "transport": "stdio",
            "command": f"{sys.executable} {script}",
            "env": "\n".join(f"{name}={value}" for name, value in configured.items()),
            "paths": f"{marks}\n{workspace}:ro",
        },
    )
    assert answer.status_code in (200, 302)
    server = McpServer.objects.filter(name="preloaded").first()
    assert server is not None, answer.content.decode()[-3000:]

    async def while_it_runs() -> tuple[str, list[tuple[int, bytes, bytes, int]]]:
        async with upstream.open_session(upstream.endpoint_of(server)) as session:
            seen = _processes()
            return text_of(await session.call_tool("environ", {})), seen

    reported, processes = asyncio.run(asyncio.wait_for(while_it_runs(), 60))

    # The server has exactly its configured variables and PATH.
    assert json.loads(reported) == {"PATH": os.environ.get("PATH"), **configured}
    # Its library ran, and only ever as the sandbox user (the registration's start, this one).
    uids = {mark.name.split("-")[3] for mark in marks.iterdir() if mark.name.startswith("ran-")}
    assert uids == {str(sandbox_uid())}
    # No process's argv holds a value; only the sandbox user's hold them in their environment.
    assert [pid for pid, cmdline, _, _ in processes if secret.encode() in cmdline] == []
    holders = {uid for _, _, environ, uid in processes if secret.encode() in environ}
    assert holders == {sandbox_uid()}
    # The launcher (bwrap, on the host, as root) has the launcher's environment alone.
    launchers = [
        environ
        for _, cmdline, environ, uid in processes
        if uid == 0
        and cmdline.split(b"\0")[0].endswith(b"bwrap")
        and str(marks).encode() in cmdline
    ]
    assert launchers, "the server's bwrap was not found"
    for environ in launchers:
        variables = dict(pair.split("=", 1) for pair in environ.decode().split("\0") if pair)
        assert variables["PATH"] == sandbox_servers.LAUNCHER_ENVIRONMENT["PATH"]
        # (PWD: set by the launcher's shell; LC_CTYPE: by Python's locale coercion in REOPEN)
        assert set(variables) <= {"PATH", "PWD", "LC_CTYPE"}, variables


@pytest.mark.django_db
def test_a_variable_name_no_shell_can_export_is_refused(sandboxed_workspace: Path) -> None:
    answer = org_client("admin").post(
        "/tools/servers/add",
        {
            "name": "oddname",
            "transport": "stdio",
            "command": "/usr/bin/true",
            "env": "MY-VAR=1",
        },
    )
    assert answer.status_code == 200
    page = html.unescape(answer.content.decode())
    assert "Variable name 'MY-VAR' cannot be given to a stdio server" in page
    assert not McpServer.objects.filter(name="oddname").exists()
