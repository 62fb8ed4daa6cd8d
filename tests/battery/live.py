"""Helpers for rows that run against the processes they start."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import httpx

from audit.models import AuditEvent
from dispatcher import transitions
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall


def start_session(client: httpx.Client, title: str = "battery") -> dict[str, Any]:
    response = client.post("/api/v1/sessions", json={"title": title})
    assert response.status_code == 201, response.text
    return dict(response.json())


def native(tool_use_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"calls": [{"id": tool_use_id, "name": name, "arguments": arguments}]}


def unfinished(ids: Iterable[str]) -> list[ToolCall]:
    return list(ToolCall.objects.filter(pk__in=list(ids)).exclude(status__in=TERMINAL_STATUSES))


def wait_terminal(ids: list[str], seconds: float) -> list[ToolCall]:
    """Wait until every call is terminal; return those still not terminal after `seconds`."""
    deadline = time.monotonic() + seconds
    left = unfinished(ids)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = unfinished(ids)
    return left


def started_counts(ids: Iterable[str]) -> Counter[str]:
    subjects = [f"call:{i}" for i in ids]
    rows = AuditEvent.objects.filter(subject__in=subjects, kind="call.started")
    return Counter(s.removeprefix("call:") for s in rows.values_list("subject", flat=True))


def status_counts(ids: Iterable[str]) -> dict[str, int]:
    return dict(Counter(ToolCall.objects.filter(pk__in=list(ids)).values_list("status", flat=True)))


def clear_queue() -> int:
    """Cancel every call still pending from earlier tests: the queue shows only this row's."""
    cancelled = 0
    for call_id in ToolCall.objects.filter(status=Status.PENDING_APPROVAL).values_list(
        "pk", flat=True
    ):
        cancelled += transitions.cancel_call(
            call_id=call_id, actor="battery", reason="battery reset"
        )
    return cancelled
