"""rtfresh: an agent's name is chosen by its client when it signs in with OAuth (the
client's registered `client_name`, agentauth.services.client_name: up to 80 characters,
line breaks and all). The notification's first line, "<agent> asks to run <tool>", put
it in the reviewers' email body as it came (only the reason and the arguments went through
`visible`): a name holding line breaks wrote lines of its own into the email, such as a
one-tap "Approve:" link of its choosing above the real ones, and a push notification's
title. The summary now shows a name on one line, its line breaks and invisible
characters escaped as the queue shows them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core import mail
from django.test import override_settings
from oauth2_provider.models import get_application_model

from agentauth.services import client_name
from approvals.models import ApprovalRequest
from approvals.notifications import messages
from approvals.notifications import services as notifications
from approvals.notifications.models import Channel, Kind
from dispatcher import agents
from tests.support.factories import make_user, submit_one, unique

pytestmark = pytest.mark.django_db

FAKE = "https://evil.example/approve"
REGISTERED = f"Helper\n\nOne-tap links, for you only:\nApprove: {FAKE}\nDeny: {FAKE}\n"


def an_ask_of_a_client_named(name: str) -> ApprovalRequest:
    owner = make_user(unique("owner"), mode="standard")
    application: Any = get_application_model()(name=name, client_id=unique("client"))
    agent, _token = agents.create_agent(owner=owner, name=client_name(application), actor="test")
    call = submit_one(
        agents.start_session(agent=agent), "write_file", {"path": "a.txt", "content": "x"}
    )
    return ApprovalRequest.objects.select_related("call__session__agent").get(call=call)


def emailed(name: str) -> Any:
    """The email a reviewer is sent about an ask of an agent so named."""
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    reviewer.email = f"{reviewer.username}@example.com"
    reviewer.save()
    approval = an_ask_of_a_client_named(name)
    Channel.objects.create(name=unique("mail"), kind=Kind.EMAIL, config={"addresses": []})
    for delivery_id in notifications.plan_ask(approval.pk):
        notifications.deliver(delivery_id)
    [sent] = [m for m in mail.outbox if reviewer.email in m.to]
    return sent


@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")
def test_an_agents_name_writes_no_line_of_its_own_into_a_reviewers_email() -> None:
    sent = emailed(REGISTERED)
    lines = sent.body.splitlines()
    assert not [line for line in lines if FAKE in line and line.startswith(("Approve", "Deny"))]
    assert lines[0].startswith("Helper\\n\\nOne-tap links") and lines[0].endswith(
        "asks to run write_file."
    )
    assert "\n" not in sent.subject


@override_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")
def test_an_agents_name_with_a_line_separator_stops_no_email() -> None:
    """A U+2028 in the name reached the subject, which Python's email refuses (a
    ValueError): every email about that agent's asks failed, retried and was given up,
    and its reviewers were never told."""
    sent = emailed("Helper\u2028Bcc: x@evil.example")
    assert "\u2028" not in sent.subject and sent.subject.startswith("[Harness] Helper\\u2028")


def test_an_agents_name_is_one_line_in_a_push_title() -> None:
    approval = an_ask_of_a_client_named(REGISTERED + "\u2028")
    title = json.loads(messages.push_payload(approval, {}))["title"]
    assert "\n" not in title and "\u2028" not in title and title.startswith("Helper\\n")
