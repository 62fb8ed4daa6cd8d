"""Red team of the server environment's script (rtsrvenv): what held, kept held.

A sandboxed stdio server's configured variables reach it as `export NAME='value'` lines
in a sealed memfd, opened as descriptor 4 and evaluated by a shell run as the sandbox
user after setpriv. Through the real launch path (upstream.open_session, bubblewrap, the
sandbox user) a real MCP server reports what it was given: values made to break the
quoting (quotes, newlines, `$()`, backticks, the shell's own control bytes, 100 KB) and
the names a shell acts on (IFS, ENV, PS4, PATH, PWD, ...) arrive as configured and run
nothing; descriptor 4 is closed before the server starts; and the launcher's processes
in the server's sandbox (bwrap as pid 1, holding the descriptors) cannot be read.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from dispatcher.tools.sources import upstream
from tests.mcp.conftest import text_of
from tests.tools.support import sandbox_uid

SERVER = r"""
import json, os
from mcp.server.mcpserver import MCPServer

server = MCPServer("probe", log_level="WARNING")


def attempt(action):
    try:
        return action()
    except OSError as error:
        return f"refused {error.errno}"


@server.tool(description="What the server was given, and what it can read.")
def probe() -> str:
    fds = {fd: attempt(lambda: os.readlink(f"/proc/self/fd/{fd}")) for fd in os.listdir("/proc/self/fd")}
    others = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        others[pid] = {
            "fds": attempt(lambda: os.listdir(f"/proc/{pid}/fd")),
            "fd4": attempt(lambda: open(f"/proc/{pid}/fd/4", "rb").read().decode()),
            "environ": attempt(lambda: open(f"/proc/{pid}/environ", "rb").read().decode()),
        }
    tmp = os.listdir("/tmp")  # (the sandbox's own: what an injection there made)
    return json.dumps({"env": dict(os.environ), "uid": os.getuid(), "fds": fds, "others": others, "tmp": tmp})


server.run("stdio")
"""


@pytest.mark.django_db
def test_hostile_values_and_names_arrive_as_configured_and_fd_4_is_gone(
    sandboxed_workspace: Path, tmp_path: Path
) -> None:
    script = tmp_path / "probe_server.py"
    script.write_text(SERVER)
    script.chmod(0o644)
    mark = Path(f"/tmp/rtsrvenv-ran-{uuid.uuid4().hex}")  # noqa: S108 - what an injection makes
    secret = f"sk-{uuid.uuid4().hex}"
    configured = {
        "API_KEY": secret,
        "QUOTES": f"a'b\"c$(touch {mark})`touch {mark}`${{HOME}}\\",
        "NEWLINES": f"one\ntwo\n'; touch {mark}; '\n\n",
        "CONTROL": "\x81\x82\x83\x84\x85\x86\x87\x88\u0101\u0181" + f"'$(touch {mark})'",
        "EVERY": "".join(chr(c) for c in range(1, 0x800)) + "\U0001f600",
        "LONG": "x" * 100_000,
        "EMPTY": "",
        "IFS": "x",
        "ENV": str(script),
        "BASH_ENV": str(script),
        "PS4": f"$(touch {mark})",
        "SHELLOPTS": "xtrace",
        "HOME": "/nonexistent",
        "PWD": "/etc",
        "PPID": "1",
        **{f"MANY_{i}": str(i) for i in range(300)},
    }
    endpoint = upstream.Endpoint(
        server_id=1,
        version=1,
        name="rtsrvenv",
        transport="stdio",
        command=(sys.executable, str(script)),
        env=tuple(sorted(configured.items())),
    )

    async def probe() -> str:
        async with upstream.open_session(endpoint) as session:
            return text_of(await session.call_tool("probe", {}))

    seen = json.loads(asyncio.run(asyncio.wait_for(probe(), 120)))

    assert seen["uid"] == sandbox_uid()
    for name, value in configured.items():
        assert seen["env"].get(name) == value, name
    # (PATH: the worker's, given with the configured ones; LC_CTYPE: Python's own coercion)
    assert set(seen["env"]) <= {*configured, "PATH", "LC_CTYPE"}, set(seen["env"])
    assert mark.name not in seen["tmp"], seen["tmp"]
    # The memfd was closed before the server started: no descriptor of it is left.
    assert not any("memfd" in str(target) for target in seen["fds"].values()), seen["fds"]
    # bwrap (pid 1 of the sandbox, root) holds the launcher's descriptors: none readable.
    # When Harness is not root, bwrap runs as the server's own uid, so its descriptors
    # may be listed: the memfd is not among them.
    for pid, what in seen["others"].items():
        if os.geteuid() == 0:
            assert str(what["fds"]).startswith("refused"), (pid, what)
        else:
            assert "4" not in what["fds"], (pid, what)
        assert str(what["fd4"]).startswith("refused"), (pid, what)
        assert secret not in str(what["environ"]), (pid, what)
