"""The real Claude Code CLI with Harness as its MCP server and `--permission-prompt-tool`:
`claude -p` against the fake Messages API (tests/support/fake_anthropic.py) and a live
daphne + Celery worker.

Needs the fake API of the Claude Code tests (skips without it) and the pinned CLI (`make
claude-code`, under var/claude-code, or HARNESS_CLAUDE_CLI; without it: skips, fails under
CI=true).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import review
from tests.support import processes
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live]

CLI = Path(
    os.environ.get("HARNESS_CLAUDE_CLI") or ROOT / "var/claude-code/node_modules/.bin/claude"
)


def needs(what: str) -> None:
    message = f"Claude Code over MCP needs {what}."
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


@pytest.fixture
def fake_api() -> Any:
    try:
        from tests.support import fake_anthropic
    except ImportError:  # the Claude Code work is not merged here: nothing to run it with
        pytest.skip(
            "Claude Code over MCP needs the fake Messages API of the Claude Code tests "
            "(tests/support/fake_anthropic.py, branch claude-code)."
        )
    if not CLI.exists():
        needs(f"the pinned Claude Code CLI at {CLI}: run `make claude-code`")
    return fake_anthropic


def run_claude(
    fake: Any, stack: LiveStack, fx: AgentFixture, project: Path, home: Path
) -> dict[str, Any]:
    config = project / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "harness": {
                        "type": "http",
                        "url": stack.url + "/mcp/",
                        "headers": {"Authorization": f"Bearer {fx.token}"},
                    }
                }
            }
        )
    )
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": fake.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "MCP_TIMEOUT": "30000",
    }
    done = processes.run(
        [
            str(CLI),
            "-p",
            "Do the task.",
            "--output-format",
            "json",
            "--mcp-config",
            str(config),
            "--strict-mcp-config",
            "--permission-prompt-tool",
            "mcp__harness__approval_prompt",
            "--allowedTools",
            "mcp__harness__list_directory",
        ],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def told(fake: Any, index: int) -> str:
    block = fake.tool_results()[index]
    content = block.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def test_claude_code_calls_harness_tools_and_asks_harness_before_its_own(
    fake_api: Any, live_stack: LiveStack, live_agent: AgentFixture, tmp_path: Path
) -> None:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    target = project / "approved.txt"

    def approve_the_write() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            call = ToolCall.objects.filter(
                session__agent=live_agent.agent, name="client_tool", status="pending_approval"
            ).first()
            if call is not None:
                review(call, reviewer, approve=True)
                return
            time.sleep(0.1)

    reviewer_thread = threading.Thread(target=closing_connections(approve_the_write), daemon=True)
    reviewer_thread.start()
    steps = [
        fake_api.tool_use("mcp__harness__list_directory", path="."),
        fake_api.tool_use("Write", file_path=str(target), content="written after approval\n"),
    ]
    with fake_api.FakeAnthropic(steps) as fake:
        run_claude(fake, live_stack, live_agent, project, home)
        listing, write = told(fake, 0), told(fake, 1)
    reviewer_thread.join(5)
    # A Harness tool over MCP: run by the worker (read-only: standard mode allows it).
    listed = ToolCall.objects.get(session__agent=live_agent.agent, name="list_directory")
    assert listed.status == Status.COMPLETED and listed.session.client == "mcp"
    assert listed.content.strip() in listing or listing.strip() in listed.content
    # Claude Code's own Write: asked through approval_prompt, approved, then run by Claude Code.
    prompt = ToolCall.objects.get(session__agent=live_agent.agent, name="client_tool")
    assert prompt.arguments["tool_name"] == "Write"
    assert prompt.arguments["input"]["file_path"] == str(target)
    assert prompt.status == Status.RELEASED and prompt.decided_by.startswith("user:")
    assert target.read_text() == "written after approval\n"
    assert "error" not in write.lower()
