"""Red-team attacks on previews through real requests: the agent's API, the reviewer's
page and decision, and the worker's own code path (tests/tools/test_preview_attacks.py
has the same attacks at the tool's level, and the rest)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import (
    _approve,
    _workspace,
    previews_on,
    reviewer_client,
)
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, shared


def _forged_upper_layer() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mode in (
            (".", tarfile.DIRTYPE, 0o777),
            ("./src", tarfile.CHRTYPE, 0),
            ("./src", tarfile.DIRTYPE, 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode = kind, mode
            tar.addfile(info)
    return buffer.getvalue()


def test_a_forged_upper_layer_is_neither_shown_nor_applied(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    """The program wrote a tar of its own into the namespace's descriptor 5: the page said
    "change no files", and approving deleted src/ and made the workspace world-writable."""
    session_id = start_session(agent)
    workspace = _workspace(agent)
    (workspace / "src").mkdir()
    (workspace / "src" / "keep.py").write_text("keep\n")
    (workspace / "forged.tar").write_bytes(_forged_upper_layer())
    os.chmod(workspace, 0o700)
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "cat forged.tar >&5; echo done"]},
        session_id=session_id,
        name="run_command",
        call_id="forge",
    )
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "This command would: change no files" in page
    assert "Bad file descriptor" in page  # the program's own error, shown
    response = _approve(reviewer_client, approval, approval.effect_digest)
    assert response.status_code in (200, 302), response.content
    execution.execute_call(str(approval.call_id))
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED
    assert Preview.objects.get(call=call).outcome == "applied"
    assert (workspace / "src" / "keep.py").read_text() == "keep\n"
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700


def test_a_name_that_is_not_utf8_asks_without_a_preview(
    previews_on: None, agent: AgentFixture, reviewer_client: Client, settings: Any
) -> None:
    """Admission failed on the effect's digest (a surrogate in the JSON); the call now
    asks without a preview and the page says why."""
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "printf x > \"$(printf 'bad\\377name')\""]},
        name="run_command",
        call_id="bytes",
    )
    assert approval.presentation["preview"]["digest"] == ""
    assert "not UTF-8" in approval.presentation["preview"]["note"]
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "not UTF-8" in page and "Approving runs the command for real" in page


def test_a_world_writable_workspace_is_shown_by_name(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    """`chmod 0777 .` changed the mode of the path "", which the page showed as an empty
    name before "mode 0700 → 0777"."""
    session_id = start_session(agent)
    os.chmod(_workspace(agent), 0o700)
    approval = ask(
        agent,
        {"argv": ["chmod", "0777", "."]},
        session_id=session_id,
        name="run_command",
        call_id="open",
    )
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "<code>(the workspace itself)</code>" in page
    assert "mode 0700 → 0777" in page


def test_invisible_characters_in_names_and_contents_are_shown(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    """A right-to-left override in a created name and a zero-width space in a diff line:
    the page shows both as escapes, never as what they pretend to be."""
    approval = ask(
        agent,
        {"argv": ["sh", "-c", "printf 'ok\\342\\200\\213\\n' > 'notes\u202etxt.sh'"]},
        name="run_command",
        call_id="hidden",
    )
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "notes\\u202etxt.sh" in page and "\u202e" not in page
    assert "+ok\\u200b" in page and "\u200b" not in page
