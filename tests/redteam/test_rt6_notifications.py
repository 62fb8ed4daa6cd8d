"""A notification planned for a reviewer is sent only if they still review the call when
it goes out (found by the rt6 red team): an email or push planned before a person's
reviewer role was taken away, or their account deactivated, was still sent, with the
call's tool and arguments, to someone who may no longer see it. The recipients are now
worked out again at sending, as a webhook's and Slack's already were."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals.models import Delivery
from approvals.notifications import services as notifications
from audit.roles import REVIEWER, deactivate, remove_role
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import channel
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

WRITE = {"path": "secret-plan.tf", "content": "apply"}


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # (as tests/notifications/conftest.py)


def reviewer(prefix: str) -> User:
    user = make_user(unique(prefix), groups=(REVIEWER,))
    user.email = f"{user.username}@example.test"
    user.save()
    return user


def test_an_email_planned_before_a_reviewer_lost_access_is_not_sent(agent: AgentFixture) -> None:
    stays, demoted, leaver = reviewer("stays"), reviewer("demoted"), reviewer("leaver")
    with receivers.smtp_server() as mailbox, receivers.mailers_for(mailbox):
        channel("email", {"addresses": []}).users.add(stays, demoted, leaver)
        approval = ask(agent, WRITE)
        planned = notifications.plan_ask(approval.pk)
        assert len(planned) == 3  # one each, planned while all three reviewed
        assert remove_role(user=demoted, role=REVIEWER, actor="user:admin")
        assert deactivate(user=leaver, actor="user:admin")
        for delivery_id in planned:
            notifications.deliver(delivery_id)
    assert [m["To"] for m in mailbox.messages] == [stays.email]
    states = {d.recipient.username: d for d in Delivery.objects.filter(pk__in=planned)}
    assert states[stays.username].state == Delivery.State.SENT
    for gone in (demoted, leaver):
        assert states[gone.username].state == Delivery.State.GAVE_UP
        assert states[gone.username].last_error.startswith(
            f"Not sent: {gone.username} no longer reviews this call"
        )
