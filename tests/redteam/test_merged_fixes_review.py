"""Red team (rte): review of the merged fixes 729cd55..86bfdca. Each test is a hole the
reviewer found in a fix, reproduced with real requests and the real worker path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.mark.django_db
def test_an_edited_write_binds_to_the_file_the_editor_saw(agent: Any, reviewer: Any) -> None:
    """The reviewer sees a diff against notes.txt ("alpha/beta"), and edits the content.
    Before the edit, the file gained a line. The edit counts as the editor's approval and
    the replacement's presentation (and so its bound hash) was made at the edit, against
    the file the editor never saw: the worker wrote, dropping the line. The approved diff
    binds (7020d0c) only what a reviewer was shown; an edit approves what it was shown."""
    from django.test import Client

    from dispatcher import execution
    from dispatcher.models import AgentSession, Status, ToolCall
    from tests.approvals.conftest import ask, start_session
    from tests.approvals.test_edit import edit

    session_id = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    approval = ask(agent, {"path": "notes.txt", "content": "alpha\nBETA\n"}, session_id=session_id)
    assert "-beta" in approval.presentation["diff"]
    (workspace / "notes.txt").write_text("alpha\nbeta\nkeep: the editor never saw me go\n")
    client = Client()
    client.force_login(reviewer)
    response = edit(client, approval, content="alpha\nBeta\n")
    assert response.status_code == 200, response.content
    new = ToolCall.objects.get(edited_from=approval.call_id)
    if new.status == Status.QUEUED:
        execution.execute_call(str(new.pk))
    # What the editor approved ("beta" -> "Beta" against the file they saw), or nothing.
    assert "keep: the editor never saw me go" in (workspace / "notes.txt").read_text()
    assert new.status == Status.PENDING_APPROVAL  # asked again, with the diff as it is now
    assert "-keep: the editor never saw me go" in new.approval.presentation["diff"]
