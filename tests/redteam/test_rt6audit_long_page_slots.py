"""A long session's replay or transcript that is streamed holds one of the export slots
(audit.export.SLOTS) for as long as its client reads it, as an export does (red team of
94cfc3fb).

A streamed page reads the session from the database as its client reads (a cursor, then
a query a piece), holding its request's connection all the while; 94cfc3fb streamed the
pages past 1 MiB with no slot, so one auditor's slow readers of a long replay held as many
connections as they opened (the process's few: HARNESS_DB_POOL_MAX) and every other page
of the process waited for one, beside a cap that bounds the exports alone. A page
answered whole (up to streaming.BUFFERED_BYTES) takes none."""

from __future__ import annotations

import gc

import pytest
from django.test import Client, override_settings

from audit import export, replay, streaming, timeline
from tests.audit.chains import bulk_chain
from tests.audit.test_long_pages import _body
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

URLS = ("replay/", "transcript/", "transcript/?format=openai", "transcript/?format=anthropic")


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page past 32 KiB streamed (a session of a thousand events, not millions), read
    20 events at a time, the export's slots this test's own."""
    monkeypatch.setattr(streaming, "BUFFERED_BYTES", 32 * 1024)
    monkeypatch.setattr(replay, "STEPS_READ", 20)
    monkeypatch.setattr(timeline, "CALLS_READ", 20)
    monkeypatch.setattr(export, "SLOTS", export.Slots())


def _auditor() -> Client:
    client = Client()
    client.force_login(make_user(unique("rt6aud"), groups=("auditor",)))
    return client


@pytest.mark.parametrize("url", URLS)
@override_settings(
    HARNESS_MAX_EXPORTS=2, HARNESS_MAX_EXPORTS_PER_PERSON=1, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_a_streamed_long_page_holds_an_export_slot_while_it_is_read(
    streamed: None, url: str
) -> None:
    long, short = bulk_chain(1000), bulk_chain(1)
    one, other, third = _auditor(), _auditor(), _auditor()
    first = one.get(f"/audit/sessions/{long}/{url}")
    assert first.status_code == 200 and first.streaming
    assert export.SLOTS.running == 1  # (before: 0, the page held its connection all the same)
    # The same person's second long page is refused while the first is read, saying why.
    refused = one.get(f"/audit/sessions/{long}/{url}")
    assert refused.status_code == 503, refused.status_code
    assert b"HARNESS_MAX_EXPORTS_PER_PERSON" in refused.content
    assert refused["Retry-After"] == "60"
    # Another person takes the second slot; a third is refused by the process's cap.
    second = other.get(f"/audit/sessions/{long}/{url}")
    assert second.status_code == 200 and second.streaming
    capped = third.get(f"/audit/sessions/{long}/{url}")
    assert capped.status_code == 503 and b"(HARNESS_MAX_EXPORTS)" in capped.content
    # A short page is answered whole, and takes no slot.
    whole = third.get(f"/audit/sessions/{short}/{url}")
    assert whole.status_code == 200 and not whole.streaming
    # A page read to its end, or dropped unread, gives its slot back (once the response
    # is gone: the test client never closes a streamed one, which a server does).
    body = _body(first)
    assert body.rstrip().endswith((b"</html>", b"]")), body[-100:]
    del first, second
    gc.collect()
    assert export.SLOTS.running == 0
    again = third.get(f"/audit/sessions/{long}/{url}")
    assert again.status_code == 200 and again.streaming
