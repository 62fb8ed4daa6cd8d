"""Auditor screens: access, list filters, timeline, replay data, transcript, exports."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from audit.models import AuditChain
from audit.verify import verify_events
from tests.support.factories import AgentFixture, make_user

pytestmark = pytest.mark.django_db

SECRET = "hunter2-very-secret"
CONTENT = f"echo <script>x</script> --password={SECRET}"


def api(client: Client, url: str, body: Any, fx: AgentFixture) -> Any:
    return client.post(
        url, data=json.dumps(body), content_type="application/json", headers=fx.headers
    )


@pytest.fixture
def session(client: Client, agent: AgentFixture, tmp_path: Any) -> str:
    sid = api(client, "/api/v1/sessions", {"title": "audited <b>run</b>"}, agent).json()["id"]
    calls = {
        "calls": [
            {"id": "t1", "name": "read_file", "arguments": {"path": "missing.txt"}},
            {"id": "t2", "name": "nope_tool", "arguments": {}},
            {"id": "t3", "name": "write_file", "arguments": {"path": "a.sh", "content": CONTENT}},
        ]
    }
    assert api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    return str(sid)


@pytest.fixture
def auditor(client: Client) -> Client:
    make_user("aud", groups=("auditor",))
    client.login(username="aud", password="pw-aud")
    return client


def test_only_auditors_get_in(client: Client, session: str, agent: AgentFixture) -> None:
    urls = [
        "/audit/sessions/",
        f"/audit/sessions/{session}/",
        f"/audit/sessions/{session}/replay/",
        f"/audit/sessions/{session}/transcript/",
        f"/audit/sessions/{session}/export.jsonl",
        "/audit/export/?format=csv",
    ]
    for url in urls:
        anonymous = client.get(url, headers=agent.headers)  # an agent token is not a login
        assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"], url
    make_user("rev", groups=("reviewer",))
    client.login(username="rev", password="pw-rev")
    for url in urls:
        assert client.get(url).status_code == 403, url


def test_session_list_shows_summary_and_filters(
    auditor: Client, session: str, agent: AgentFixture
) -> None:
    page = auditor.get("/audit/sessions/").content.decode()
    assert agent.agent.name in page and agent.owner.username in page
    assert "audited &lt;b&gt;run&lt;/b&gt;" in page
    summary = AuditChain.objects.get(chain=session)
    assert (summary.calls, summary.rejected, summary.asked) == (3, 1, 1)  # t2 unknown, t3 asks
    for query, present in [
        (f"agent={agent.agent.name}", True),
        ("agent=someone-else", False),
        (f"user={agent.owner.username}", True),
        ("tool=write_file", True),
        ("tool=run_command", False),
        ("status=rejected", True),
        ("status=timed_out", False),
        ("decision=ask", True),
        ("decision=deny", False),
        ("since=2000-01-01", True),
        ("until=2000-01-01", False),
    ]:
        body = auditor.get(f"/audit/sessions/?{query}").content.decode()
        assert (f"/audit/sessions/{session}/" in body) is present, query


def test_timeline_shows_each_call_with_provenance_and_result(auditor: Client, session: str) -> None:
    page = auditor.get(f"/audit/sessions/{session}/").content.decode()
    assert "missing.txt" in page and "nope_tool" in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x</script>" not in page
    assert SECRET not in page
    assert "mode:standard" in page  # who decided
    assert "What the reviewer saw" in page  # run_command asked
    assert "does not exist" in page  # what the model got back for the unknown tool
    assert "3 calls in this session" in page and "Older calls" not in page  # one page


def test_replay_renders_the_states_escaped(auditor: Client, session: str) -> None:
    page = auditor.get(f"/audit/sessions/{session}/replay/").content.decode()
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x" not in page
    assert SECRET not in page
    assert "write_file is waiting for a reviewer, who sees:" in page
    assert "/static/audit.js" in page and 'nonce="' in page


def test_transcript_exports_openai_and_anthropic_messages(auditor: Client, session: str) -> None:
    openai = json.loads(auditor.get(f"/audit/sessions/{session}/transcript/?format=openai").content)
    assert openai[0]["role"] == "assistant"
    assert [c["id"] for c in openai[0]["tool_calls"]] == ["t1", "t2", "t3"]
    assert {m["tool_call_id"] for m in openai[1:]} >= {"t2"}
    anthropic = json.loads(
        auditor.get(f"/audit/sessions/{session}/transcript/?format=anthropic").content
    )
    assert anthropic[0]["content"][0] == {
        "type": "tool_use",
        "id": "t1",
        "name": "read_file",
        "input": {"path": "missing.txt"},
    }
    assert anthropic[1]["role"] == "user" and anthropic[1]["content"][0]["type"] == "tool_result"


def streamed_body(response: Any) -> str:
    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def test_session_and_filtered_exports_stream(auditor: Client, session: str) -> None:
    response = auditor.get(f"/audit/sessions/{session}/export.jsonl")
    assert response.streaming and response["Content-Disposition"].endswith('.jsonl"')
    rows = [json.loads(line) for line in streamed_body(response).splitlines()]
    assert rows[0]["kind"] == "session.started" and verify_events(rows).ok
    response = auditor.get("/audit/export/?format=csv&tool=write_file")
    table = list(csv.DictReader(io.StringIO(streamed_body(response))))
    assert {r["chain"] for r in table} == {session}
    assert auditor.get(f"/audit/sessions/{session}/export.xml").status_code == 404
