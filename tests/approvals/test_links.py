"""Signed one-tap links: one recipient, one call, one verdict, used once (Django client)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from approvals import links
from approvals.models import ApprovalRequest, UsedLink
from audit import roles
from audit.models import AuditEvent
from dispatcher.models import Status
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import quorum_agent
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db


def path_of(url: str) -> str:
    return url.removeprefix("http://localhost:8000")


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def confirm(client: Client, url: str, digest: str, **extra: str) -> object:
    return client.post(path_of(url), {"digest": digest, **extra})


def status_of(approval: ApprovalRequest) -> str:
    approval.call.refresh_from_db()
    return str(approval.call.status)


def test_get_shows_the_whole_call_and_decides_nothing(reviewer: User, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "<b>hello</b>"})
    url = links.make_url(approval, reviewer, "approve")
    assert url.startswith("http://localhost:8000/approvals/links/")
    page = signed_in(reviewer).get(path_of(url)).content.decode()
    assert "Approve <code>write_file</code>?" in page
    assert '<pre class="diff">' in page and "&lt;b&gt;hello&lt;/b&gt;" in page
    assert approval.call.digest in page and "Confirm: approve" in page
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert not UsedLink.objects.exists()


def test_confirming_decides_once_and_a_reused_link_says_so(
    reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "approve")
    client = signed_in(reviewer)
    done = confirm(client, url, approval.call.digest)
    assert done.status_code == 200 and "Approved write_file." in done.content.decode()  # type: ignore[attr-defined]
    assert status_of(approval) == Status.QUEUED
    approved = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert approved.payload["via"] == "link" and approved.actor == f"user:{reviewer.username}"
    for again in (client.get(path_of(url)), confirm(client, url, approval.call.digest)):
        assert again.status_code == 409  # type: ignore[attr-defined]
        assert "already used" in again.content.decode()  # type: ignore[attr-defined]


def test_an_altered_link_decides_nothing(reviewer: User, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "deny")
    token = url.rstrip("/").rsplit("/", 1)[1]
    body, _, signature = token.rpartition(":")
    forged = body + ":" + ("A" if signature[0] != "A" else "B") + signature[1:]
    client = signed_in(reviewer)
    for response in (
        client.get(f"/approvals/links/{forged}/"),
        client.post(f"/approvals/links/{forged}/", {"digest": approval.call.digest}),
    ):
        assert response.status_code == 400
        assert "altered" in response.content.decode()
    # The approve link of another call does not work for this one either.
    other = ask(agent, {"path": "other.txt", "content": "y"}, call_id="w2")
    approve_other = path_of(links.make_url(other, reviewer, "approve"))
    assert confirm(client, approve_other, approval.call.digest).status_code == 409  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_an_expired_link_says_so(reviewer: User, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "approve")
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = confirm(signed_in(reviewer), url, approval.call.digest)
    assert response.status_code == 410 and "expired" in response.content.decode()  # type: ignore[attr-defined]
    assert not UsedLink.objects.exists()


def test_a_link_is_for_its_recipient_only(reviewer: User, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "approve")
    other = make_user(unique("other"), groups=("reviewer",))
    response = signed_in(other).get(path_of(url))
    assert (
        response.status_code == 403 and f"made for {reviewer.username}" in response.content.decode()
    )
    anonymous = Client().get(path_of(url))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert confirm(Client(), url, approval.call.digest).status_code == 302  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL


@override_settings(HARNESS_LINKS_REQUIRE_LOGIN=False)
def test_without_login_the_link_alone_decides_for_its_recipient_once(
    reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "deny")
    client = Client(enforce_csrf_checks=True)
    page = client.get(path_of(url))
    assert page.status_code == 200 and "Confirm: deny" in page.content.decode()
    token = client.cookies["csrftoken"].value
    without_csrf = Client(enforce_csrf_checks=True).post(
        path_of(url), {"digest": approval.call.digest}
    )
    assert without_csrf.status_code == 403
    done = client.post(
        path_of(url),
        {"digest": approval.call.digest, "feedback": "not today", "csrfmiddlewaretoken": token},
    )
    assert done.status_code == 200 and "Denied write_file." in done.content.decode()
    approval.call.refresh_from_db()
    assert approval.call.status == Status.DENIED and "not today" in approval.call.content
    assert approval.call.decided_by == f"user:{reviewer.username}"


@override_settings(HARNESS_LINKS_REQUIRE_LOGIN=False, HARNESS_MFA_REQUIRED="reviewers")
def test_a_link_alone_decides_nothing_for_a_reviewer_who_lacks_a_required_second_factor(
    reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    approve, deny = (links.make_url(approval, reviewer, v) for v in ("approve", "deny"))
    # Signed in, the same person is refused a decision until they set up a factor.
    signed = signed_in(reviewer).post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "digest": approval.call.digest}
    )
    assert signed.status_code == 403
    client = Client()
    for response in (client.get(path_of(approve)), client.get(path_of(deny))):
        page = response.content.decode()
        assert response.status_code == 403 and "This link decides nothing" in page
        assert f"{reviewer.username} must set up a second factor" in page
        assert 'href="/accounts/second-factor/"' in page
        assert approval.call.digest not in page  # nothing of the call is shown
    refused = confirm(client, approve, approval.call.digest)
    assert refused.status_code == 403  # type: ignore[attr-defined]
    assert "must set up a second factor" in refused.content.decode()  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL and not UsedLink.objects.exists()
    event = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.second_factor_missing"
    )
    assert event.actor == f"user:{reviewer.username}"
    assert event.payload["via"] == "link" and event.payload["verdict"] == "approve"
    # With a factor set up, the same link decides, once.
    SoftPasskey().register(reviewer)
    done = confirm(client, approve, approval.call.digest)
    assert done.status_code == 200 and "Approved write_file." in done.content.decode()  # type: ignore[attr-defined]
    assert status_of(approval) == Status.QUEUED


@override_settings(HARNESS_LINKS_REQUIRE_LOGIN=False, HARNESS_MFA_REQUIRED="admins")
def test_a_link_alone_still_decides_for_a_reviewer_the_setting_does_not_name(
    reviewer: User, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "deny")
    done = confirm(Client(), url, approval.call.digest)
    assert done.status_code == 200 and "Denied write_file." in done.content.decode()  # type: ignore[attr-defined]
    assert not AuditEvent.objects.filter(kind="approval.second_factor_missing").exists()


def test_a_confirm_must_carry_the_digest_shown(reviewer: User, agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "approve")
    response = confirm(signed_in(reviewer), url, "0" * 64)
    assert response.status_code == 409  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL and not UsedLink.objects.exists()


def test_a_link_vote_counts_towards_a_quorum() -> None:
    approval = ask(quorum_agent(approvals=2), {"path": "prod.tf", "content": "x"})
    first = make_user(unique("a"), groups=("reviewer",))
    second = make_user(unique("b"), groups=("reviewer",))
    url = links.make_url(approval, first, "approve")
    done = confirm(signed_in(first), url, approval.call.digest)
    assert f"1 of 2: {first.username}" in done.content.decode()  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL
    confirm(signed_in(second), links.make_url(approval, second, "approve"), approval.call.digest)
    assert status_of(approval) == Status.QUEUED


def test_a_link_of_someone_no_longer_a_reviewer_decides_nothing(agent: AgentFixture) -> None:
    from audit import roles

    person = make_user(unique("gone"), groups=("reviewer",))
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, person, "approve")
    roles.remove_role(user=person, role="reviewer", actor="test")
    response = confirm(signed_in(person), url, approval.call.digest)
    assert response.status_code == 403  # type: ignore[attr-defined]
    assert status_of(approval) == Status.PENDING_APPROVAL


@pytest.mark.parametrize("login_required", [True, False], ids=["signed-in", "link-alone"])
def test_a_link_of_a_deactivated_reviewer_decides_nothing(
    reviewer: User, agent: AgentFixture, login_required: bool
) -> None:
    approval = ask(agent, {"path": "notes.txt", "content": "x"})
    url = links.make_url(approval, reviewer, "approve")
    client = signed_in(reviewer)
    assert client.get(path_of(url)).status_code == 200  # the link worked a moment ago
    roles.deactivate(user=reviewer, actor="user:admin")
    with override_settings(HARNESS_LINKS_REQUIRE_LOGIN=login_required):
        response = confirm(client if login_required else Client(), url, approval.call.digest)
        with pytest.raises(links.LinkRefused, match="deactivated: this link decides nothing"):
            links.use(
                token=url.rstrip("/").rsplit("/", 1)[1], user=None, digest=approval.call.digest
            )
    assert response.status_code in (302, 403)  # type: ignore[attr-defined]  # (302: signed out)
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert not UsedLink.objects.exists()
