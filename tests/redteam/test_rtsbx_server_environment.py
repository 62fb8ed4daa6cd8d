"""Red team of the sandbox (rtsbx): a stdio server's environment runs nothing outside
the sandbox.

A server's configured variables were the environment of its whole launcher: the shell,
prlimit and bwrap run on the host as Harness (root here), setpriv as root inside the
sandbox before it drops to the sandbox user. A team's admin (not an organization admin)
registered `/usr/bin/true` with LD_PRELOAD naming a library their agent's sandboxed
program had compiled in its workspace, and the library's constructor ran as uid 0 on
the host at registration. (First refused by name; now the launcher never has them.) Through the real registration request, the real sandbox and a
library built by a real sandboxed program, as tests/redteam/test_rt10_team_server_binds.py
registers servers."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from dispatcher.tools import sandbox_servers
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from dispatcher.tools.sources import upstream
from dispatcher.tools.sources.models import McpServer
from tests.teams.world import TeamWorld, make_team

# A library whose constructor, in every process that loads it, leaves a file named after
# the process's effective uid in MARK_DIR (where that directory exists: on the host).
LIBRARY = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
    const char *dir = getenv("MARK_DIR");
    char path[512];
    if (!dir) return;
    snprintf(path, sizeof path, "%s/ran-as-uid-%d-pid-%d", dir, (int)geteuid(), (int)getpid());
    FILE *mark = fopen(path, "w");
    if (mark) fclose(mark);
}
"""


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


@pytest.mark.django_db
def test_a_server_environment_loads_no_library_into_the_launcher(
    pay: TeamWorld, sandboxed_workspace: Path, tmp_path: Path
) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the agent's program could not build its library")
    workspace = sandboxed_workspace
    (workspace / "lib.c").write_text(LIBRARY)
    ctx = ExecutionContext(workspace=workspace, call_id="rtsbx", timeout=60, output_limit=4000)
    built = RUN_COMMAND.execute(ctx, {"argv": ["gcc", "-shared", "-fPIC", "-o", "lib.so", "lib.c"]})
    assert str(built).startswith("exit code 0"), built
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    marks.chmod(0o777)

    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "preloaded",
            "transport": "stdio",
            "command": "/usr/bin/true",
            "env": f"LD_PRELOAD={workspace / 'lib.so'}\nMARK_DIR={marks}",
            "team": pay.team.name,
        },
    )
    # Nothing ran it, anywhere: the launcher starts with an environment of Harness's own
    # (sandbox_servers.LAUNCHER_ENVIRONMENT), and the server, which alone is given the
    # variable, as the sandbox user, does not see the workspace. (The server's own use of
    # its variables: tests/redteam/test_srvenv_launcher_environment.py.)
    assert sorted(path.name for path in marks.iterdir()) == []
    assert answer.status_code == 200
    page = answer.content.decode()
    # (true is no MCP server: the start is tried and the listing fails, for that reason)
    assert "The server did not start" in page, page[-3000:]
    assert not McpServer.objects.filter(name="preloaded").exists()


@pytest.mark.django_db
def test_a_server_may_still_be_given_its_own_variables(
    pay: TeamWorld, sandboxed_workspace: Path
) -> None:
    answer = pay.client("admin").post(
        "/tools/servers/add",
        {
            "name": "plain",
            "transport": "stdio",
            "command": "/usr/bin/true",
            "env": "API_TOKEN=x\nLANG=C.UTF-8",
            "team": pay.team.name,
        },
    )
    # (true is no MCP server: the start is tried and the listing fails, for another reason)
    assert "cannot be given to a stdio server" not in answer.content.decode()


def test_a_server_registered_with_a_name_no_shell_exports_is_never_started(
    sandboxed_workspace: Path, tmp_path: Path
) -> None:
    # (registered before the refusal existed: its start is refused, nothing runs)
    endpoint = upstream.Endpoint(
        server_id=1,
        version=1,
        name="old",
        transport="stdio",
        command=("/usr/bin/true",),
        env=(("MY-VAR", str(tmp_path)),),
    )
    with contextlib.ExitStack() as held, pytest.raises(ToolError) as refused:
        upstream.launch_argv(endpoint, held)
    assert "Variable name 'MY-VAR' cannot be given to a stdio server" in str(refused.value)
    # what the loader and the C library act on is the server's own to choose now
    assert sandbox_servers.environment_problem({"LD_LIBRARY_PATH": "/opt/x/lib"}) is None
    assert sandbox_servers.environment_problem({"LANG": "de_DE.UTF-8", "TOKEN": "x"}) is None
