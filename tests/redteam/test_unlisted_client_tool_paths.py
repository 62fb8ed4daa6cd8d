"""A client's tool that no tool set lists (Claude Code 2.1's `Artifact`, which publishes the
local files its `file_path` names; any tool of a later version) was asked about with its
input unread: through the hook or the permission prompt, in trusted mode, an `Artifact`
of ~/.ssh/id_rsa or /etc/passwd was allowed, and through the prompt of an agent with no
workspace it was allowed rather than asked. The values of its input's path-like keys
(`file_path`, `file_paths`, `path`, `cwd`, ... at any depth: `base.input_paths`) are now
confined as a known tool's paths: outside the project denied, on every mode; with no
workspace to confine them to, an allow asks. A tool whose input names no path is as before.

Live: daphne and the official MCP client for the prompt, as Claude Code calls it; the
Claude Code hook endpoint for the hook."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from audit import kinds
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from dispatcher.policy.profiles import update_profile
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import review
from tests.redteam.test_prompt_paths import _prompt
from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent, make_user, unique
from tests.support.live import LiveStack

PUBLISH = {"favicon": "\U0001f4ca", "description": "The report"}


def _artifact(**paths: object) -> dict[str, object]:
    return {**PUBLISH, **paths}


@pytest.mark.live
def test_the_prompts_unlisted_tool_has_its_paths_confined(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fx = make_agent(mode="trusted", workspace=str(project))

    outside = _prompt(live_stack, fx, "Artifact", _artifact(file_path="/home/dev/.ssh/id_rsa"))
    assert outside["behavior"] == "deny", outside
    assert "/home/dev/.ssh/id_rsa" in outside["message"]
    assert "outside the project" in outside["message"]
    call = ToolCall.objects.filter(session__agent=fx.agent).latest("created_at")
    assert call.status == Status.DENIED and call.decided_by == "guard:workspace_confinement"

    # A list of paths, a nested one, a key spelt otherwise, `..` out of the project.
    for tool_input in (
        _artifact(file_paths=["report.md", "/etc/passwd"]),
        _artifact(pages=[{"notebookPath": "/etc/shadow"}]),
        _artifact(file_path=f"{project}/../../etc/passwd"),
        {"cwd": "/", "prompt": "publish"},
        _artifact(file_path=" /etc/hosts"),
    ):
        answer = _prompt(live_stack, fx, "Artifact", tool_input)
        assert answer["behavior"] == "deny", (tool_input, answer)
    # A path-like key Harness cannot read as paths is denied, saying so.
    unreadable = _prompt(live_stack, fx, "Artifact", _artifact(file_path={"p": "/etc"}))
    assert unreadable["behavior"] == "deny" and "cannot read the paths" in unreadable["message"]

    inside = _artifact(file_path=str(project / "report.html"), file_paths=["notes.md"])
    assert _prompt(live_stack, fx, "Artifact", inside) == {
        "behavior": "allow",
        "updatedInput": inside,
    }
    # A tool whose input names no path: as before.
    notify = {"message": "done", "status": "proactive"}
    assert _prompt(live_stack, fx, "PushNotification", notify)["behavior"] == "allow"


@pytest.mark.live
def test_without_a_workspace_the_prompts_unlisted_tool_with_paths_is_asked(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")  # no configured workspace
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    seen: list[ToolCall] = []
    answered = threading.Event()

    def deny_when_asked() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not answered.is_set():
            call = ToolCall.objects.filter(
                session__agent=fx.agent, name="client_tool", status=Status.PENDING_APPROVAL
            ).first()
            if call is not None:
                seen.append(call)
                review(call, reviewer, approve=False, feedback="Not my keys.")
                return
            time.sleep(0.1)

    person = threading.Thread(target=closing_connections(deny_when_asked), daemon=True)
    person.start()
    answer = _prompt(live_stack, fx, "Artifact", _artifact(file_path="/home/dev/.ssh/id_rsa"))
    answered.set()
    person.join(5)
    assert seen, "the prompt's Artifact was never asked of a person"
    assert answer["behavior"] == "deny" and "Not my keys." in answer["message"]
    asked = AuditEvent.objects.get(
        subject=f"call:{seen[0].pk}", kind=kinds.CALL_APPROVAL_REQUESTED
    ).payload
    assert asked["by"] == "policy:unconfined-paths", asked
    assert "'Artifact' names paths" in asked["reason"]

    # Naming no path, it is allowed without asking, as before.
    notify = {"message": "done", "status": "proactive"}
    assert _prompt(live_stack, fx, "PushNotification", notify)["behavior"] == "allow"


@pytest.mark.django_db
def test_the_hooks_unlisted_tool_has_its_paths_confined_to_the_project() -> None:
    fx = make_agent(mode="trusted")
    session = str(uuid.uuid4())

    def ask(tool_input: dict[str, object], n: int) -> tuple[str, str]:
        body = claude.pre_tool_use(session, "Artifact", tool_input, f"toolu_a{n}")
        return claude.decision(claude.send(fx, body))

    for n, tool_input in enumerate(
        (
            _artifact(file_path="/home/dev/.ssh/id_rsa"),
            _artifact(file_paths=["report.md", "/etc/passwd"]),
            _artifact(file_path=f"{claude.PROJECT}/../.aws/credentials"),
            _artifact(file_path="~/.aws/credentials"),
        )
    ):
        verdict, reason = ask(tool_input, n)
        assert verdict == "deny", (tool_input, reason)
        assert "outside the project" in reason or "'~'" in reason, reason
    call = ToolCall.objects.get(session__agent=fx.agent, tool_use_id="toolu_a0")
    assert call.decided_by == "guard:workspace_confinement"

    inside = _artifact(file_path=f"{claude.PROJECT}/report.html", file_paths=["notes.md"])
    assert ask(inside, 10)[0] == "allow"


@pytest.mark.live
def test_the_prompts_mcp_tool_is_held_to_its_deny_rules_and_its_arguments_are_not_paths(
    live_stack: LiveStack, live_db: None, tmp_path: Path
) -> None:
    fx = make_agent(mode="trusted", workspace=str(tmp_path / "project"))
    update_profile(
        user=fx.owner, mode="trusted", allow=[], ask=[], deny=["mcp__gh__delete_repo"], actor="t"
    )
    denied = _prompt(live_stack, fx, "mcp__gh__delete_repo", {"repo": "a/b"})
    assert denied["behavior"] == "deny", denied
    call = ToolCall.objects.filter(session__agent=fx.agent).latest("created_at")
    assert call.decided_by == "rule:deny:mcp__gh__delete_repo"
    # Its `path` is its server's (a repository's file here), not a path on the client.
    remote = {"repo": "a/b", "path": "/README.md"}
    assert _prompt(live_stack, fx, "mcp__gh__get_file", remote)["behavior"] == "allow"
