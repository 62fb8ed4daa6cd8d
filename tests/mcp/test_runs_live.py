"""One run of one agent is one Harness session, whatever its client does with MCP
transport sessions (docs/mcp.md, "Which session a request joins"): LangChain's adapters
(a new MCP session per tool call, their default), the MCP Inspector's CLI (a process, and
a session, per call), a client that sends no session at all, and the MCP SDK's own
client on the stateless 2026-07-28 revision (no initialize, no session header). A file one call writes
is there for the next, and a session grant applies to every later call."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest

from dispatcher.models import AgentSession, ToolCall
from tests.mcp.conftest import run, text_of
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = pytest.mark.live

INSPECTOR = ROOT / "var" / "mcp-inspector" / "node_modules" / ".bin" / "mcp-inspector"
LANGCHAIN = ROOT / "var" / "langchain-client" / "bin" / "python"
LANGCHAIN_SCRIPT = ROOT / "tests" / "support" / "langchain_client.py"


def sessions_of(fx: AgentFixture) -> list[AgentSession]:
    return list(AgentSession.objects.filter(agent=fx.agent, client="mcp"))


def langchain_client() -> Path:
    if LANGCHAIN.exists():
        return LANGCHAIN
    message = (
        "LangChain's MCP adapters are not installed: run `make langchain-client` (a "
        "virtualenv of their own in var/langchain-client; `make test` does it)."
    )
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


def test_langchain_adapters_with_a_session_per_call_stay_in_one_session(
    live_stack: LiveStack, live_db: None
) -> None:
    # The adapters need the SDK's v1 line: they run in their own virtualenv, a process
    # as an agent's would be (tests/support/langchain_client.py).
    python = langchain_client()
    fx = make_agent(mode="trusted")
    steps = [
        ["write_file", {"path": "note.txt", "content": "kept\n"}],
        ["read_file", {"path": "note.txt"}],
    ]
    done = subprocess.run(
        [str(python), str(LANGCHAIN_SCRIPT), live_stack.url + "/mcp/", fx.token, json.dumps(steps)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    _, read = json.loads(done.stdout)
    assert "kept" in read
    [session] = sessions_of(fx)
    assert Path(session.workspace, "note.txt").read_text() == "kept\n"
    assert ToolCall.objects.filter(session=session).count() == 2


def test_a_2026_07_28_client_lists_and_calls_in_one_session_without_initialize(
    live_stack: LiveStack, live_db: None
) -> None:
    """The SDK's own client negotiates the stateless revision (server/discover), sends no
    initialize and keeps no Mcp-Session-Id; its calls still land in one Harness session,
    and a run key in `_meta` names another run."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    fx = make_agent(mode="trusted")
    sent: list[tuple[str, str, str]] = []  # (MCP-Protocol-Version, Mcp-Method, body)
    answered: list[str | None] = []  # the Mcp-Session-Id of each answer

    async def request(request: httpx2.Request) -> None:
        headers = request.headers
        body = request.content.decode()
        sent.append((headers.get("mcp-protocol-version", ""), headers.get("mcp-method", ""), body))

    async def response(response: httpx2.Response) -> None:
        answered.append(response.headers.get("mcp-session-id"))

    async def scenario() -> tuple[str, list[str], str, str, str]:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {fx.token}"},
            timeout=httpx2.Timeout(30, read=120),
            event_hooks={"request": [request], "response": [response]},
        )
        transport = streamable_http_client(live_stack.url + "/mcp/", http_client=http)
        async with http, Client(transport) as client:
            names = []
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                names += [tool.name for tool in page.tools]
                if (cursor := page.next_cursor) is None:
                    break
            await client.call_tool("write_file", {"path": "modern.txt", "content": "stateless\n"})
            read = await client.call_tool("read_file", {"path": "modern.txt"})
            keyed = await client.call_tool(
                "read_file", {"path": "modern.txt"}, meta={"harness/run": "modern-7"}
            )
            return client.protocol_version, names, text_of(read), text_of(keyed), "ok"

    version, names, read, keyed, _ = run(scenario)
    assert version == "2026-07-28"
    assert "write_file" in names and "read_file" in names
    assert "stateless" in read
    # No handshake and no transport session: every request carried its revision.
    assert sent and all(v == "2026-07-28" for v, _, _ in sent)
    assert not any('"method":"initialize"' in body.replace(" ", "") for *_, body in sent)
    assert {"server/discover", "tools/list", "tools/call"} <= {m for _, m, _ in sent}
    assert answered and not any(answered)
    # One run, one session: the listing and both calls without a key.
    [session] = [s for s in sessions_of(fx) if s.external_id != "run:modern-7"]
    assert session.title.startswith("MCP: ")
    assert Path(session.workspace, "modern.txt").read_text() == "stateless\n"
    assert ToolCall.objects.filter(session=session).count() == 2
    # A run key in `_meta` is another run: its own workspace, without the file.
    other = AgentSession.objects.get(agent=fx.agent, external_id="run:modern-7")
    assert "does not exist" in keyed
    assert ToolCall.objects.filter(session=other).count() == 1


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
