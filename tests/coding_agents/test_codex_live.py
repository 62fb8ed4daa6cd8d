"""The real Codex CLI behind Harness: `codex exec` against a fake OpenAI Responses API on
loopback (tests/support/fake_openai.py, streaming server-sent events), with the hooks
`manage.py codex_settings` prints, against a live daphne + Celery worker.

Codex's own approvals and sandbox are bypassed here (`--dangerously-bypass-approvals-and-
sandbox`) and its hook trust too (`--dangerously-bypass-hook-trust`, for one invocation:
an untrusted hook does not run at all, see docs/coding-agents.md), so that Harness's hook
is the only gate: what does not run, did not run because Harness said no (or could not
answer). A file on disk proves what ran; the fake model's next request shows what Codex
told the model.

The CLI is the pinned @openai/codex that `make codex` installs under var/codex (`make
test` does it). Without it these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from approvals import services as approvals
from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.approvals.conftest import closing_connections
from tests.support import processes
from tests.support.coding_agent_hooks import unable_hook_bin
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.fake_openai import FakeOpenAI, Step, call, custom_call, say
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]

CLI = Path(os.environ.get("HARNESS_CODEX_CLI") or ROOT / "var/codex/node_modules/.bin/codex")
# A model Codex 0.171.0 knows: it offers exec_command and a freeform apply_patch for it.
MODEL = "gpt-5.5"


@pytest.fixture(scope="session")
def codex_cli() -> Path:
    if not CLI.exists():
        message = (
            f"The Codex tests need the pinned CLI at {CLI}: run `make codex` (node and npm; "
            "`make test` does it), or set HARNESS_CODEX_CLI."
        )
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    return CLI


@dataclass
class Codex:
    """One Codex project on 'the developer's machine', connected to Harness."""

    cli: Path
    hook_bin: Path
    home: Path  # CODEX_HOME
    project: Path
    token: str
    hooks: str = ""

    def configure(self, agent_name: str, url: str, wait: float = 60) -> None:
        """The hooks codex_settings prints, as the docs say to put them in config.toml."""
        out = StringIO()
        call_command(
            "codex_settings",
            *("--agent", agent_name, "--url", url, "--wait", str(wait)),
            stdout=out,
            stderr=StringIO(),
        )
        self.hooks = out.getvalue()

    def start(
        self, fake: FakeOpenAI, prompt: str = "Do the task.", own_sandbox: bool = False
    ) -> subprocess.Popen[str]:
        """`own_sandbox`: without --dangerously-bypass-approvals-and-sandbox, so Codex's own
        sandbox (the `sandbox_mode` codex_settings prints) bounds what it runs."""
        top = f'model = "{MODEL}"\nmodel_provider = "fake"\ncheck_for_update_on_startup = false\n'
        provider = (
            "\n[model_providers.fake]\n"
            'name = "fake"\n'
            f'base_url = "{fake.url}"\n'
            'wire_api = "responses"\n'
            'env_key = "FAKE_OPENAI_KEY"\n'
        )
        # The printed block's `sandbox_mode` must stay above every table (as it says).
        (self.home / "config.toml").write_text(top + self.hooks + provider)
        env = {
            "PATH": f"{self.hook_bin}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "HOME": str(self.home.parent),
            "CODEX_HOME": str(self.home),
            "FAKE_OPENAI_KEY": "sk-test-not-a-key",
            "HARNESS_TOKEN": self.token,
        }
        return processes.start(
            [
                str(self.cli),
                "exec",
                "--skip-git-repo-check",
                "--dangerously-bypass-hook-trust",
                *([] if own_sandbox else ["--dangerously-bypass-approvals-and-sandbox"]),
                prompt,
            ],
            cwd=self.project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(self, process: subprocess.Popen[str], timeout: float = 120) -> str:
        stdout, stderr = processes.finish(process, timeout)
        assert process.returncode == 0, stderr[-3000:]
        return stderr

    def run(self, steps: list[Step], own_sandbox: bool = False) -> FakeOpenAI:
        with FakeOpenAI(steps) as fake:
            self.finish(self.start(fake, own_sandbox=own_sandbox))
        return fake

    def calls(self) -> list[ToolCall]:
        return list(
            ToolCall.objects.filter(session__workspace=str(self.project)).order_by("created_at")
        )


@pytest.fixture
def codex(
    codex_cli: Path, hook_bin: Path, live_stack: LiveStack, live_agent: AgentFixture, tmp_path: Path
) -> Codex:
    home, project = tmp_path / "home" / ".codex", tmp_path / "project"
    home.mkdir(parents=True)
    project.mkdir()
    developer = Codex(codex_cli, hook_bin, home, project, live_agent.token)
    developer.configure(live_agent.agent.name, live_stack.url)
    return developer


def allow(fx: AgentFixture, *rules: str) -> None:
    profiles.update_profile(
        user=fx.owner, mode="standard", actor="test", allow=list(rules), ask=[], deny=[]
    )


def told(fake: FakeOpenAI) -> list[str]:
    """What Codex sent the model as each tool call's output, in order."""
    return list(fake.tool_outputs().values())


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


# --- Without a reviewer --------------------------------------------------------------------------


def test_a_command_allowed_by_a_rule_runs_and_its_result_is_reported(
    codex: Codex, live_agent: AgentFixture
) -> None:
    allow(live_agent, "Bash(touch made.txt)")
    fake = codex.run([call("exec_command", cmd="touch made.txt")])
    assert (codex.project / "made.txt").exists()
    [output] = told(fake)
    assert "Process exited with code 0" in output
    [made] = codex.calls()
    assert (made.name, made.arguments) == ("Bash", {"command": "touch made.txt"})
    assert made.status == Status.REPORTED and made.decided_by == "rule:allow:Bash(touch made.txt)"
    assert made.session.client == "codex"


def test_a_blocklisted_command_is_denied_without_asking(codex: Codex) -> None:
    fake = codex.run([call("exec_command", cmd="eval 'touch evaled.txt'")])
    assert not (codex.project / "evaled.txt").exists()
    [output] = told(fake)
    assert "Command blocked by PreToolUse hook" in output and "'eval' is blocked" in output
    [denied] = codex.calls()
    assert denied.status == Status.DENIED and denied.decided_by == "guard:command_blocklist"
    assert not ApprovalRequest.objects.filter(call=denied).exists()


def test_a_patch_naming_a_file_outside_the_project_is_denied_and_one_inside_is_applied(
    codex: Codex, live_agent: AgentFixture, tmp_path: Path
) -> None:
    allow(live_agent, "apply_patch(src/**)")
    outside = tmp_path / "outside.txt"
    fake = codex.run(
        [
            custom_call("apply_patch", patch(f"*** Add File: {outside}", "+escaped")),
            custom_call("apply_patch", patch("*** Add File: src/inside.txt", "+inside")),
        ]
    )
    assert not outside.exists()
    assert (codex.project / "src" / "inside.txt").read_text() == "inside\n"
    escaped, applied = told(fake)
    assert "blocked by PreToolUse hook" in escaped and "outside the project" in escaped
    assert "Success" in applied
    denied, reported = codex.calls()
    assert (denied.status, denied.decided_by) == (Status.DENIED, "guard:workspace_confinement")
    assert (reported.status, reported.decided_by) == (
        Status.REPORTED,
        "rule:allow:apply_patch(src/**)",
    )


# --- A reviewer ------------------------------------------------------------------------------------


def _decide_when_asked(
    project: Path, approve: bool, feedback: str = ""
) -> tuple[str, threading.Thread]:
    name = unique("reviewer")
    reviewer = make_user(name, groups=("reviewer",))

    def decide() -> None:
        for _ in range(600):
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
        assert not (project / "approved.txt").exists()  # held while it asks
        approvals.decide(
            approval_id=approval.pk,
            user=reviewer,
            approve=approve,
            digest=approval.call.digest,
            feedback=feedback,
        )

    thread = threading.Thread(target=closing_connections(decide))
    thread.start()
    return name, thread


def test_a_command_that_asks_runs_once_a_reviewer_approves(codex: Codex) -> None:
    name, thread = _decide_when_asked(codex.project, approve=True)
    codex.run([call("exec_command", cmd="touch approved.txt")])
    thread.join()
    assert (codex.project / "approved.txt").exists()
    [approved] = codex.calls()
    assert approved.status == Status.REPORTED and approved.decided_by == f"user:{name}"


def test_a_command_denied_with_feedback_does_not_run_and_the_model_reads_it(codex: Codex) -> None:
    feedback = "Not on this machine: run `make test-pg` instead."
    _, thread = _decide_when_asked(codex.project, approve=False, feedback=feedback)
    fake = codex.run([call("exec_command", cmd="touch denied.txt"), say("Understood.")])
    thread.join()
    assert not (codex.project / "denied.txt").exists()
    [output] = told(fake)
    assert "Command blocked by PreToolUse hook" in output and feedback in output
    assert codex.calls()[0].status == Status.DENIED


# --- Fail closed ------------------------------------------------------------------------------------


def test_with_harness_stopped_nothing_runs(
    codex: Codex, live_agent: AgentFixture, down_url: str
) -> None:
    codex.configure(live_agent.agent.name, down_url)
    fake = codex.run(
        [
            call("exec_command", cmd="touch ran.txt"),
            custom_call("apply_patch", patch("*** Add File: written.txt", "+x")),
        ]
    )
    assert not (codex.project / "ran.txt").exists()
    assert not (codex.project / "written.txt").exists()
    outputs = told(fake)
    assert len(outputs) == 2
    assert all("blocked by PreToolUse hook" in o and "cannot be reached" in o for o in outputs), (
        outputs
    )


@pytest.mark.parametrize("hook", ["missing", "broken interpreter", "crash"])
def test_with_the_hook_unable_to_run_nothing_runs(codex: Codex, tmp_path: Path, hook: str) -> None:
    """Codex blocks only on exit 2 with a reason on stderr: command not found (127) or a
    crash (1) would let the tool run, so the printed command turns them into exit 2."""
    codex.hook_bin = unable_hook_bin(tmp_path, hook)
    fake = codex.run(
        [
            call("exec_command", cmd="touch ran.txt"),
            custom_call("apply_patch", patch("*** Add File: written.txt", "+x")),
        ]
    )
    assert not (codex.project / "ran.txt").exists()
    assert not (codex.project / "written.txt").exists()
    outputs = told(fake)
    assert len(outputs) == 2
    assert all("blocked by PreToolUse hook" in o and "--command" in o for o in outputs)


def test_with_the_token_revoked_nothing_runs(codex: Codex, live_agent: AgentFixture) -> None:
    agents.revoke_agent(agent=live_agent.agent, actor="test")
    fake = codex.run([call("exec_command", cmd="touch revoked.txt")])
    assert not (codex.project / "revoked.txt").exists()
    [output] = told(fake)
    assert "refused the agent token" in output
    assert not codex.calls()


def test_the_tools_codex_offers_with_hooks_are_known(codex: Codex) -> None:
    """The pinned Codex offers exec_command (hooked as Bash) and apply_patch; a tool a new
    version adds shows up here, to be checked for a hook and given its annotations."""
    fake = codex.run([])
    offered = fake.tool_names_offered()
    assert {"exec_command", "apply_patch"} <= offered
    known_without_hooks = {
        "write_stdin",  # input to a command already allowed (see docs/coding-agents.md)
        "view_image",
        "web_search",
        "tool_search",
        "request_user_input",
        "create_goal",
        "get_goal",
        "update_goal",
    }
    assert offered - {"exec_command", "apply_patch"} <= known_without_hooks
