"""rt10: a team admin gives a stdio server no path on the host, by Paths or otherwise.

rt6's fix refused the Paths field, but the sandbox also shows a server what its program
needs to start, found from the command's absolute-path arguments (sandbox_servers.
program_binds): a file inside `node_modules` shows the whole directory holding it (an
npm prefix: another team's project, its secrets beside it), a file in a virtual
environment the environment, any other executable or script that file. A team admin
naming such a file in the command (or a PATH that finds the program there) had the
sandbox show it to their team's server. Through real requests (Django's test client over
the real URLconf) and the real sandbox, as tests/redteam/test_rt6_teams.py does."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dispatcher.tools.sources.models import McpServer, McpTool
from tests.teams.world import TeamWorld, make_team
from tests.tools.support import require_bwrap

db = pytest.mark.django_db

# An MCP server in Python's standard library: its one tool's description lists the
# directory two levels above the file named as its first argument (node_modules/x/...).
PEEK = (
    "import json,os,sys\n"
    "d=os.path.dirname(os.path.dirname(os.path.dirname(sys.argv[1])))\n"
    "for line in sys.stdin:\n"
    " m=json.loads(line)\n"
    " if 'id' not in m: continue\n"
    " if m['method']=='initialize': r={'protocolVersion':m['params']['protocolVersion'],"
    "'capabilities':{'tools':{}},'serverInfo':{'name':'peek','version':'1'}}\n"
    " elif m['method']=='tools/list':\n"
    "  try: t=' '.join(sorted(os.listdir(d)))\n"
    "  except OSError as e: t=repr(e)\n"
    "  r={'tools':[{'name':'look','description':t or 'empty','inputSchema':{'type':'object'}}]}\n"
    " else: r={}\n"
    " print(json.dumps({'jsonrpc':'2.0','id':m['id'],'result':r}),flush=True)\n"
)


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


def _another_teams_project(tmp_path: Path) -> Path:
    """An npm prefix an organization admin installed for another team (root's, not the
    sandbox user's), with a secret beside its packages."""
    tmp_path.chmod(0o755)
    project = tmp_path / "other-team-server"
    (project / "node_modules" / "x").mkdir(parents=True)
    (project / "node_modules" / "x" / "index.js").write_text("//\n")
    (project / "payroll-secret.env").write_text("TOKEN=x\n")
    for path in (project, project / "node_modules", project / "node_modules" / "x"):
        path.chmod(0o755)
    for path in (project / "node_modules" / "x" / "index.js", project / "payroll-secret.env"):
        path.chmod(0o644)
    return project


@db
def test_a_team_admin_names_no_host_file_for_the_sandbox_to_show(
    pay: TeamWorld, tmp_path: Path
) -> None:
    require_bwrap()
    project = _another_teams_project(tmp_path)
    named = project / "node_modules" / "x" / "index.js"
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "peek",
            "transport": "stdio",
            "command": shlex.join(["/usr/bin/python3", "-c", PEEK, str(named)]),
            "team": pay.team.name,
        },
    )
    assert not McpTool.objects.filter(description__contains="payroll-secret").exists()
    assert not McpServer.objects.filter(name="peek").exists()
    assert answer.status_code == 200
    assert "Only an organization admin runs a server from a program" in answer.content.decode()


@db
def test_a_team_admin_gives_no_path_that_finds_the_program_on_the_host(
    pay: TeamWorld, tmp_path: Path
) -> None:
    require_bwrap()
    project = _another_teams_project(tmp_path)
    program = project / "node_modules" / "x" / "peek"  # (a program found on PATH)
    program.write_text("#!/usr/bin/python3\n" + PEEK.replace("sys.argv[1]", "sys.argv[0]"))
    program.chmod(0o755)
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "peek",
            "transport": "stdio",
            "command": "peek",
            "env": f"PATH={project / 'node_modules' / 'x'}:/usr/bin:/bin",
            "team": pay.team.name,
        },
    )
    assert not McpTool.objects.filter(description__contains="payroll-secret").exists()
    assert not McpServer.objects.filter(name="peek").exists()
    assert answer.status_code == 200
    assert "Only an organization admin runs a server from a program" in answer.content.decode()


@db
def test_a_team_admin_still_registers_a_server_of_the_system_programs(
    pay: TeamWorld,
) -> None:
    """What the sandbox shows every program (/usr, /bin ...) stays theirs to run."""
    require_bwrap()
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "peek",
            "transport": "stdio",
            "command": shlex.join(["/usr/bin/python3", "-c", PEEK, "/usr/lib/x/y/z"]),
            "team": pay.team.name,
        },
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert McpServer.objects.filter(name="peek", team=pay.team).exists()
