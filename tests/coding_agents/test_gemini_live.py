"""The real Gemini CLI behind Harness: `gemini -p` against a fake Gemini API on loopback
(tests/support/fake_gemini.py, streaming server-sent events; GOOGLE_GEMINI_BASE_URL), with
the hooks `manage.py gemini_settings` prints, against a live daphne + Celery worker.

Gemini CLI's own approvals are off here (`--yolo`), so that Harness's hook is the only
gate: what does not run, did not run because Harness said no (or could not answer). A
file on disk proves what ran; the fake model's next request shows what Gemini CLI told
the model.

The CLI is the pinned @google/gemini-cli that `make gemini-cli` installs under
var/gemini-cli (`make test` does it). Without it these tests skip, except under CI=true,
where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from approvals import services as approvals
from approvals.models import ApprovalRequest
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.approvals.conftest import closing_connections
from tests.support import processes
from tests.support.coding_agent_hooks import unable_hook_bin
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.fake_gemini import FakeGemini, Step, call, say
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]

CLI = Path(os.environ.get("HARNESS_GEMINI_CLI") or ROOT / "var/gemini-cli/node_modules/.bin/gemini")


@pytest.fixture(scope="session")
def gemini_cli() -> Path:
    if not CLI.exists():
        message = (
            f"The Gemini CLI tests need the pinned CLI at {CLI}: run `make gemini-cli` (node "
            "and npm; `make test` does it), or set HARNESS_GEMINI_CLI."
        )
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    return CLI


@dataclass
class Gemini:
    """One Gemini CLI project on 'the developer's machine', connected to Harness."""

    cli: Path
    hook_bin: Path
    home: Path
    project: Path
    token: str

    def configure(self, agent_name: str, url: str, wait: float = 60) -> None:
        """The settings gemini_settings prints, in ~/.gemini/settings.json, with an API key
        login and folder trust off (a scratch project)."""
        out = StringIO()
        call_command(
            "gemini_settings",
            *("--agent", agent_name, "--url", url, "--wait", str(wait)),
            stdout=out,
            stderr=StringIO(),
        )
        settings = json.loads(out.getvalue())
        settings["security"] = {
            "auth": {"selectedType": "gemini-api-key"},
            "folderTrust": {"enabled": False},
        }
        (self.home / ".gemini").mkdir(exist_ok=True)
        (self.home / ".gemini" / "settings.json").write_text(json.dumps(settings))

    def run(self, steps: list[Step]) -> tuple[dict[str, Any], FakeGemini]:
        env = {
            "PATH": f"{self.hook_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(self.home),
            "GEMINI_API_KEY": "test-not-a-key",
            "HARNESS_TOKEN": self.token,
        }
        with FakeGemini(steps) as fake:
            env["GOOGLE_GEMINI_BASE_URL"] = fake.url
            done = processes.run(
                [str(self.cli), "-p", "Do the task.", "--yolo", "--output-format", "json"],
                cwd=self.project,
                env=env,
                stdin=subprocess.DEVNULL,
                timeout=180,
            )
        assert done.returncode == 0, done.stderr[-3000:]
        return dict(json.loads(done.stdout)), fake


@pytest.fixture
def gemini(
    gemini_cli: Path,
    hook_bin: Path,
    live_stack: LiveStack,
    live_agent: AgentFixture,
    tmp_path: Path,
) -> Gemini:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    developer = Gemini(gemini_cli, hook_bin, home, project, live_agent.token)
    developer.configure(live_agent.agent.name, live_stack.url)
    return developer


def calls_of(result: dict[str, Any]) -> list[ToolCall]:
    return list(
        ToolCall.objects.filter(session__external_id=result["session_id"]).order_by("created_at")
    )


def told(fake: FakeGemini) -> list[dict[str, Any]]:
    """The functionResponse Gemini CLI sent the model for each tool call, in order."""
    return [response["response"] for response in fake.function_responses()]


def test_a_read_runs_without_a_reviewer_and_its_result_is_reported(gemini: Gemini) -> None:
    (gemini.project / "notes.txt").write_text("the answer is 42\n")
    result, fake = gemini.run([call("read_file", file_path=str(gemini.project / "notes.txt"))])
    [response] = told(fake)
    assert "the answer is 42" in json.dumps(response) and "error" not in response
    [read] = calls_of(result)
    assert (read.name, read.status, read.decided_by) == (
        "read_file",
        Status.REPORTED,
        "mode:standard",
    )
    assert "the answer is 42" in read.content
    assert read.session.client == "gemini-cli"


def test_a_command_allowed_by_a_rule_runs(gemini: Gemini, live_agent: AgentFixture) -> None:
    profiles.update_profile(
        user=live_agent.owner,
        mode="standard",
        actor="test",
        allow=["run_shell_command(touch made.txt)"],
        ask=[],
        deny=[],
    )
    result, _ = gemini.run([call("run_shell_command", command="touch made.txt")])
    assert (gemini.project / "made.txt").exists()
    [made] = calls_of(result)
    assert made.status == Status.REPORTED
    assert made.decided_by == "rule:allow:run_shell_command(touch made.txt)"


def test_a_blocklisted_command_is_denied_without_asking_and_gemini_refuses_outside_paths(
    gemini: Gemini, tmp_path: Path
) -> None:
    """Gemini CLI refuses a path outside its workspace itself, before any hook (measured
    with 0.61.0): Harness's confinement is the second fence there, tested through the
    endpoint (test_gemini_endpoint.py)."""
    outside = tmp_path / "outside.txt"
    result, fake = gemini.run(
        [
            call("write_file", file_path=str(outside), content="escaped\n"),
            call("run_shell_command", command="eval 'touch evaled.txt'"),
        ]
    )
    assert not outside.exists() and not (gemini.project / "evaled.txt").exists()
    write, shell = told(fake)
    assert "Path not in workspace" in write["error"]
    assert "Tool execution blocked" in shell["error"] and "'eval' is blocked" in shell["error"]
    [denied] = calls_of(result)  # the write never reached Harness
    assert (denied.name, denied.decided_by) == ("run_shell_command", "guard:command_blocklist")
    assert not ApprovalRequest.objects.filter(call=denied).exists()


def test_a_command_denied_by_a_reviewer_does_not_run_and_the_model_reads_the_feedback(
    gemini: Gemini,
) -> None:
    feedback = "Not on this machine: run `make test-pg` instead."
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    project = gemini.project

    def deny_when_asked() -> None:
        for _ in range(1200):
            approval = (
                ApprovalRequest.objects.filter(call__session__workspace=str(project))
                .select_related("call")
                .first()
            )
            if approval is not None:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the call never asked")
        approvals.decide(
            approval_id=approval.pk,
            user=reviewer,
            approve=False,
            digest=approval.call.digest,
            feedback=feedback,
        )

    thread = threading.Thread(target=closing_connections(deny_when_asked))
    thread.start()
    result, fake = gemini.run([call("run_shell_command", command="touch denied.txt"), say("OK.")])
    thread.join()
    assert not (gemini.project / "denied.txt").exists()
    [response] = told(fake)
    assert feedback in response["error"]
    assert calls_of(result)[0].status == Status.DENIED


def test_with_harness_stopped_nothing_runs(
    gemini: Gemini, live_agent: AgentFixture, down_url: str
) -> None:
    gemini.configure(live_agent.agent.name, down_url)
    _, fake = gemini.run(
        [
            call("run_shell_command", command="touch ran.txt"),
            call("write_file", file_path=str(gemini.project / "written.txt"), content="x"),
        ]
    )
    assert not (gemini.project / "ran.txt").exists()
    assert not (gemini.project / "written.txt").exists()
    responses = told(fake)
    assert len(responses) == 2
    assert all("cannot be reached" in response["error"] for response in responses), responses


@pytest.mark.parametrize("hook", ["missing", "broken interpreter", "crash"])
def test_with_the_hook_unable_to_run_nothing_runs(
    gemini: Gemini, tmp_path: Path, hook: str
) -> None:
    """Gemini CLI lets a tool run when its hook exits 1 (a crash: 'non-blocking error'),
    and when it exits without output; the printed command turns each into exit 2. (The
    reporting hooks fail with exit 1, so the prompt goes on and each tool is refused with
    the fix, rather than the whole prompt with 'command not found'.)"""
    gemini.hook_bin = unable_hook_bin(tmp_path, hook)
    _, fake = gemini.run(
        [
            call("run_shell_command", command="touch ran.txt"),
            call("write_file", file_path=str(gemini.project / "written.txt"), content="x"),
        ]
    )
    assert not (gemini.project / "ran.txt").exists()
    assert not (gemini.project / "written.txt").exists()
    responses = told(fake)
    assert len(responses) == 2
    assert all("--command" in response["error"] for response in responses)


def test_every_tool_the_cli_offers_is_known_or_asks_on_purpose(gemini: Gemini) -> None:
    """The pinned Gemini CLI's tools are Harness tools, or resolve to the generic tool that
    asks: a tool a new version adds shows up here, to be given its annotations."""
    from dispatcher.tools.gemini import TOOLS

    _, fake = gemini.run([])
    offered = fake.tool_names_offered()
    assert {"run_shell_command", "read_file", "write_file", "replace"} <= offered
    asks_as_unknown = {"invoke_agent"}  # a subagent: not checked yet that its tools are hooked
    assert offered - {tool.name for tool in TOOLS} <= asks_as_unknown
