"""One run of one agent is one Harness session, whatever its client does with MCP
transport sessions (docs/mcp.md, "Which session a request joins"): LangChain's adapters
(a new MCP session per tool call, their default), the MCP Inspector's CLI (a process, and
a session, per call), and a client that sends no session at all. A file one call writes
is there for the next, and a session grant applies to every later call."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.models import AgentSession, ToolCall
from tests.mcp.conftest import run
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = pytest.mark.live

INSPECTOR = ROOT / "var" / "mcp-inspector" / "node_modules" / ".bin" / "mcp-inspector"


def sessions_of(fx: AgentFixture) -> list[AgentSession]:
    return list(AgentSession.objects.filter(agent=fx.agent, client="mcp"))


def test_langchain_adapters_with_a_session_per_call_stay_in_one_session(
    live_stack: LiveStack, live_db: None
) -> None:
    from langchain_mcp_adapters.client import MultiServerMCPClient

    fx = make_agent(mode="trusted")

    async def scenario() -> Any:
        client = MultiServerMCPClient(
            {
                "harness": {
                    "url": live_stack.url + "/mcp/",
                    "transport": "streamable_http",
                    "headers": {"Authorization": f"Bearer {fx.token}"},
                }
            }
        )
        tools = {tool.name: tool for tool in await client.get_tools()}
        await tools["write_file"].ainvoke({"path": "note.txt", "content": "kept\n"})
        return await tools["read_file"].ainvoke({"path": "note.txt"})

    read = run(scenario)
    assert "kept" in json.dumps(read, default=str)
    [session] = sessions_of(fx)
    assert Path(session.workspace, "note.txt").read_text() == "kept\n"
    assert ToolCall.objects.filter(session=session).count() == 2


def test_a_client_without_sessions_stays_in_its_run_and_a_run_key_opens_another(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    headers = {
        "Authorization": f"Bearer {fx.token}",
        "Accept": "application/json, text/event-stream",
    }

    def call(n: int, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> str:
        body = {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": meta},
        }
        answer = httpx.post(live_stack.url + "/mcp/", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert "mcp-session-id" not in answer.headers
        return answer.text

    info = {"io.modelcontextprotocol/clientInfo": {"name": "bare", "version": "1"}}
    call(1, "write_file", {"path": "a.txt", "content": "one\n"}, info)
    assert "one" in call(2, "read_file", {"path": "a.txt"}, info)
    [run_session] = sessions_of(fx)
    assert run_session.title == "MCP: bare 1"
    # A run key names another run: its own session and workspace.
    keyed = {**info, "harness/run": "nightly-42"}
    assert "does not exist" in call(3, "read_file", {"path": "a.txt"}, keyed)
    call(4, "write_file", {"path": "b.txt", "content": "two\n"}, keyed)
    other = AgentSession.objects.get(agent=fx.agent, external_id="run:nightly-42")
    assert Path(other.workspace, "b.txt").read_text() == "two\n"
    assert not Path(run_session.workspace, "b.txt").exists()
    # Another agent never joins this agent's run, even with its key.
    stranger = make_agent(mode="trusted")
    headers["Authorization"] = f"Bearer {stranger.token}"
    call(5, "write_file", {"path": "c.txt", "content": "x"}, keyed)
    assert not Path(other.workspace, "c.txt").exists()


def inspector() -> Path:
    if INSPECTOR.exists():
        return INSPECTOR
    message = (
        "the MCP Inspector is not installed: run `make mcp-servers` (npm install into "
        "var/mcp-inspector; `make test` does it)."
    )
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


def test_the_inspector_cli_with_a_process_per_call_stays_in_one_session(
    live_stack: LiveStack, live_db: None
) -> None:
    program = inspector()
    fx = make_agent(mode="trusted")

    def cli(*args: str) -> str:
        done = subprocess.run(
            [
                str(program),
                "--cli",
                live_stack.url + "/mcp/",
                "--transport",
                "http",
                "--header",
                f"Authorization: Bearer {fx.token}",
                "--method",
                "tools/call",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HOME": str(ROOT / "var" / "mcp-inspector")},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("--tool-name", "write_file", "--tool-arg", "path=inspected.txt", "content=seen")
    assert "seen" in cli("--tool-name", "read_file", "--tool-arg", "path=inspected.txt")
    [session] = sessions_of(fx)
    assert Path(session.workspace, "inspected.txt").read_text() == "seen"
