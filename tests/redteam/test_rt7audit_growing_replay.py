"""Red team (rt7audit) of the streamed replay (audit.streaming, audit.replay.page_sections):
a session still running while its long replay is read.

The page counts the session's steps first ("Step 1 of N", the scrubber's range), then reads
its sections from the database as its client reads them: the steps, the pending
approvals, the calls' states. Each section read every event there was when it was reached,
so events recorded meanwhile were in the page beyond its count: steps and states the
scrubber never reaches, the steps section and the calls section telling a different session
(one read before a call's events were appended, the other after). The page is the session
as it was when it was counted, whatever is appended while it is read."""

from __future__ import annotations

import re
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.http import StreamingHttpResponse
from django.test import Client

from audit.services import record_event
from tests.audit.chains import write_chain
from tests.redteam.test_rt6audit_long_page_slots import streamed
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db
__all__ = ["streamed"]  # the fixture, used by name

STEPS = 400


def _append(session_id: uuid.UUID, first: int, count: int) -> None:
    """`count` more calls received in the session."""
    with transaction.atomic():
        for n in range(first, first + count):
            record_event(
                kind="call.received",
                actor="agent:test",
                subject=f"call:{n}",
                session_id=session_id,
                payload={"call_id": str(n), "tool": "late_tool", "arguments": "{}"},
            )


def test_a_replay_read_while_its_session_grows_shows_the_session_it_counted(
    streamed: None,
) -> None:
    session_id = uuid.uuid4()
    write_chain(STEPS, session_id)
    client = Client()
    client.force_login(make_user(unique("rt7aud"), groups=("auditor",)))
    response = client.get(f"/audit/sessions/{session_id}/replay/")
    assert isinstance(response, StreamingHttpResponse), "the page must be streamed"

    async def read() -> bytes:
        pieces = aiter(response.streaming_content)
        first = await anext(pieces)
        # The agent goes on while the auditor reads: 100 more calls are recorded.
        await sync_to_async(_append)(session_id, STEPS, 100)
        return first + b"".join([piece async for piece in pieces])

    page = async_to_sync(read)().decode()
    assert f"Step 1 of {STEPS}" in page
    steps = re.findall(r'<div data-first="(\d+)"', page)
    assert len(steps) == STEPS, f"{len(steps)} steps shown on a page of {STEPS}"
    firsts = [int(n) for n in re.findall(r'data-first="(\d+)"', page)]
    assert max(firsts) < STEPS, f"a step or state at {max(firsts)} on a page of {STEPS} steps"
    assert "late_tool" not in page, "a call recorded after the page was counted is shown"
