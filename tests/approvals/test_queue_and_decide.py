"""The reviewer queue, the page per call and the decision POST (Django test client)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.template.loader import render_to_string
from django.test import Client

from approvals import display
from approvals.models import ApprovalRequest, Decision
from approvals.queries import EarlierCall
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import ask, start_session
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer_client(reviewer: User) -> Client:
    client = Client()
    client.force_login(reviewer)
    return client


def decide(client: Client, approval: ApprovalRequest, action: str, **extra: Any) -> Any:
    data = {"action": action, "digest": approval.call.digest, **extra}
    return client.post(f"/approvals/{approval.pk}/decide", data)


def htmx_decide(client: Client, approval: ApprovalRequest, action: str, **extra: Any) -> Any:
    data = {"action": action, "digest": approval.call.digest, **extra}
    return client.post(f"/approvals/{approval.pk}/decide", data, headers={"HX-Request": "true"})


def test_queue_lists_pending_calls_oldest_first_with_agent_session_reason(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    first = ask(agent, {"path": "first.txt", "content": "1"})
    second = ask(agent, {"path": "second.txt", "content": "2"})
    page = reviewer_client.get("/approvals/").content.decode()
    assert page.index(f"call-{first.call_id}") < page.index(f"call-{second.call_id}")
    assert agent.agent.name in page
    assert "review me" in page  # the session title
    assert "standard mode asks a reviewer" in page and "mode:standard" in page
    assert "ago</time>" in page


def test_decided_calls_leave_the_queue(reviewer_client: Client, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    assert decide(reviewer_client, approval, "deny").status_code == 302
    assert f"call-{approval.call_id}" not in reviewer_client.get("/approvals/").content.decode()


def test_item_shows_diff_digest_pretty_and_raw_arguments_in_full(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    long_value = "line " * 3000
    approval = ask(agent, {"path": "notes.txt", "content": long_value})
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert '<pre class="diff">' in page and "+line line" in page
    assert approval.call.digest in page
    assert '<pre class="arguments">{\n  &quot;content&quot;' in page  # pretty-printed
    assert "Raw text</summary>" in page
    assert page.count(long_value.strip()) >= 3  # diff, pretty and raw: never truncated
    assert re.search(r'<div hx-disable>\s*<header class="approval-head">', page)


def test_command_presentation_shows_argv_and_working_directory(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"argv": ["make", "deploy"], "cwd": "."}, name="run_command")
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert '<ol class="argv"><li><code>make</code></li><li><code>deploy</code></li></ol>' in page
    assert f"Working directory: <code>{approval.presentation['cwd']}</code>" in page


def test_hostile_arguments_are_escaped_text_with_visible_control_characters(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    hostile = (
        '<script>alert(1)</script><img src=x onerror=alert(2)> <b hx-get="/x">\u202eevil\u200b'
    )
    approval = ask(agent, {"path": "h.txt", "content": hostile})
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert (
        "<script>alert" not in page and "<img src=x" not in page and '<b hx-get="/x">' not in page
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b hx-get=" in page
    assert "\u202e" not in page and "\u200b" not in page
    assert "\\u202eevil\\u200b" in page


def test_visible_escapes_controls_bidi_and_zero_width_but_keeps_layout() -> None:
    text = "a\tb\nc\x00\x1b\r\u202a\u202e\u2066\u2069\u200b\u200f\ufeff\u2028\u2029\U000e0041"
    assert display.visible(text) == (
        "a\tb\nc\\u0000\\u001b\\u000d\\u202a\\u202e\\u2066\\u2069\\u200b\\u200f\\ufeff"
        "\\u2028\\u2029\\U000e0041"
    )
    assert display.visible("<b>é</b>") == "<b>é</b>"  # HTML escaping is autoescape's job


def test_pretty_arguments_keeps_logged_key_order_and_flags_repeated_keys() -> None:
    pretty, repeated = display.pretty_arguments('{"z": 1, "a": {"y": 2}, "z": 3}')
    assert pretty == '{\n  "z": 3,\n  "a": {\n    "y": 2\n  }\n}'
    assert repeated == ["z"]
    assert display.pretty_arguments("not json") == ("", [])


def test_session_context_lists_earlier_calls_with_outcomes(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    session_id = start_session(agent)
    earlier = ask(agent, {"path": "a", "content": "1"}, session_id=session_id, call_id="c1")
    decide(reviewer_client, earlier, "deny", feedback="no")
    later = ask(agent, {"path": "b", "content": "2"}, session_id=session_id, call_id="c2")
    page = reviewer_client.get(f"/approvals/{later.pk}/").content.decode()
    assert "Session context: 1 earlier call<" in page
    assert 'class="status status-denied">Denied</span>' in page


def test_session_context_is_what_the_template_loop_rendered_and_escapes_every_part() -> None:
    """The session context's rows are prepared in one Python pass for speed
    (approval_tags.session_rows) and autoescaped by queue.html: byte for byte what the
    template loop it replaced rendered, for hostile values too."""
    # The loop as queue.html had it, over the model instances it was given then.
    loop = Template(
        "{% load approval_tags %}{% for earlier in history %}<li><code>{{ earlier.name|visible }}"
        '</code> <span class="status status-{{ earlier.status }}">{{ earlier.get_status_display }}'
        '</span> <span class="muted">{{ earlier.decided_by|visible }}</span>{% if earlier.reason %}'
        ": {{ earlier.reason|visible|truncatechars:300 }}{% endif %}</li>{% endfor %}"
    )
    reasons = [
        "",
        "short e\u0301",
        "<b>x</b>\u202e&",
        "e\u0301" * 250 + "x" * 100,
        "é" * 301,
        "a" * 300,
    ]
    history = [
        EarlierCall(f"t{i}", "<script>n</script>\u200b", status, '"who" & <why>\u202e', reason)
        for i, (status, reason) in enumerate(zip(list(Status) * 2, reasons * 3, strict=False))
    ]
    instances = [
        ToolCall(name=e.name, status=e.status, decided_by=e.decided_by, reason=e.reason)
        for e in history
    ]
    html = render_to_string(
        "approvals/queue.html#session_context", {"approval": {"history": history}}
    )
    assert html == loop.render(Context({"history": instances}))
    assert "<script>" not in html and "&lt;script&gt;n&lt;/script&gt;\\u200b" in html
    assert "&lt;b&gt;x&lt;/b&gt;\\u202e&amp;" in html and "…" in html


def test_approve_queues_the_call_and_audits_reviewer_digest_and_time(
    reviewer_client: Client, reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    response = decide(reviewer_client, approval, "approve")
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    approval.refresh_from_db()
    assert approval.decision == Decision.APPROVED and approval.decided_by == reviewer
    assert ToolCall.objects.get(pk=approval.call_id).status in (Status.QUEUED, Status.RUNNING)
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert event.actor == f"user:{reviewer.username}"
    assert event.payload["digest_seen"] == approval.call.digest
    assert "decision_seconds" in event.payload


def test_deny_with_feedback_becomes_the_tool_result(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    response = htmx_decide(reviewer_client, approval, "deny", feedback="Write to b.txt instead.")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Denied write_file." in body
    assert f'<div id="call-{approval.call_id}" hx-swap-oob="delete"></div>' in body
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.DENIED
    assert "Write to b.txt instead." in call.content


def test_second_decision_gets_409_naming_who_decided(agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    alice, bob = (make_user(unique(n), groups=("reviewer",)) for n in ("alice", "bob"))
    first, second = Client(), Client()
    first.force_login(alice)
    second.force_login(bob)
    assert decide(first, approval, "approve").status_code == 302
    response = htmx_decide(second, approval, "deny")
    assert response.status_code == 409
    assert f"Already decided by {alice.username}" in response.content.decode()
    plain = decide(second, approval, "deny")
    assert plain.status_code == 409 and "Already decided by" in plain.content.decode()


def test_digest_mismatch_is_refused_with_409_and_audited(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    response = reviewer_client.post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "digest": "0" * 64}
    )
    assert response.status_code == 409
    assert "digest mismatch" in response.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL
    assert AuditEvent.objects.filter(
        subject=f"call:{approval.call_id}", kind="approval.digest_mismatch"
    ).exists()


def test_non_reviewers_get_403_everywhere(agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    client = Client()
    client.force_login(make_user(unique("auditor"), groups=("auditor",)))
    assert client.get("/approvals/").status_code == 403
    assert client.get(f"/approvals/{approval.pk}/").status_code == 403
    assert decide(client, approval, "approve").status_code == 403
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_owner_cannot_approve_own_agent_when_separation_of_duties_is_on(
    settings: Any, db: None
) -> None:
    settings.HARNESS_FORBID_SELF_APPROVAL = True
    owner = make_user(unique("owner"), groups=("reviewer",), mode="standard")
    fx = make_agent(owner=owner)
    approval = ask(fx, {"path": "a.txt", "content": "x"})
    client = Client()
    client.force_login(owner)
    response = decide(client, approval, "approve")
    assert response.status_code == 403 and "another reviewer" in response.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_unknown_request_is_404(reviewer_client: Client) -> None:
    assert reviewer_client.get("/approvals/999999/").status_code == 404
    response = reviewer_client.post("/approvals/999999/decide", {"action": "approve"})
    assert response.status_code == 404
    # An id no integer column holds (the URL takes any number of digits) is unknown too,
    # never a 500.
    huge = "9" * 30
    response = reviewer_client.post(f"/approvals/{huge}/decide", {"action": "approve"})
    assert response.status_code == 404


def test_decided_call_page_shows_the_outcome_without_buttons(
    reviewer_client: Client, reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    decide(reviewer_client, approval, "deny", feedback="nope")
    page = reviewer_client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "<strong>Denied</strong>, decided by " + reviewer.username in page
    assert "Feedback: nope" in page
    assert ">Approve</button>" not in page


def test_pushes_only_for_calls_entering_or_leaving_the_queue(agent: AgentFixture) -> None:
    from approvals import live

    approval = ask(agent, {"path": "a.txt", "content": "x"})
    call_id = str(approval.call_id)
    assert "beforeend:#approval-items" in live.render_change(
        call_id, "pending_approval", "received"
    )
    removal = f'<div id="call-{call_id}" hx-swap-oob="delete"></div>'
    assert live.render_change(call_id, "denied", "pending_approval").strip() == removal
    assert live.render_change(call_id, "queued", "received") is None
    assert live.render_change(call_id, "completed", "running") is None
