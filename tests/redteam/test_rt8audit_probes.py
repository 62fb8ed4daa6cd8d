"""Red team (rt8audit) of the streamed audit pages (replay, transcript, its downloads), the
timeline and the exports: what held.

Another team's session is a 404 on every page, download and parameter, as one that does not
exist; an agent's bearer token or an OAuth access token, even of an auditor's own agent,
opens none of them (sign in), a reviewer is refused; everything an agent sent is escaped in
the streamed HTML (never a stream mark, a tag or a raw bidi character of its own) and
exact in the JSON downloads; bad parameters are a 4xx, never a 500."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client, override_settings
from django.utils import timezone
from oauth2_provider.models import get_access_token_model, get_application_model

from audit.services import record_event
from tests.audit.test_long_pages import _body
from tests.redteam.test_rt6audit_long_page_slots import streamed
from tests.support.factories import make_user, unique
from tests.teams.world import TeamWorld, make_team

pytestmark = pytest.mark.django_db
__all__ = ["streamed"]  # the fixture, used by name

PAGES = (
    "",
    "replay/",
    "transcript/",
    "transcript/?format=openai",
    "transcript/?format=anthropic",
    "export.jsonl",
    "export.csv",
)


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("rt8pay")


@pytest.fixture
def sec() -> TeamWorld:
    return make_team("rt8sec")


def _call_id(world: TeamWorld) -> str:
    return str(world.approval.call.pk)


@override_settings(  # no slot cap: the test client closes no export it reads
    HARNESS_MAX_EXPORTS=0, HARNESS_MAX_EXPORTS_PER_PERSON=0, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_another_teams_session_is_a_404_on_every_page_as_one_that_does_not_exist(
    pay: TeamWorld, sec: TeamWorld
) -> None:
    auditor = pay.client("auditor")
    for page in PAGES:
        own = auditor.get(f"/audit/sessions/{pay.session.pk}/{page}")
        assert own.status_code == 200, (page, own.status_code)
        for session in (sec.session.pk, uuid.uuid4()):
            other = auditor.get(f"/audit/sessions/{session}/{page}")
            assert other.status_code == 404, (page, other.status_code)
            body = _body(other)
            for marker in sec.markers:
                assert marker.encode() not in body, (page, marker)
    # Another team's call named on one's own timeline: no such call in this session.
    named = auditor.get(f"/audit/sessions/{pay.session.pk}/?call={_call_id(sec)}")
    assert named.status_code == 404
    assert sec.secret.encode() not in named.content
    # The filtered export selects only sessions the auditor reaches, whatever it names.
    agent = sec.agent.agent.name
    export = auditor.get(f"/audit/export/?format=jsonl&agent={agent}")
    assert export.status_code == 200
    assert _body(export) == b""


def _oauth_token(owner: object) -> str:
    application = get_application_model().objects.create(
        name=unique("rt8app"),
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://127.0.0.1/callback",
    )
    token = unique("rt8tok") + uuid.uuid4().hex
    get_access_token_model().objects.create(
        user=owner,
        token=token,
        application=application,
        expires=timezone.now() + timedelta(hours=1),
        scope="read write",
    )
    return token


def test_no_agent_credential_opens_an_audit_page_even_of_an_auditors_own_agent(
    pay: TeamWorld,
) -> None:
    owner = pay.agent.owner
    owner.groups.add(Group.objects.get_or_create(name="auditor")[0])  # the owner audits
    tokens = (pay.agent.token, _oauth_token(owner))
    urls = [f"/audit/sessions/{pay.session.pk}/{page}" for page in PAGES]
    for url in (*urls, "/audit/sessions/", "/audit/export/?format=jsonl"):
        for token in tokens:
            response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
            assert response.status_code == 302, (url, response.status_code)
            assert "/accounts/login/" in response["Location"]
        refused = pay.client("reviewer").get(url)
        assert refused.status_code == 403, (url, refused.status_code)


HOSTILE = (
    "</pre></td></tr></tbody></table><script>alert(1)</script>"
    "<!--harness-stream:calls--><!--harness-stream:steps-->"
    "</script><img src=x onerror=alert(2)>\u202egnp.exe\u2066\x1b[31m"
)


def _hostile_session(calls: int) -> uuid.UUID:
    session_id = uuid.uuid4()
    record_event(
        kind="session.started",
        actor="agent:rt8",
        session_id=session_id,
        payload={"agent": "rt8", "owner": "o", "title": HOSTILE, "mode": "standard"},
    )
    for n in range(calls):
        call_id = str(uuid.uuid4())
        received = {
            "call_id": call_id,
            "tool_use_id": HOSTILE,
            "tool": HOSTILE,
            "arguments": json.dumps({"x": HOSTILE}),
            "batch_id": call_id,
            "batch_index": 0,
        }
        record_event(
            kind="call.received",
            actor="agent:rt8",
            subject=f"call:{call_id}",
            session_id=session_id,
            payload=received,
        )
        record_event(
            kind="call.completed",
            actor="worker",
            subject=f"call:{call_id}",
            session_id=session_id,
            payload={"call_id": call_id, "tool": HOSTILE, "content": HOSTILE + str(n)},
        )
    return session_id


@pytest.mark.parametrize("calls", [2, 150])  # a page answered whole, and a streamed one
def test_everything_an_agent_sent_is_escaped_in_the_streamed_pages_and_exact_in_downloads(
    streamed: None, calls: int
) -> None:
    session_id = _hostile_session(calls)
    client = Client()
    client.force_login(make_user(unique("rt8aud"), groups=("auditor",)))
    for page, sections in (("replay/", ("steps", "pending", "calls")), ("transcript/", ())):
        response = client.get(f"/audit/sessions/{session_id}/{page}")
        assert response.status_code == 200
        assert response.streaming == (calls > 2), (page, response.streaming)
        body = _body(response).decode()
        assert body.rstrip().endswith("</html>")
        for raw in ("<script>alert", "<img", "\u202e", "\u2066", "\x1b", "<!--harness-stream"):
            assert raw not in body, (page, raw)
        assert body.count("&lt;script&gt;alert(1)") >= calls
        assert body.count("<script") == body.count("</script>")  # (only the page's own)
        assert body.count('data-role="calls"') == (1 if page == "replay/" else 0)
        for name in sections:  # every section once, between its own marks' neighbours
            assert body.count(f'data-role="{"event" if name == "steps" else name}"') == 1
    for fmt in ("openai", "anthropic"):
        response = client.get(f"/audit/sessions/{session_id}/transcript/?format={fmt}")
        messages = json.loads(_body(response))
        assert len(messages) == 2 * calls
        for message in messages[::2]:  # the call as received, exact
            [use] = message["tool_calls"] if fmt == "openai" else message["content"]
            name = use["function"]["name"] if fmt == "openai" else use["name"]
            assert (name, use["id"]) == (HOSTILE, HOSTILE)
        results = [
            m["content"] if fmt == "openai" else m["content"][0]["content"] for m in messages[1::2]
        ]
        assert results == [HOSTILE + str(n) for n in range(calls)]
        assert response["Content-Type"].startswith("application/json")
        assert response["Content-Disposition"].startswith("attachment;")


@pytest.mark.parametrize(
    "query",
    [
        "before=-1",
        "before=abc",
        "before=" + "9" * 40,
        "after=1e9",
        "after=" + "1" * 19,
        "before=1&after=2",
        "call=" + "x" * 5000,
        "call=",
        "outcome=" + "y" * 5000,
        "tool=%E2%80%AE",
    ],
)
def test_a_bad_timeline_parameter_is_a_404_saying_what_to_do(pay: TeamWorld, query: str) -> None:
    response = pay.client("auditor").get(f"/audit/sessions/{pay.session.pk}/?{query}")
    assert response.status_code == 404, response.status_code
    assert b"Traceback" not in response.content


@pytest.mark.parametrize(
    ("page", "status"),
    [
        ("transcript/?format=" + "z" * 5000, 200),  # no such download: the page
        ("transcript/?format=openai%00", 200),
        ("transcript/?format=OPENAI", 200),
        ("export.xml", 404),
        ("export." + "j" * 3000, 404),
        ("replay/?seq=-1&page=abc", 200),
    ],
)
def test_bad_transcript_and_export_parameters_are_no_500(
    pay: TeamWorld, page: str, status: int
) -> None:
    response = pay.client("auditor").get(f"/audit/sessions/{pay.session.pk}/{page}")
    assert response.status_code == status, response.status_code
    if status == 200:
        assert response["Content-Type"].startswith("text/html")
