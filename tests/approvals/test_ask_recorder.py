"""The ask's request row is written by a named hook (HARNESS_ASK_RECORDER), inside the
transaction that puts the call in pending_approval: an ask is never stored without it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher.models import ToolCall
from tests.approvals.conftest import ask, start_session
from tests.support.factories import make_agent

pytestmark = pytest.mark.django_db


class RecorderDown(Exception):
    pass


def failing_recorder(**kwargs: Any) -> None:
    raise RecorderDown("the approvals store is down")


def test_every_ask_has_its_request_row_written_with_it() -> None:
    approval = ask(make_agent(mode="standard"), {"path": "a.txt", "content": "x"})
    assert approval.call.status == "pending_approval"
    assert approval.digest == approval.call.digest


def test_an_ask_whose_request_cannot_be_recorded_is_not_stored(settings: Any) -> None:
    fx = make_agent(mode="standard")
    session_id = start_session(fx)
    settings.HARNESS_ASK_RECORDER = "tests.approvals.test_ask_recorder.failing_recorder"
    body = {
        "calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "a", "content": "x"}}]
    }
    client = Client(raise_request_exception=False)
    response = client.post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code >= 500
    assert not ToolCall.objects.filter(session_id=session_id).exists()
    assert not ApprovalRequest.objects.filter(call__session_id=session_id).exists()
