"""A run_command that asks is previewed; the approval binds to the command's digest and
the effect's; on approval the previewed effect is applied (byte for byte, modes
included) and the result is the previewed output, or, when the workspace changed, nothing
is applied and a new preview asks again. Real sandbox, real database, the worker's own
code path."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from approvals.notifications import messages as notification_messages
from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from tests.approvals.conftest import ask
from tests.support.factories import AgentFixture
from tests.tools.support import require_bwrap

pytestmark = pytest.mark.django_db

SCRIPT = (
    "sed -i s/beta/BETA/ notes.txt && sed -i s/one/ONE/ other.txt && rm old.txt && "
    "mkdir -p build && printf 'made\\n' > build/new.txt && chmod 0750 run.sh && echo built"
)


@pytest.fixture
def previews_on(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = 5


@pytest.fixture
def reviewer_client(reviewer: User) -> Client:
    client = Client()
    client.force_login(reviewer)
    return client


def _workspace(agent: AgentFixture) -> Path:
    from dispatcher.models import AgentSession

    session = AgentSession.objects.filter(agent=agent.agent).latest("created_at")
    return Path(session.workspace)


def _seed(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    (workspace / "other.txt").write_text("one\ntwo\n")
    (workspace / "old.txt").write_text("bye\n")
    (workspace / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(workspace / "run.sh", 0o644)


def _ask_script(agent: AgentFixture, call_id: str = "c1") -> ApprovalRequest:
    from tests.approvals.conftest import start_session

    session_id = start_session(agent)
    _seed(_workspace(agent))
    return ask(
        agent,
        {"argv": ["sh", "-c", SCRIPT]},
        session_id=session_id,
        name="run_command",
        call_id=call_id,
    )


def _approve(client: Client, approval: ApprovalRequest, effect_digest: str) -> Any:
    data = {"action": "approve", "digest": approval.call.digest, "effect_digest": effect_digest}
    return client.post(f"/approvals/{approval.pk}/decide", data)


def test_the_ask_carries_the_effect_and_the_page_shows_it(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    preview = Preview.objects.get(call=approval.call)
    assert preview.appliable and preview.effect_digest == approval.effect_digest
    summary = "This command would: change 2 files, create 1, delete 1, change the mode of 1"
    assert approval.presentation["preview"]["summary"] == summary
    assert summary in notification_messages.summary(approval)
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert summary in page
    assert page.index(summary) < page.index("<h3>Command</h3>")  # above the command
    assert "BETA" in page and "0644 → 0750" in page and "built" in page
    # Nothing happened yet to the real workspace.
    assert (_workspace(agent) / "notes.txt").read_text() == "alpha\nbeta\n"
    requested = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="call.approval_requested"
    )
    assert requested.payload["presentation"]["preview"]["digest"] == preview.effect_digest


def test_approval_with_another_effect_digest_is_refused(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    response = _approve(reviewer_client, approval, "0" * 64)
    assert response.status_code == 409
    assert "effect digest mismatch" in response.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL
    mismatch = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.digest_mismatch"
    )
    assert mismatch.payload["effect_digest_seen"] == "0" * 64


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    found = {}
    for top, directories, files in os.walk(root):
        for name in [*directories, *files]:
            path = Path(top, name)
            info = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
            found[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), data)
    return found


def test_approval_applies_exactly_the_previewed_effect(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    workspace = _workspace(agent)
    response = _approve(reviewer_client, approval, approval.effect_digest)
    assert response.status_code in (200, 302), response.content
    execution.execute_call(str(approval.call_id))

    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED and not call.is_error
    assert call.content.startswith("exit code 0\nbuilt")
    tree = _tree(workspace)
    assert tree["notes.txt"] == (0o644, b"alpha\nBETA\n")
    assert tree["other.txt"] == (0o644, b"ONE\ntwo\n")
    assert tree["build/new.txt"] == (0o644, b"made\n")
    assert tree["run.sh"] == (0o750, b"#!/bin/sh\necho hi\n")
    assert "old.txt" not in tree
    preview = Preview.objects.get(call=call)
    assert preview.outcome == "applied" and not preview.kept
    assert not Path(preview.effect["store"]).exists()  # the upper layer is gone
    completed = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.completed")
    assert completed.payload["effect"] == {
        "outcome": "applied",
        "command_digest": call.digest,
        "effect_digest": preview.effect_digest,
    }


def test_a_file_changed_before_the_apply_asks_again(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    workspace = _workspace(agent)
    assert _approve(reviewer_client, approval, approval.effect_digest).status_code in (200, 302)
    (workspace / "notes.txt").write_text("alpha\nbeta\nchanged on disk\n")
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED
    assert "the workspace changed since the preview" in original.content
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\nchanged on disk\n"
    assert (workspace / "old.txt").exists()  # nothing applied, nothing run
    again = ToolCall.objects.get(edited_from=original)
    assert again.tool_use_id == "c1#preview1" and again.status == Status.PENDING_APPROVAL
    new_approval = ApprovalRequest.objects.get(call=again)
    assert new_approval.effect_digest and new_approval.effect_digest != approval.effect_digest
    diff = next(c["diff"] for c in again.preview.effect["changes"] if c["path"] == "notes.txt")
    assert "changed on disk" in diff
    event = AuditEvent.objects.get(subject=f"call:{original.pk}", kind="call.repreviewed")
    assert event.payload["effect_digest"] == approval.effect_digest
    # The old approval does not carry over: approving the new ask needs its own effect.
    assert _approve(reviewer_client, new_approval, approval.effect_digest).status_code == 409


def test_a_preview_that_needed_the_network_runs_for_real(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    from tests.approvals.conftest import start_session

    session_id = start_session(agent)
    code = (
        "import socket\ntry:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        "except OSError:\n print('offline')\nopen('ran.txt', 'w').write('x')\n"
    )
    approval = ask(
        agent, {"argv": ["python3", "-c", code]}, session_id=session_id, name="run_command"
    )
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "approving runs the command for real" in page
    assert "it tried to reach the network" in page
    assert _approve(reviewer_client, approval, approval.effect_digest).status_code in (200, 302)
    execution.execute_call(str(approval.call_id))
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED and "offline" in call.content
    assert (_workspace(agent) / "ran.txt").read_text() == "x"
    completed = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.completed")
    assert completed.payload["effect"]["outcome"] == "ran"
    assert completed.payload["effect"]["effect_digest"] == approval.effect_digest


def test_another_call_of_the_session_changing_a_file_asks_again(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    session_id = str(approval.call.session_id)
    assert _approve(reviewer_client, approval, approval.effect_digest).status_code in (200, 302)
    writer = ask(
        agent,
        {"path": "other.txt", "content": "rewritten by another call\n"},
        session_id=session_id,
        call_id="w2",
    )
    data = {"action": "approve", "digest": writer.call.digest}
    assert reviewer_client.post(f"/approvals/{writer.pk}/decide", data).status_code in (200, 302)
    execution.execute_call(str(writer.call_id))
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED
    again = ToolCall.objects.get(edited_from=original)
    assert again.status == Status.PENDING_APPROVAL
    workspace = _workspace(agent)
    assert (workspace / "other.txt").read_text() == "rewritten by another call\n"
    assert (workspace / "notes.txt").read_text() == "alpha\nbeta\n"
    # The agent's answer for its call follows the chain to the new ask.
    response = Client().get(f"/api/v1/calls/{original.pk}", headers=agent.headers)
    answer = response.json()
    assert answer["status"] == "pending_approval"
    assert answer["edited"]["tool_use_id"] == "c1#preview1"
    assert answer["edited"]["by"] == "harness:preview"


def test_the_reconciler_removes_the_upper_layers_of_ended_calls_and_orphans(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    store = Path(Preview.objects.get(call=approval.call).effect["store"])
    orphan = store.parent / ("0" * 32)
    orphan.mkdir()
    os.utime(orphan, (1, 1))  # long ago
    kept = store.parent / ("1" * 32)
    kept.mkdir()  # young: perhaps a preview still being made
    execution.reconcile()
    assert store.exists() and not orphan.exists() and kept.exists()  # the ask still waits
    data = {"action": "deny", "digest": approval.call.digest}
    assert reviewer_client.post(f"/approvals/{approval.pk}/decide", data).status_code in (200, 302)
    assert execution.reconcile()["previews_removed"] >= 1
    assert not store.exists()
    assert not Preview.objects.get(call=approval.call).kept
    kept.rmdir()


def test_a_busy_workspace_asks_without_a_preview_and_says_so(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    from dispatcher.tools import workspace_lock
    from tests.approvals.conftest import start_session

    session_id = start_session(agent)
    workspace = _workspace(agent)
    with workspace_lock.held(workspace):  # another call runs there
        approval = ask(agent, {"argv": ["touch", "x"]}, session_id=session_id, name="run_command")
    assert approval.effect_digest == ""
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "No preview: another call was running in the workspace." in page
    assert "Approving runs the command for real." in page
    assert _approve(reviewer_client, approval, "").status_code in (200, 302)
    execution.execute_call(str(approval.call_id))
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.COMPLETED
    assert (workspace / "x").exists()


def test_a_preview_that_hit_its_time_limit_says_it_will_run_for_real(
    previews_on: None, settings: Any, agent: AgentFixture, reviewer_client: Client
) -> None:
    from tests.approvals.conftest import start_session

    settings.HARNESS_PREVIEW_TIMEOUT = 1
    session_id = start_session(agent)
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "echo working; while :; do :; done"]},
        session_id=session_id,
        name="run_command",
    )
    assert not Preview.objects.get(call=approval.call).appliable
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "This preview cannot be applied (the preview hit its time limit)" in page
    assert "approving runs the command for real" in page
    assert "killed at the preview&#x27;s time limit (1 s)" in page
    assert "stopped at the preview's time limit" in page
