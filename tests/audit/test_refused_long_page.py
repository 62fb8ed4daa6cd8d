"""A long replay or transcript that no export slot is free for is refused before any query
for its page (audit.views._refused_early): before, the view rendered the page's first MiB
(its queries and templates) and only then, asking for the slot to stream the rest, answered
503, the work done for nothing. A page that may be short is still answered whole."""

from __future__ import annotations

import gc

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from audit import export, replay, streaming, timeline
from tests.audit.chains import bulk_chain
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

URLS = ("replay/", "transcript/", "transcript/?format=openai", "transcript/?format=anthropic")


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page past 32 KiB streamed (a session of a thousand events, not millions)."""
    monkeypatch.setattr(streaming, "BUFFERED_BYTES", 32 * 1024)
    monkeypatch.setattr(replay, "STEPS_READ", 20)
    monkeypatch.setattr(timeline, "CALLS_READ", 20)
    monkeypatch.setattr(export, "SLOTS", export.Slots())


@pytest.mark.parametrize("url", URLS)
@override_settings(
    HARNESS_MAX_EXPORTS=4, HARNESS_MAX_EXPORTS_PER_PERSON=1, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_a_long_page_refused_a_slot_reads_none_of_it(streamed: None, url: str) -> None:
    long, short = bulk_chain(1000), bulk_chain(3)
    client = Client()
    client.force_login(make_user(unique("refused"), groups=("auditor",)))
    first = client.get(f"/audit/sessions/{long}/{url}")
    assert first.status_code == 200 and first.streaming  # the person's one slot
    with CaptureQueriesContext(connection) as queries:
        refused = client.get(f"/audit/sessions/{long}/{url}")
    assert refused.status_code == 503, refused.status_code
    assert b"HARNESS_MAX_EXPORTS_PER_PERSON" in refused.content
    assert refused["Retry-After"] == "60"
    # What it asked of the database: the person, the session's reach and its events' count;
    # not one row of the page (before: the session's start, then its steps or calls, the
    # payloads of hundreds of events, for the page's first 32 KiB).
    read = [q["sql"] for q in queries.captured_queries if '"payload"' in q["sql"]]
    assert read == [], read
    assert len(queries.captured_queries) < 10, [q["sql"] for q in queries.captured_queries]
    # A short page is answered whole while the slot is held: it needs none.
    whole = client.get(f"/audit/sessions/{short}/{url}")
    assert whole.status_code == 200 and not whole.streaming
    del first
    gc.collect()
