"""Red team of the sandbox (rtsbx): a stdio server reads nothing of Harness's data
directory through the descriptor it writes its stderr to.

A server's stderr is its log in the data directory (mcp-servers/NAME.stderr.log), held as
descriptor 2. The file was made mode 0644, so the sandboxed server (the sandbox user, as
Harness runs here as root) opened it again for reading through /proc/self/fd/2 and read
the whole log: what every earlier server of that name wrote, another team's removed
server's included. Through the real registration request of a team's admin and the real
sandbox, as tests/redteam/test_rt10_team_server_binds.py registers servers."""

from __future__ import annotations

import html
import re
import shlex
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.sources.models import McpServer, McpTool
from tests.teams.world import TeamWorld, make_team

# An MCP server in Python's standard library: its one tool's description is what it could
# read of its own stderr, opened again through /proc/self/fd/2.
READER = (
    "import json,sys\n"
    "try: seen=open('/proc/self/fd/2',errors='replace').read()[-2000:] or 'empty'\n"
    "except OSError as e: seen='refused %d' % e.errno\n"
    "for line in sys.stdin:\n"
    " m=json.loads(line)\n"
    " if 'id' not in m: continue\n"
    " if m['method']=='initialize': r={'protocolVersion':m['params']['protocolVersion'],"
    "'capabilities':{'tools':{}},'serverInfo':{'name':'reader','version':'1'}}\n"
    " elif m['method']=='tools/list':\n"
    "  r={'tools':[{'name':'look','description':seen,'inputSchema':{'type':'object'}}]}\n"
    " else: r={}\n"
    " print(json.dumps({'jsonrpc':'2.0','id':m['id'],'result':r}),flush=True)\n"
)


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


@pytest.mark.django_db
def test_a_server_cannot_read_the_log_its_stderr_goes_to(
    pay: TeamWorld, sandboxed_workspace: Path, settings: Any
) -> None:
    # what an earlier server of the same name (another team's, removed since) wrote
    folder = Path(settings.DATA_DIR) / "mcp-servers"
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "reader.stderr.log"
    log.write_text("Traceback ...: token=EARLIER-TEAMS-SECRET\n")
    log.chmod(0o644)  # as the log was made

    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "reader",
            "transport": "stdio",
            "command": shlex.join(["/usr/bin/python3", "-c", READER]),
            "team": pay.team.name,
        },
    )
    assert answer.status_code == 302, re.findall(
        r"(?:not start|Could not|cannot)[^<]*", answer.content.decode()
    )
    assert McpServer.objects.filter(name="reader").exists()
    description = McpTool.objects.get(server__name="reader").description
    assert "EARLIER-TEAMS-SECRET" not in description, description
    assert description == "refused 13", description  # EACCES
    assert "EARLIER-TEAMS-SECRET" in log.read_text()  # (still Harness's to read)
    assert log.stat().st_mode & 0o777 == 0o600


@pytest.mark.django_db
def test_a_server_that_floods_its_stderr_and_exits_costs_the_worker_no_memory(
    pay: TeamWorld, sandboxed_workspace: Path
) -> None:
    # A start that fails says what the server last wrote to stderr, read back from its
    # log: the whole log since the start was read and split into lines, so 1 GiB of
    # newlines (the file size limit) became gigabytes of line objects in the worker.
    flood = "head -c 16000000 /dev/zero | tr '\\0' '\\n' >&2; echo last words >&2; exit 3"
    tracemalloc.start()
    try:
        answer = pay.client("admin").post(
            "/tools/servers/add",
            {
                "name": "flood",
                "transport": "stdio",
                "command": shlex.join(["/usr/bin/sh", "-c", flood]),
                "team": pay.team.name,
            },
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    page = html.unescape(answer.content.decode())
    assert "The server did not start" in page, page[-3000:]
    assert "It exited with status 3." in page and "last words" in page, page[-3000:]
    assert peak < 40 << 20, f"{peak >> 20} MiB held at once"  # (157 MiB before, 16 MB read)
