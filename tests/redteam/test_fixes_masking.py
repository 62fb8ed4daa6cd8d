"""Harness's own tokens split by a JSON escape (`hro\\u005f...`, `\\u0068rr_...`, an
escaped character of the body, `hrn\\u005f...`) were stored and shown in clear: the
masking rules looked for the plain prefix and body. A JSON file an agent writes holds
its text escaped (`write_file` of a config.json: JSON text inside the call's arguments),
so the escape reached the audit copy as it was sent."""

from __future__ import annotations

import json
import secrets

import pytest
from django.test import Client

from audit.models import AuditEvent
from tests.redteam.test_audit_log_attacks import _api, _streamed
from tests.support.factories import AgentFixture, make_user, unique


def _body() -> str:
    return secrets.token_hex(24)  # 48 characters, none of them `_` or `-`


@pytest.mark.django_db
def test_an_escaped_harness_token_in_a_written_json_file_is_masked_in_the_audit(
    client: Client, agent: AgentFixture
) -> None:
    bodies = [_body() for _ in range(4)]
    escaped = [
        "hro\\u005f" + bodies[0],  # the prefix's `_` escaped
        "\\u0068rr_" + bodies[1],  # its first letter escaped
        "hro_" + bodies[2][:20] + "\\u00" + f"{ord(bodies[2][20]):02x}" + bodies[2][21:],
        "hrn\\u005f0a1b2c3d_" + bodies[3],  # an agent's bearer token
    ]
    # the file's text, as an agent writes it: JSON with the tokens escaped
    content = "{" + ", ".join(f'"t{i}": "{t}"' for i, t in enumerate(escaped)) + "}"
    assert json.loads(content)["t0"] == "hro_" + bodies[0]  # what the file says
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    calls = {
        "calls": [
            {"id": "w1", "name": "write_file", "arguments": {"path": "c.json", "content": content}}
        ]
    }
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)

    received = AuditEvent.objects.get(session_id=sid, kind="call.received")
    stored = json.dumps(received.payload)
    auditor = unique("aud")
    make_user(auditor, groups=("auditor",))
    browser = Client()
    browser.login(username=auditor, password="pw-" + auditor)
    page = browser.get(f"/audit/sessions/{sid}/")
    assert page.status_code == 200
    export = _streamed(browser.get(f"/audit/sessions/{sid}/export.jsonl"))
    for text in (stored, page.content.decode(), export):
        for body in bodies:
            assert body[:12] not in text and body[-12:] not in text, (body, text[:3000])
    assert stored.count("[masked:harness-oauth-token#") == 3, stored
    assert stored.count("[masked:harness-token#") == 1, stored


@pytest.mark.backend_independent
def test_an_escaped_token_gets_the_marker_of_the_plain_one() -> None:
    from audit.masking import mask_text

    token = "hro_" + _body()
    plain = mask_text(json.dumps({"t": token}))
    for escaped in (token.replace("_", "\\u005f"), token.replace("_", "\\\\u005F")):
        masked = mask_text('{"t": "' + escaped + '"}')
        assert token[4:] not in masked
        assert plain.split("[masked:")[1] == masked.split("[masked:")[1]
