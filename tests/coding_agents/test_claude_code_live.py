"""The real Claude Code CLI behind Harness: `claude -p` against a fake Messages API on
loopback (tests/support/fake_anthropic.py), with the settings `manage.py
claude_code_settings` prints, against a live daphne + Celery worker.

Claude Code's own permission system allows Bash, Write, Edit and Read here
(`--allowedTools`), so that Harness's hook is the only gate: what does not run, did not
run because Harness said no (or could not answer). A file on disk proves what ran.

The CLI is the pinned `@anthropic-ai/claude-code` that `make claude-code` installs under
var/claude-code (`make test` does it). Without it these tests skip, except under CI=true,
where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from tests.battery.procs import wait_until
from tests.support import processes
from tests.support.browser import login
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.fake_anthropic import FakeAnthropic, Step, say, tool_use
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]

CLI = Path(
    os.environ.get("HARNESS_CLAUDE_CLI") or ROOT / "var/claude-code/node_modules/.bin/claude"
)
ALLOWED_BY_CLAUDE_CODE = "Bash Write Edit Read"


@pytest.fixture(scope="session")
def claude_cli() -> Path:
    if not CLI.exists():
        message = (
            f"The Claude Code tests need the pinned CLI at {CLI}: run `make claude-code` "
            "(node and npm; `make test` does it), or set HARNESS_CLAUDE_CLI."
        )
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    return CLI


@dataclass
class Claude:
    """One Claude Code project on 'the developer's machine', connected to Harness."""

    cli: Path
    hook_bin: Path
    home: Path
    project: Path
    token: str

    def configure(self, agent_name: str, url: str, wait: float = 60) -> None:
        """Write the settings claude_code_settings prints, as the docs say to."""
        out = StringIO()
        call_command(
            "claude_code_settings",
            "--agent",
            agent_name,
            "--url",
            url,
            "--wait",
            str(wait),
            stdout=out,
            stderr=StringIO(),
        )
        (self.project / ".claude").mkdir(exist_ok=True)
        (self.project / ".claude" / "settings.json").write_text(out.getvalue())

    def start(self, fake: FakeAnthropic, prompt: str = "Do the task.") -> subprocess.Popen[str]:
        env = {
            "PATH": f"{self.hook_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "HARNESS_TOKEN": self.token,
        }
        return processes.start(
            [
                str(self.cli),
                "-p",
                prompt,
                "--output-format",
                "json",
                "--allowedTools",
                ALLOWED_BY_CLAUDE_CODE,
            ],
            cwd=self.project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(self, process: subprocess.Popen[str], timeout: float = 90) -> dict[str, Any]:
        # (its PostToolUse reports run in the background: a hook still filing one when
        # the CLI exits is let finish, as on a developer's machine, not killed with it)
        stdout, stderr = processes.finish(process, timeout, let_finish="harness-hook")
        assert process.returncode == 0, stderr[-3000:]
        return dict(json.loads(stdout))

    def run(self, steps: list[Step]) -> tuple[dict[str, Any], FakeAnthropic]:
        with FakeAnthropic(steps) as fake:
            return self.finish(self.start(fake)), fake


@pytest.fixture
def claude(
    claude_cli: Path,
    hook_bin: Path,
    live_stack: LiveStack,
    live_agent: AgentFixture,
    tmp_path: Path,
) -> Claude:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    developer = Claude(claude_cli, hook_bin, home, project, live_agent.token)
    developer.configure(live_agent.agent.name, live_stack.url)
    return developer


def calls_of(result: dict[str, Any]) -> list[ToolCall]:
    """The session's calls, once every released call's result is in: Claude Code sends
    PostToolUse reports in the background ("async" in claude_code_settings), so `claude -p`
    may exit before its last report has been filed."""
    calls = ToolCall.objects.filter(session__external_id=result["session_id"])
    wait_until(
        lambda: not calls.filter(status=Status.RELEASED).exists(),
        30,
        "Claude Code's background PostToolUse reports",
    )
    return list(calls.order_by("created_at"))


def result_for(fake: FakeAnthropic, index: int) -> dict[str, Any]:
    """What the model was told about its `index`th tool call (the next request carried it)."""
    return fake.tool_results()[index]


def text_of(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


# --- Without a reviewer --------------------------------------------------------------------------


def test_a_read_runs_without_a_reviewer_and_its_result_is_reported(claude: Claude) -> None:
    (claude.project / "notes.txt").write_text("the answer is 42\n")
    result, fake = claude.run([tool_use("Read", file_path=str(claude.project / "notes.txt"))])
    told = result_for(fake, 0)
    assert "the answer is 42" in text_of(told) and not told.get("is_error")
    [call] = calls_of(result)
    assert (call.name, call.status, call.decided_by) == ("Read", Status.REPORTED, "mode:standard")
    assert "the answer is 42" in call.content  # what Claude Code reported, marked as such
    assert not ApprovalRequest.objects.filter(call=call).exists()


def test_a_blocklisted_command_is_denied_without_asking(claude: Claude) -> None:
    result, fake = claude.run([tool_use("Bash", command="eval 'touch evaled.txt'")])
    assert not (claude.project / "evaled.txt").exists()
    told = result_for(fake, 0)
    assert told["is_error"] is True and "'eval' is blocked" in text_of(told)
    [call] = calls_of(result)
    assert call.status == Status.DENIED and call.decided_by == "guard:command_blocklist"
    assert not ApprovalRequest.objects.filter(call=call).exists()


def test_an_edit_outside_the_project_is_denied(claude: Claude, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"  # Claude Code creates a new file with an empty old_string
    result, fake = claude.run(
        [tool_use("Edit", file_path=str(outside), old_string="", new_string="escaped\n")]
    )
    assert not outside.exists()
    told = result_for(fake, 0)
    assert told["is_error"] is True and "outside the project directory" in text_of(told)
    [call] = calls_of(result)
    assert call.decided_by == "guard:workspace_confinement"


# --- A reviewer in the browser ---------------------------------------------------------------------


@dataclass
class Reviewer:
    username: str
    page: Any


@pytest.fixture
def reviewer(browser: Any, live_stack: LiveStack, live_db: None) -> Iterator[Reviewer]:
    username = unique("reviewer")
    make_user(username, groups=("reviewer",))
    context = browser.new_context(viewport={"width": 390, "height": 844})  # a phone
    page = context.new_page()
    login(page, live_stack.url, username)
    page.goto(f"{live_stack.url}/approvals/")
    page.wait_for_selector("#live-state.on", timeout=5000)
    yield Reviewer(username, page)
    context.close()


@pytest.mark.browser
def test_a_bash_that_asks_is_approved_in_the_browser_and_then_runs(
    claude: Claude, reviewer: Reviewer
) -> None:
    with FakeAnthropic([tool_use("Bash", command="touch approved.txt")]) as fake:
        process = claude.start(fake)
        item = reviewer.page.locator("article.approval", has_text="touch approved.txt")
        item.wait_for(timeout=30000)
        assert str(claude.project) in item.inner_text()  # the project directory
        assert not (claude.project / "approved.txt").exists()  # held while it asks
        item.get_by_role("button", name="Approve", exact=True).click()
        result = claude.finish(process)
    assert (claude.project / "approved.txt").exists()
    assert not result_for(fake, 0).get("is_error")
    [call] = calls_of(result)
    assert call.status == Status.REPORTED and call.decided_by == f"user:{reviewer.username}"


@pytest.mark.browser
def test_a_bash_denied_with_feedback_does_not_run_and_the_model_reads_the_feedback(
    claude: Claude, reviewer: Reviewer
) -> None:
    feedback = "Not on this machine: run `make test-pg` instead."
    steps = [tool_use("Bash", command="touch denied.txt"), say("Understood.")]
    with FakeAnthropic(steps) as fake:
        process = claude.start(fake)
        item = reviewer.page.locator("article.approval", has_text="touch denied.txt")
        item.wait_for(timeout=30000)
        item.locator("textarea[name=feedback]").fill(feedback)
        item.get_by_role("button", name="Deny").click()
        result = claude.finish(process)
    assert not (claude.project / "denied.txt").exists()
    told = result_for(fake, 0)  # in the model's next request
    assert told["is_error"] is True and feedback in text_of(told)
    [call] = calls_of(result)
    assert call.status == Status.DENIED


# --- Fail closed ------------------------------------------------------------------------------------


def test_with_harness_stopped_nothing_runs(
    claude: Claude, live_agent: AgentFixture, down_url: str
) -> None:
    claude.configure(live_agent.agent.name, down_url)
    steps = [
        tool_use("Bash", command="touch ran.txt"),
        tool_use("Write", file_path=str(claude.project / "written.txt"), content="x"),
    ]
    result, fake = claude.run(steps)
    assert not (claude.project / "ran.txt").exists()
    assert not (claude.project / "written.txt").exists()
    for told in fake.tool_results():
        assert told["is_error"] is True and "cannot be reached" in text_of(told)


def test_with_the_token_revoked_nothing_runs(claude: Claude, live_agent: AgentFixture) -> None:
    agents.revoke_agent(agent=live_agent.agent, actor="test")
    result, fake = claude.run([tool_use("Bash", command="touch revoked.txt")])
    assert not (claude.project / "revoked.txt").exists()
    told = result_for(fake, 0)
    assert told["is_error"] is True and "refused the agent token" in text_of(told)
    assert not ToolCall.objects.filter(session__agent=live_agent.agent).exists()


@pytest.mark.parametrize("hook", ["missing", "broken interpreter", "crash"])
def test_with_the_hook_unable_to_run_nothing_runs(
    claude: Claude, tmp_path: Path, hook: str
) -> None:
    """The PATH Claude Code sees lacks harness-hook, or it names an interpreter that is not
    there, or it crashes: command not found (127) and a crash (1) do not block in Claude
    Code, so the printed command turns them into exit 2."""
    claude.hook_bin = tmp_path / "bin"
    claude.hook_bin.mkdir()
    script = {"broken interpreter": "#!/nonexistent/python3\n", "crash": "#!/bin/sh\nexit 1\n"}
    if hook in script:
        (claude.hook_bin / "harness-hook").write_text(script[hook])
        (claude.hook_bin / "harness-hook").chmod(0o755)
    path = f"{claude.hook_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    assert (shutil.which("harness-hook", path=path) is None) == (hook == "missing")
    result, fake = claude.run([tool_use("Bash", command="touch ran.txt")])
    assert not (claude.project / "ran.txt").exists()
    told = result_for(fake, 0)
    assert told["is_error"] is True and "did not run or gave no decision" in text_of(told)
    assert "--command" in text_of(told)  # the fix is named


def test_every_tool_the_cli_offers_is_known_or_asks_on_purpose(claude: Claude) -> None:
    """The pinned Claude Code's tools are Harness tools, or resolve to the generic tool that
    asks: a tool a new version adds shows up here, to be given its annotations."""
    from dispatcher.tools.claude_code import TOOLS

    _, fake = claude.run([])
    offered = fake.tool_names_offered()
    assert {"Bash", "Read", "Write", "Edit", "Agent"} <= offered
    asks_as_unknown = {"Skill", "ScheduleWakeup", "Workflow", "DeferredToolPlaceholder"}
    assert offered - {tool.name for tool in TOOLS} <= asks_as_unknown
