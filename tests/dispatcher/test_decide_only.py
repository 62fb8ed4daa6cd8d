"""Decide-only calls: the client runs the tool; Harness decides, records the report, and
ends a call never reported in an explicit state, never as completed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from dispatcher import execution, transitions
from dispatcher.agents import start_session
from dispatcher.models import Executor, Status, ToolCall
from tests.support.factories import make_agent, make_user, submit_one

pytestmark = pytest.mark.django_db


def _kinds(call: ToolCall) -> list[str]:
    return list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )


def test_an_allowed_client_call_is_released_not_queued_for_a_worker() -> None:
    fx = make_agent(mode="trusted")
    call = submit_one(start_session(agent=fx.agent), "client_note", {"text": "hi"})
    call.refresh_from_db()
    assert (call.status, call.executor) == (Status.RELEASED, Executor.CLIENT)
    assert call.enqueued_at is None  # no Celery message, ever
    assert call.lease_until is not None and call.lease_until > timezone.now()
    assert _kinds(call) == ["call.received", "call.allowed"]


def test_the_clients_report_becomes_the_result_marked_as_reported() -> None:
    fx = make_agent(mode="trusted")
    call = submit_one(start_session(agent=fx.agent), "client_note", {"text": "hi"})
    assert transitions.report_result(
        call_id=call.pk, content="noted", is_error=False, actor="agent:x", source="test:Post"
    )
    call.refresh_from_db()
    assert (call.status, call.content, call.is_error) == (Status.REPORTED, "noted", False)
    event = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.reported")
    assert event.payload["reported_by"] == "test:Post" and event.payload["content"] == "noted"
    # A second report changes nothing.
    assert not transitions.report_result(
        call_id=call.pk, content="other", is_error=True, actor="agent:x", source="test:Post"
    )
    call.refresh_from_db()
    assert call.content == "noted"


def test_an_ask_approved_is_released_to_the_client() -> None:
    fx = make_agent(mode="standard")
    call = submit_one(start_session(agent=fx.agent), "client_note", {"text": "hi"})
    assert call.status == Status.PENDING_APPROVAL
    reviewer = make_user("rev-decide-only", groups=("reviewer",))
    assert transitions.approve_call(call_id=call.pk, actor=f"user:{reviewer.username}")
    call.refresh_from_db()
    assert call.status == Status.RELEASED and call.enqueued_at is None


def test_a_call_never_reported_ends_unreported_after_its_lease() -> None:
    fx = make_agent(mode="trusted")
    call = submit_one(start_session(agent=fx.agent), "client_note", {"text": "hi"})
    with transaction.atomic():
        ToolCall.objects.filter(pk=call.pk).update(lease_until=timezone.now() - timedelta(1))
    assert execution.reconcile()["unreported"] == 1
    call.refresh_from_db()
    assert call.status == Status.UNREPORTED and call.is_terminal
    assert _kinds(call)[-1] == "call.unreported"
    # Too late to report: nothing changes.
    assert not transitions.report_result(
        call_id=call.pk, content="late", is_error=False, actor="agent:x", source="test:Post"
    )
