"""Red team (rt7audit) of the streamed transcript download (?format=openai|anthropic) when
no export slot is free.

The view set the download's Content-Disposition (attachment, "transcript-<id>-<fmt>.json")
on whatever `streaming.respond` answered, the 503 that says which share refuses the slot
included: a browser saved the refusal as the transcript's JSON file, and the auditor saw no
message, only a file that is not JSON. The refusal is a page of its own, as an export's is."""

from __future__ import annotations

import gc

import pytest
from django.test import Client, override_settings

from tests.audit.chains import bulk_chain
from tests.redteam.test_rt6audit_long_page_slots import streamed
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db
__all__ = ["streamed"]  # the fixture, used by name


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@override_settings(
    HARNESS_MAX_EXPORTS=4, HARNESS_MAX_EXPORTS_PER_PERSON=1, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_a_refused_transcript_download_is_a_message_not_a_saved_file(
    streamed: None, fmt: str
) -> None:
    long = bulk_chain(1000)
    client = Client()
    client.force_login(make_user(unique("rt7aud"), groups=("auditor",)))
    url = f"/audit/sessions/{long}/transcript/?format={fmt}"
    first = client.get(url)
    assert first.status_code == 200 and first.streaming
    assert first["Content-Disposition"].startswith("attachment;")
    refused = client.get(url)
    assert refused.status_code == 503
    assert b"HARNESS_MAX_EXPORTS_PER_PERSON" in refused.content
    assert refused["Content-Type"].startswith("text/plain")
    assert "Content-Disposition" not in refused, refused["Content-Disposition"]
    del first
    gc.collect()
