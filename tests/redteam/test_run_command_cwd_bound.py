"""Red team: the directory a reviewer was shown for run_command's `cwd` is the one it runs
in. The ask showed `cwd: sub` resolved through `sub -> dirA`; another allowed call turned
the link to `dirB` before the worker ran the approved call, which then ran in `dirB`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.approvals.conftest import ask, start_session
from tests.tools.support import require_bwrap

# Previewed (the preview makes a FIFO, which is never applied: the approved command runs
# for real), and not previewed at all.


def _approved_and_run(reviewer: Any, approval: Any) -> Any:
    """`reviewer` approves the ask (and its previewed effect, if any) on the queue, the
    worker runs its call; the call."""
    from dispatcher import execution
    from dispatcher.models import Preview, ToolCall

    client = Client()
    client.force_login(reviewer)
    data = {"action": "approve", "digest": approval.call.digest}
    row = Preview.objects.filter(call=approval.call).first()
    if row is not None:
        data["effect_digest"] = row.effect_digest
    assert client.post(f"/approvals/{approval.pk}/decide", data).status_code in (200, 302)
    execution.execute_call(str(approval.call_id))
    return ToolCall.objects.get(pk=approval.call_id)


@pytest.fixture(autouse=True)
def _bwrap(settings: Any) -> None:
    require_bwrap()
    settings.HARNESS_SANDBOX = "bwrap"


CASES = {
    "previewed": (True, "touch ran-here && mkfifo fifo-here"),
    "not previewed": (False, "touch ran-here"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_link_turned_after_the_ask_does_not_move_the_command(
    agent: Any, reviewer: Any, settings: Any, case: str
) -> None:
    from dispatcher.models import AgentSession, Status, ToolCall

    preview_on, script = CASES[case]
    settings.HARNESS_PREVIEW = preview_on
    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "dirA").mkdir()
    (workspace / "dirB").mkdir()
    os.symlink("dirA", workspace / "sub")
    approval = ask(
        agent,
        {"argv": ["sh", "-c", script], "cwd": "sub"},
        session_id=session_id,
        name="run_command",
    )
    assert approval.presentation["cwd"] == str((workspace / "dirA").resolve())
    # another allowed call (or anything in the workspace) turns the link meanwhile
    os.unlink(workspace / "sub")
    os.symlink("dirB", workspace / "sub")
    call = _approved_and_run(reviewer, approval)
    assert not (workspace / "dirB" / "ran-here").exists(), call.content
    assert not (workspace / "dirA" / "ran-here").exists()
    assert call.status == Status.EDITED, (call.status, call.content)
    assert "working directory 'sub' now names" in call.content
    assert str((workspace / "dirB").resolve()) in call.content
    assert "did not run" in call.content
    # asked again, showing the directory it would run in now
    again = ToolCall.objects.get(edited_from=call.pk)
    assert again.status == Status.PENDING_APPROVAL
    assert again.approval.presentation["cwd"] == str((workspace / "dirB").resolve())


@pytest.mark.django_db
def test_an_unchanged_cwd_runs_as_approved(agent: Any, reviewer: Any, settings: Any) -> None:
    from dispatcher.models import AgentSession, Status

    settings.HARNESS_PREVIEW = False
    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "dirA").mkdir()
    os.symlink("dirA", workspace / "sub")
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "touch ran-here"], "cwd": "sub"},
        session_id=session_id,
        name="run_command",
    )
    call = _approved_and_run(reviewer, approval)
    assert call.status == Status.COMPLETED, (call.status, call.content)
    assert (workspace / "dirA" / "ran-here").exists()


@pytest.mark.django_db
def test_a_directory_replaced_at_the_same_path_does_not_run(
    agent: Any, reviewer: Any, settings: Any
) -> None:
    """Not only the path: `dirA` removed and made again (by a rename) is another directory."""
    from dispatcher.models import AgentSession, Status

    settings.HARNESS_PREVIEW = False
    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "dirA").mkdir()
    (workspace / "other").mkdir()
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "touch ran-here"], "cwd": "dirA"},
        session_id=session_id,
        name="run_command",
    )
    os.rename(workspace / "dirA", workspace / "old")
    os.rename(workspace / "other", workspace / "dirA")
    call = _approved_and_run(reviewer, approval)
    assert call.status == Status.EDITED, (call.status, call.content)
    assert not (workspace / "dirA" / "ran-here").exists()


@pytest.mark.django_db
def test_a_link_turned_while_the_preview_waits_does_not_apply_another_directorys_effect(
    agent: Any, reviewer: Any, settings: Any
) -> None:
    """The preview resolved `cwd` before it waited for the workspace's lock (another call
    running), the ask's presentation after: `sub -> dirA` turned to `dirB` meanwhile, the
    reviewer was shown `dirB`, and the effect approved and applied was the one made in
    `dirA`. The preview now runs where the ask shows, or the call asks without one."""
    import threading
    import time

    from dispatcher.models import AgentSession
    from dispatcher.tools import workspace_lock

    settings.HARNESS_PREVIEW = True
    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "dirA").mkdir()
    (workspace / "dirB").mkdir()
    os.symlink("dirA", workspace / "sub")
    held = threading.Event()

    def another_call() -> None:  # a call of the session, running in the worker
        with workspace_lock.held(workspace):
            held.set()
            time.sleep(1.2)  # (the admission below has resolved its cwd and waits)
            os.unlink(workspace / "sub")
            os.symlink("dirB", workspace / "sub")

    thread = threading.Thread(target=another_call)
    thread.start()
    assert held.wait(10)
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "touch ran-here"], "cwd": "sub"},
        session_id=session_id,
        name="run_command",
    )
    thread.join()
    shown = approval.presentation["cwd"]
    call = _approved_and_run(reviewer, approval)
    ran = [d for d in ("dirA", "dirB") if (workspace / d / "ran-here").exists()]
    # what the reviewer approved ran (or was applied) in the directory they were shown
    assert ran == [Path(shown).name], (shown, ran, call.status, call.content)


@pytest.mark.django_db
def test_an_edit_after_the_link_turned_is_not_the_editors_approval(
    agent: Any, reviewer: Any, settings: Any
) -> None:
    """A reviewer's edit of an ask is their approval of the new call, whose presentation
    is made at the edit: `sub -> dirA` turned to `dirB` after the ask, the editor (shown
    `dirA`) changed only the argv, and their edit had the command run in `dirB`."""
    import json

    from dispatcher import execution
    from dispatcher.models import AgentSession, Status, ToolCall

    settings.HARNESS_PREVIEW = False
    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "dirA").mkdir()
    (workspace / "dirB").mkdir()
    os.symlink("dirA", workspace / "sub")
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "touch ran-here"], "cwd": "sub"},
        session_id=session_id,
        name="run_command",
    )
    assert approval.presentation["cwd"] == str((workspace / "dirA").resolve())
    os.unlink(workspace / "sub")
    os.symlink("dirB", workspace / "sub")
    client = Client()
    client.force_login(reviewer)
    edited = {"argv": ["sh", "-c", "touch edited-here"], "cwd": "sub"}
    data = {"digest": approval.call.digest, "arguments": json.dumps(edited)}
    response = client.post(f"/approvals/{approval.pk}/edit", data)
    assert response.status_code in (200, 302), response.content
    new = ToolCall.objects.get(edited_from=approval.call_id)
    if new.status == Status.QUEUED:
        execution.execute_call(str(new.pk))
        new.refresh_from_db()
    assert not (workspace / "dirB" / "edited-here").exists(), (new.status, new.content)
    # it asks the editor again, showing where it would run now
    assert new.status == Status.PENDING_APPROVAL, (new.status, new.content)
    assert new.approval.presentation["cwd"] == str((workspace / "dirB").resolve())
