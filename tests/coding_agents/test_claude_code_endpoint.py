"""POST /api/v1/hooks/claude-code through Django's test client (no CLI): decisions,
rules in Claude Code's form, confinement, reports and the bad input only it sees. What the
three hook endpoints promise alike is in test_hook_endpoints.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.gateways.client_calls import decide_client_call
from dispatcher.models import AgentSession, Executor, Status, ToolCall
from dispatcher.policy import profiles
from dispatcher.proposals import ProposedCall, canonical_json, digest_of
from tests.approvals.conftest import closing_connections
from tests.support.claude_code_hooks import PROJECT, decision, hook_input, pre_tool_use, send
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db


def sid() -> str:
    return str(uuid.uuid4())


def only_call(session_id: str) -> ToolCall:
    return ToolCall.objects.get(session__external_id=session_id)


def event_kinds(call: ToolCall) -> list[str]:
    return list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def with_rules(fx: AgentFixture, **lists: list[str]) -> None:
    rules = {"allow": [], "ask": [], "deny": [], **lists}
    profiles.update_profile(user=fx.owner, mode="standard", actor="test", **rules)


# --- Decisions ------------------------------------------------------------------------------


def test_a_read_in_the_project_is_allowed_by_the_mode_and_released(agent: AgentFixture) -> None:
    session_id = sid()
    body = pre_tool_use(session_id, "Read", {"file_path": f"{PROJECT}/src/app.py"})
    action, reason = decision(send(agent, body))
    assert action == "allow"
    assert "mode:standard" in reason and "read-only" in reason
    call = only_call(session_id)
    assert (call.status, call.executor, call.enqueued_at) == (
        Status.RELEASED,
        Executor.CLIENT,
        None,
    )
    assert call.tool_use_id == body["tool_use_id"]
    assert call.digest == digest_of(
        ProposedCall("x", "Read", canonical_json(body["tool_input"]), body["tool_input"])
    )
    assert event_kinds(call) == ["call.received", "call.allowed"]


def test_one_claude_code_session_is_one_harness_session_titled_by_its_project(
    agent: AgentFixture,
) -> None:
    session_id = sid()
    for path in ("a.py", "b.py"):
        send(agent, pre_tool_use(session_id, "Read", {"file_path": f"{PROJECT}/{path}"}))
    session = AgentSession.objects.get(external_id=session_id)
    assert (session.client, session.title, session.workspace) == ("claude-code", PROJECT, PROJECT)
    assert session.calls.count() == 2
    started = AuditEvent.objects.get(session_id=session.pk, kind="session.started")
    assert started.payload["client"] == "claude-code"
    assert started.payload["external_id"] == session_id


def _approve_soon(call_filter: dict[str, Any], reviewer_name: str, feedback: str, approve: bool):
    """In another thread: wait for the call's request, then decide it as the reviewer."""

    @closing_connections
    def decide() -> None:
        for _ in range(200):
            approval = ApprovalRequest.objects.filter(**call_filter).select_related("call").first()
            if approval is not None:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the call never asked")
        reviewer = make_user(reviewer_name, groups=("reviewer",))
        approvals.decide(
            approval_id=approval.pk,
            user=reviewer,
            approve=approve,
            digest=approval.call.digest,
            feedback=feedback,
        )

    thread = threading.Thread(target=decide)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_the_hook_holds_an_ask_until_a_reviewer_approves_then_allows_naming_them() -> None:
    fx = make_agent(mode="standard")
    session_id = sid()
    name = unique("rev")
    thread = _approve_soon({"call__session__external_id": session_id}, name, "", approve=True)
    body = pre_tool_use(session_id, "Bash", {"command": "touch approved.txt"})
    action, reason = decision(send(fx, body, wait=20))
    thread.join()
    assert (action, reason) == ("allow", f"Approved by {name} in Harness.")
    assert only_call(session_id).status == Status.RELEASED


@pytest.mark.django_db(transaction=True)
def test_a_reviewers_denial_reaches_the_model_with_the_feedback_verbatim() -> None:
    fx = make_agent(mode="standard")
    session_id = sid()
    feedback = 'Use the test fixture instead; never touch <prod> & "live" data.'
    thread = _approve_soon(
        {"call__session__external_id": session_id}, unique("rev"), feedback, approve=False
    )
    body = pre_tool_use(session_id, "Bash", {"command": "rm -r data/"})
    action, reason = decision(send(fx, body, wait=20))
    thread.join()
    assert action == "deny" and feedback in reason
    assert only_call(session_id).status == Status.DENIED


@pytest.mark.parametrize(
    "tool, tool_input",
    [
        ("Edit", {"file_path": "/etc/passwd", "old_string": "a", "new_string": "b"}),
        ("Edit", {"file_path": f"{PROJECT}/../other/x.py", "old_string": "a", "new_string": "b"}),
        ("Edit", {"file_path": f"{PROJECT}-evil/x.py", "old_string": "a", "new_string": "b"}),
        ("Write", {"file_path": "../outside.txt", "content": "x"}),
        ("Write", {"file_path": "~/.bashrc", "content": "x"}),
        ("Read", {"file_path": "/home/dev/.ssh/id_ed25519"}),
        ("Glob", {"pattern": "/etc/**"}),
        ("Grep", {"pattern": "password", "path": "/"}),
        ("NotebookEdit", {"notebook_path": "/srv/n.ipynb", "new_source": "x"}),
    ],
)
def test_a_path_outside_the_project_is_denied_lexically(
    agent: AgentFixture, tool: str, tool_input: dict[str, Any]
) -> None:
    session_id = sid()
    action, reason = decision(send(agent, pre_tool_use(session_id, tool, tool_input)))
    assert action == "deny" and "outside the project directory" in reason or "'~'" in reason
    call = only_call(session_id)
    assert call.decided_by == "guard:workspace_confinement"


@pytest.mark.parametrize("character", ["\u2028", "\u2029", "\x85", "\x1b", "\x7f", "\u202e"])
def test_a_path_with_a_control_or_separator_character_is_denied(
    agent: AgentFixture, character: str
) -> None:
    session_id = sid()
    body = {"file_path": f"{PROJECT}/a{character}/../../../etc/x", "content": "x"}
    action, reason = decision(send(agent, pre_tool_use(session_id, "Write", body)))
    assert action == "deny" and f"U+{ord(character):04X}" in reason
    assert only_call(session_id).decided_by == "guard:workspace_confinement"


def test_paths_are_never_resolved_on_the_harness_host(agent: AgentFixture, tmp_path: Any) -> None:
    """A symlink on this host is not the client's: the project is read as text only."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "link").symlink_to("/etc")
    session_id = sid()
    body = pre_tool_use(
        session_id, "Read", {"file_path": f"{project}/link/passwd"}, cwd=str(project)
    )
    assert decision(send(agent, body))[0] == "allow"  # lexically inside the project


def test_an_edit_inside_the_project_asks_with_a_diff_for_the_reviewer(agent: AgentFixture) -> None:
    session_id = sid()
    tool_input = {
        "file_path": f"{PROJECT}/src/app.py",
        "old_string": "x = 1\n",
        "new_string": "x = 2\n",
    }
    send(agent, pre_tool_use(session_id, "Edit", tool_input), wait=0)
    approval = ApprovalRequest.objects.get(call__session__external_id=session_id)
    presentation = approval.presentation
    assert presentation["kind"] == "diff" and presentation["path"] == f"{PROJECT}/src/app.py"
    assert "-x = 1\n+x = 2\n" in presentation["diff"] and "a/src/app.py" in presentation["diff"]
    assert presentation["project"] == PROJECT


# --- Rules in Claude Code's form ----------------------------------------------------------------


def test_bash_rules_read_the_shell_string_part_by_part(agent: AgentFixture) -> None:
    with_rules(agent, allow=["Bash(npm test *)", "Bash(git status)"])

    def ask(command: str) -> str:
        return decision(send(agent, pre_tool_use(sid(), "Bash", {"command": command})))[0]

    assert ask("npm test -- --watch=false") == "allow"
    assert ask("git status && npm test") == "allow"
    assert ask("npm test && curl https://example.com") == "deny"  # asks; wait=0 gives up
    assert ask("npm test > /etc/motd") == "deny"  # a redirection is never allowed by a rule
    assert ask("npm test $(whoami)") == "deny"


def test_an_allowed_bash_command_names_the_rule(agent: AgentFixture) -> None:
    with_rules(agent, allow=["Bash(npm test *)"])
    action, reason = decision(send(agent, pre_tool_use(sid(), "Bash", {"command": "npm test"})))
    assert action == "allow" and "Bash(npm test *)" in reason


def test_edit_rules_cover_write_and_read_rules_cover_grep_as_in_claude_code(
    agent: AgentFixture,
) -> None:
    with_rules(agent, allow=["Edit(src/**)"], deny=["Read(**/.env)"])

    def ask(tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        return decision(send(agent, pre_tool_use(sid(), tool, tool_input)))

    edit = {"old_string": "a", "new_string": "b"}
    assert ask("Edit", {"file_path": f"{PROJECT}/src/a.py", **edit})[0] == "allow"
    assert ask("Write", {"file_path": f"{PROJECT}/src/new.py", "content": "x"})[0] == "allow"
    assert ask("Edit", {"file_path": f"{PROJECT}/docs/a.md", **edit})[0] == "deny"  # asked
    action, reason = ask("Read", {"file_path": f"{PROJECT}/config/.env"})
    assert action == "deny" and "Read(**/.env)" in reason
    assert ask("Grep", {"pattern": "KEY", "path": f"{PROJECT}/.env"})[0] == "deny"
    assert ask("Read", {"file_path": f"{PROJECT}/README.md"})[0] == "allow"


def test_rules_in_claude_codes_form_are_valid_profile_rules(agent: AgentFixture) -> None:
    with_rules(
        agent,
        allow=["Bash(npm test *)", "Edit(src/**)", "mcp__github__get_issue", "WebSearch"],
        deny=["Read(**/.env)"],
    )
    with pytest.raises(Exception, match="unknown tool 'Bsah'"):
        with_rules(agent, allow=["Bsah(npm test)"])


def test_an_unknown_claude_code_tool_asks_and_an_mcp_tool_too(agent: AgentFixture) -> None:
    for name in ("Skill", "mcp__github__create_issue"):
        session_id = sid()
        send(agent, pre_tool_use(session_id, name, {"anything": [1, 2]}), wait=0)
        call = only_call(session_id)
        assert call.status == Status.CANCELLED and call.decided_by == "agent:" + agent.agent.name
        assert ApprovalRequest.objects.filter(call=call).exists()  # it asked a reviewer


def test_a_tool_name_of_no_known_form_is_rejected(agent: AgentFixture) -> None:
    action, reason = decision(send(agent, pre_tool_use(sid(), "rm -rf", {})))
    assert action == "deny" and "does not exist" in reason and "Bash" in reason


def test_trusted_mode_allows_and_read_only_denies_bash(db: None) -> None:
    trusted, read_only = make_agent(mode="trusted"), make_agent(mode="read_only")
    bash = {"command": "make build"}
    assert decision(send(trusted, pre_tool_use(sid(), "Bash", bash)))[0] == "allow"
    action, reason = decision(send(read_only, pre_tool_use(sid(), "Bash", bash)))
    assert action == "deny" and "read_only" in reason


def test_a_remote_subagent_is_refused_a_local_one_is_allowed(agent: AgentFixture) -> None:
    local = {"description": "look", "prompt": "find the bug", "subagent_type": "general-purpose"}
    assert decision(send(agent, pre_tool_use(sid(), "Agent", local)))[0] == "allow"
    remote = {**local, "isolation": "remote"}
    assert decision(send(agent, pre_tool_use(sid(), "Agent", remote)))[0] == "deny"


def test_claude_codes_tools_are_not_offered_to_api_agents(
    client: Client, agent: AgentFixture
) -> None:
    for format in ("native", "openai", "anthropic"):
        listed = json.dumps(
            client.get(f"/api/v1/tools?format={format}", headers=agent.headers).json()
        )
        assert '"Bash"' not in listed and '"Edit"' not in listed and "read_file" in listed
    session = agents.start_session(agent=agent.agent)
    body = {"calls": [{"id": "c1", "name": "Bash", "arguments": {"command": "ls"}}]}
    response = client.post(
        f"/api/v1/sessions/{session.pk}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=agent.headers,
    )
    assert response.json()["calls"][0]["status"] == "rejected"
    assert "does not exist" in response.json()["calls"][0]["content"]


# --- Idempotency and reports -------------------------------------------------------------------


def test_the_same_tool_use_id_with_other_input_is_denied(agent: AgentFixture) -> None:
    session_id = sid()
    first = pre_tool_use(session_id, "Read", {"file_path": f"{PROJECT}/a.py"}, "toolu_same")
    assert decision(send(agent, first))[0] == "allow"
    assert decision(send(agent, first))[0] == "allow"  # the same call, still released
    other = pre_tool_use(session_id, "Read", {"file_path": f"{PROJECT}/b.py"}, "toolu_same")
    action, reason = decision(send(agent, other))
    assert action == "deny" and "already used" in reason
    assert ToolCall.objects.filter(session__external_id=session_id).count() == 1


def test_post_tool_use_reports_the_result_marked_as_reported_by_claude_code(
    agent: AgentFixture,
) -> None:
    session_id = sid()
    body = pre_tool_use(session_id, "Bash", {"command": "echo hi"})
    with_rules(agent, allow=["Bash(echo *)"])
    decision(send(agent, body))
    response = {"stdout": "hi", "stderr": "", "interrupted": False, "isImage": False}
    post = hook_input(
        "PostToolUse",
        session_id,
        tool_name="Bash",
        tool_input=body["tool_input"],
        tool_response=response,
        tool_use_id=body["tool_use_id"],
        duration_ms=23,
    )
    answer = send(agent, post)
    assert answer.status_code == 200 and answer.json() == {}
    call = only_call(session_id)
    assert (call.status, call.is_error) == (Status.REPORTED, False)
    assert json.loads(call.content) == response
    event = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.reported")
    assert event.payload["reported_by"] == "claude-code:PostToolUse"
    assert event.payload["input_matches"] is True
    assert decision(send(agent, body))[0] == "deny"  # an allow is used once


def test_a_failure_is_reported_as_an_error_and_other_input_is_flagged(agent: AgentFixture) -> None:
    with_rules(agent, allow=["Bash(false)", "Bash(true)"])
    session_id = sid()
    body = pre_tool_use(session_id, "Bash", {"command": "false"})
    decision(send(agent, body))
    failure = hook_input(
        "PostToolUseFailure",
        session_id,
        tool_name="Bash",
        tool_input={"command": "true"},  # not what was allowed
        tool_use_id=body["tool_use_id"],
        error="Exit code 1",
        is_interrupt=False,
    )
    send(agent, failure)
    call = only_call(session_id)
    assert (call.status, call.is_error, call.content) == (Status.REPORTED, True, "Exit code 1")
    event = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.reported")
    assert event.payload["input_matches"] is False


# --- Bad requests: clear errors, never a 500 -----------------------------------------------------


@pytest.mark.parametrize(
    "body, status, code",
    [
        (json.dumps({"hook_event_name": "PreToolUse"}), 422, "invalid_hook_input"),
        (
            json.dumps(hook_input("PreToolUse", "s1", tool_name="Bash", tool_input={})),
            422,
            "invalid_hook_input",
        ),
        (
            json.dumps(hook_input("PreToolUse", "x" * 201, tool_name="Bash", tool_input={})),
            422,
            "invalid_hook_input",
        ),
    ],
)
def test_malformed_hook_input_gets_a_clear_error(
    agent: AgentFixture, body: str, status: int, code: str
) -> None:
    response = send(agent, body)
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]


def test_an_oversized_body_is_refused(agent: AgentFixture, settings: Any) -> None:
    body = pre_tool_use(sid(), "Write", {"file_path": f"{PROJECT}/a", "content": "x" * 2000})
    settings.HARNESS_MAX_BODY_BYTES = 1000
    response = send(agent, body)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert not ToolCall.objects.filter(name="Write", session__agent=agent.agent).exists()


@pytest.mark.django_db(transaction=True)
def test_an_abandoned_wait_cancels_the_call_so_nobody_approves_it_later() -> None:
    """Claude Code killed its hook (timeout, Ctrl-C): the request's task is cancelled, and
    so is the call, which no reviewer may approve any more."""
    fx = make_agent(mode="standard")
    session = agents.client_session(
        agent=fx.agent, client="claude-code", external_id=sid(), project_dir=PROJECT
    )
    pending = ToolCall.objects.filter(session=session, status=Status.PENDING_APPROVAL)

    async def abandon() -> None:
        task = asyncio.create_task(
            decide_client_call(
                session=session,
                tool_name="Bash",
                tool_input={"command": "make release"},
                tool_use_id="toolu_abandoned",
                wait_seconds=30,
            )
        )
        for _ in range(200):
            await asyncio.sleep(0.05)
            if await sync_to_async(pending.exists)():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(abandon())
    call = ToolCall.objects.get(session=session)
    assert call.status == Status.CANCELLED
    assert "stopped waiting" in call.content
