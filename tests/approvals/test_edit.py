"""Edit as a new call: the original ends edited, the new call passes the pipeline again,
and the model's tool call is answered by what really ran, with a note saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest, Decision, Vote
from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.approvals.conftest import ask, start_session
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer_client(reviewer: User) -> Client:
    client = Client()
    client.force_login(reviewer)
    return client


def edit(client: Client, approval: ApprovalRequest, **data: Any) -> Any:
    data = {"digest": approval.call.digest, **data}
    return client.post(f"/approvals/{approval.pk}/edit", data, headers={"HX-Request": "true"})


def api_call(fx: AgentFixture, call_id: Any) -> dict[str, Any]:
    response = Client().get(f"/api/v1/calls/{call_id}", headers=fx.headers)
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_editing_write_file_content_runs_the_new_call_and_answers_the_original(
    reviewer_client: Client, reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "rm everything"})
    response = edit(reviewer_client, approval, content="keep everything\n", feedback="safer")
    assert response.status_code == 200, response.content
    assert "Edited write_file" in response.content.decode()

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED and original.decided_by == f"user:{reviewer.username}"
    new = ToolCall.objects.get(edited_from=original)
    assert new.tool_use_id == "w1#edit1" and new.digest != original.digest
    assert new.arguments == {"path": "notes.txt", "content": "keep everything\n"}
    assert new.status == Status.QUEUED  # the edit was the editor's approval
    approval.refresh_from_db()
    assert approval.decision == Decision.EDITED

    execution.execute_call(str(new.pk))
    workspace = Path(new.session.workspace)
    assert (workspace / "notes.txt").read_text() == "keep everything\n"

    answer = api_call(agent, original.pk)
    assert answer["tool_use_id"] == "w1" and answer["status"] == "completed"
    assert answer["content"].startswith(f"[A reviewer ({reviewer.username}) changed the arguments")
    assert '"content":"keep everything\\n"' in answer["content"]
    assert answer["content"].endswith("Wrote 16 bytes to notes.txt")
    assert answer["edited"]["tool_use_id"] == "w1#edit1"

    # The audit says the same: the edit's note, the new call received with its link.
    edited = AuditEvent.objects.get(subject=f"call:{original.pk}", kind="call.edited")
    assert edited.payload["content"] in answer["content"]
    assert edited.payload["replacement"] == "w1#edit1"
    received = AuditEvent.objects.get(subject=f"call:{new.pk}", kind="call.received")
    assert received.payload["edited_from"] == str(original.pk)


def test_resubmitting_the_message_returns_the_replacement_result_for_the_original_id(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    session_id = start_session(agent)
    body = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "write_file",
                    "arguments": json.dumps({"path": "a.txt", "content": "one"}),
                },
            }
        ],
    }
    url = f"/api/v1/sessions/{session_id}/calls"
    Client().post(url, json.dumps(body), content_type="application/json", headers=agent.headers)
    approval = ApprovalRequest.objects.get(call__session_id=session_id)
    edit(reviewer_client, approval, content="two")
    new = ToolCall.objects.get(edited_from=approval.call_id)
    execution.execute_call(str(new.pk))
    again = Client().post(
        url, json.dumps(body), content_type="application/json", headers=agent.headers
    )
    assert again.status_code == 200
    [result] = again.json()["results"]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_1"
    assert "changed the arguments" in result["content"] and "Wrote 3 bytes" in result["content"]


def test_an_edit_denied_by_a_rule_is_refused_and_changes_nothing(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    profiles.update_profile(
        user=agent.owner,
        mode="standard",
        allow=[],
        ask=[],
        deny=["write_file(secrets/**)"],
        actor="test",
    )
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    arguments = json.dumps({"path": "secrets/key.pem", "content": "x"})
    response = edit(reviewer_client, approval, arguments=arguments)
    assert response.status_code == 400
    assert "would not be allowed" in response.content.decode()
    assert "write_file(secrets/**)" in response.content.decode()
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.PENDING_APPROVAL
    assert not ToolCall.objects.filter(edited_from=call).exists()
    assert not AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.edited").exists()
    refused = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="approval.edit_refused")
    assert "secrets/key.pem" in refused.payload["arguments"]


def test_invalid_edited_arguments_are_refused_with_the_schema_error(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    not_json = edit(reviewer_client, approval, arguments="{nope")
    assert not_json.status_code == 400 and "not valid JSON" in not_json.content.decode()
    wrong_type = edit(reviewer_client, approval, arguments=json.dumps({"path": 3, "content": "x"}))
    assert wrong_type.status_code == 400
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_an_edit_needs_the_digest_the_reviewer_saw(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    response = edit(reviewer_client, approval, content="y", digest="f" * 64)
    assert response.status_code == 409 and "digest mismatch" in response.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_unchanged_arguments_are_not_an_edit(reviewer_client: Client, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    response = edit(reviewer_client, approval, content="x")
    assert response.status_code == 400 and "unchanged" in response.content.decode()


def test_an_edit_under_quorum_counts_as_the_editors_approval_only() -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    approval = ask(fx, {"path": "prod.tf", "content": "a"})
    editor = make_user(unique("editor"), groups=("reviewer",))
    client = Client()
    client.force_login(editor)
    response = edit(client, approval, content="b")
    assert response.status_code == 200
    assert f"1 of 2: {editor.username}" in response.content.decode()
    new = ToolCall.objects.get(edited_from=approval.call_id)
    assert new.status == Status.PENDING_APPROVAL
    replacement = ApprovalRequest.objects.get(call=new)
    assert list(Vote.objects.filter(approval=replacement).values_list("via", flat=True)) == ["edit"]
    assert api_call(fx, approval.call_id)["status"] == "pending_approval"
    other = Client()
    other.force_login(make_user(unique("second"), groups=("reviewer",)))
    second = other.post(
        f"/approvals/{replacement.pk}/decide", {"action": "approve", "digest": new.digest}
    )
    assert second.status_code == 302
    new.refresh_from_db()
    assert new.status == Status.QUEUED


def test_the_queue_offers_a_content_editor_for_write_file_and_json_for_others(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    write = ask(agent, {"path": "notes.txt", "content": "<b>hi</b>"})
    page = reviewer_client.get(f"/approvals/{write.pk}/").content.decode()
    assert 'name="content"' in page and "&lt;b&gt;hi&lt;/b&gt;</textarea>" in page
    command = ask(agent, {"argv": ["make", "deploy"]}, name="run_command", call_id="c1")
    page = reviewer_client.get(f"/approvals/{command.pk}/").content.decode()
    assert 'name="arguments"' in page and "&quot;argv&quot;" in page


def test_the_audit_timeline_shows_the_edit_and_the_new_call(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "a"})
    edit(reviewer_client, approval, content="b")
    auditor = Client()
    auditor.force_login(make_user(unique("auditor"), groups=("auditor",)))
    page = auditor.get(f"/audit/sessions/{approval.call.session_id}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-status="edited"' in text and "tool_use_id w1#edit1" in text
    assert "Edited by" in text and "replaced by w1#edit1" in text  # the review, with why


def test_a_call_sent_with_a_token_rotated_since_cannot_be_edited_into_one_that_runs(
    reviewer_client: Client, reviewer: User, agent: AgentFixture
) -> None:
    """(voidq's report: an edit's replacement was admitted under the agent's token as it is
    now, so a call the old token sent, perhaps by whoever it leaked to, ran once edited after
    the rotation that stops the old token's queued calls.)"""
    from dispatcher import agents

    approval = ask(agent, {"path": "notes.txt", "content": "one"})
    agents.rotate_token(agent=agent.agent, actor="user:admin")
    response = edit(reviewer_client, approval, content="two")
    assert response.status_code == 409, response.content
    assert "was rotated" in response.content.decode()
    assert "cannot be edited either" in response.content.decode()
    assert "GuardDenial" not in response.content.decode()  # (the reason, not its repr)
    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.PENDING_APPROVAL
    assert not ToolCall.objects.filter(edited_from=original).exists()
    assert not (Path(original.session.workspace) / "notes.txt").exists()
