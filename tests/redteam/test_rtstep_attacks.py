"""Red team (rtstep): ways around a step-up (passkey-signed) approval, or an approval of
something other than what was shown and signed. Real HTTP through the Django test client
with CSRF checks enforced, real assertions of a software passkey registered through
allauth.mfa (tests/support/passkeys.py), as tests/approvals/test_step_up.py does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from allauth.mfa.models import Authenticator
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest, SignedVerdict, Vote
from audit.models import AuditEvent
from audit.roles import grant_role, remove_role
from dispatcher.models import Status
from teams.services import add_member, create_team, remove_member
from tests.approvals.conftest import ask
from tests.approvals.test_step_up import HOST, WRITE, status_of, step_up_agent
from tests.support.factories import make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db


def browser(user: User) -> Client:
    """A signed-in browser whose POSTs must carry the CSRF token, as a real one's do."""
    client = Client(HTTP_HOST=HOST, enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/accounts/me/").status_code == 200  # sets the CSRF cookie
    return client


def post(client: Client, path: str, data: dict[str, Any]) -> Any:
    return client.post(path, {**data, "csrfmiddlewaretoken": client.cookies["csrftoken"].value})


def keyed_reviewer(*groups: str) -> tuple[User, Client, SoftPasskey]:
    user = make_user(unique("rev"), groups=groups or ("reviewer",))
    key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    key.register(user)
    return user, browser(user), key


def challenge(client: Client, approval: ApprovalRequest, verdict: str = "approve") -> bytes:
    from fido2.utils import websafe_decode

    response = post(client, f"/approvals/{approval.pk}/step-up", {"verdict": verdict})
    assert response.status_code == 200, response.content
    return websafe_decode(response.json()["publicKey"]["challenge"])


def signed_approve(client: Client, approval: ApprovalRequest, key: SoftPasskey) -> Any:
    assertion = key.assertion(challenge(client, approval))
    return post(
        client,
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": json.dumps(assertion)},
    )


# --- Holes found (each failed before its fix) ------------------------------------------


def test_a_staff_session_adds_no_passkey_through_the_django_admin_to_sign_with() -> None:
    """allauth registers an editable admin for its Authenticator rows: a superuser's session
    (one someone took over: no recent sign-in, so allauth's own "Add a passkey" asks for
    the password first) added a passkey there, unaudited and without reauthentication,
    then signed a step-up approval with it."""
    approval = ask(step_up_agent(), WRITE)
    boss = User.objects.create_superuser(unique("boss"), password="pw-boss-long-enough")
    client = browser(boss)
    key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    data = {"name": "mine", "credential": key.registration()}
    # allauth's own page wants the password again (not a recent sign-in).
    own = post(client, "/accounts/2fa/webauthn/add/", {"credential": json.dumps(data)})
    assert own.status_code == 302 and "reauthenticate" in own["Location"]
    # The admin's add form (before: 302, the passkey stored, no event): refused.
    form = {"user": boss.pk, "type": "webauthn", "data": json.dumps(data)}
    form |= {"created_at_0": "2026-12-06", "created_at_1": "10:00:00"}
    form |= {"last_used_at_0": "2026-12-06", "last_used_at_1": "10:00:00"}
    added = post(client, "/admin/mfa/authenticator/add/", form)
    assert added.status_code == 403
    assert not Authenticator.objects.filter(user=boss).exists()
    assert client.get("/admin/mfa/authenticator/add/").status_code == 403
    # So there is no key of theirs to sign with, and the call still waits.
    asked = post(client, f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    assert asked.status_code == 400 and "you have none" in asked.json()["error"]
    assert status_of(approval) == Status.PENDING_APPROVAL
    # The rows stay visible (read-only), without their secrets.
    other, _, _ = keyed_reviewer()
    row = Authenticator.objects.get(user=other)
    page = client.get(f"/admin/mfa/authenticator/{row.pk}/change/")
    assert page.status_code == 200 and "credential" not in page.content.decode()
    assert (
        post(client, f"/admin/mfa/authenticator/{row.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert Authenticator.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("how", ["role", "deactivation"])
def test_a_voter_whose_signed_vote_was_discarded_signs_again(how: str) -> None:
    """A signed vote discarded (the voter lost the role, or was deactivated) and its voter
    back: their new signed vote was a 500 (the kept signature's one-per-reviewer
    constraint), so they could never approve that call again."""
    approval = ask(step_up_agent(approvals=2), WRITE)
    alice, alice_browser, alice_key = keyed_reviewer()
    _, bob_browser, bob_key = keyed_reviewer()
    assert signed_approve(alice_browser, approval, alice_key).status_code == 302
    if how == "role":
        remove_role(user=alice, role="reviewer", actor="test")
        # Bob's vote is counted alone: Alice's is discarded (audited).
        assert signed_approve(bob_browser, approval, bob_key).status_code == 302
        grant_role(user=alice, role="reviewer", actor="test")
    else:
        from audit.roles import deactivate

        deactivate(user=alice, actor="test")  # her votes are voided (audited)
        assert signed_approve(bob_browser, approval, bob_key).status_code == 302
        User.objects.filter(pk=alice.pk).update(is_active=True)
        alice_browser = browser(User.objects.get(pk=alice.pk))
    assert AuditEvent.objects.filter(
        subject=f"call:{approval.call_id}", kind="approval.vote_discarded"
    ).exists()
    assert status_of(approval) == Status.PENDING_APPROVAL
    again = signed_approve(alice_browser, approval, alice_key)
    assert again.status_code == 302, again.content.decode()[-500:]
    assert status_of(approval) == Status.QUEUED
    assert set(Vote.objects.filter(approval=approval).values_list("voter_id", flat=True)) == {
        alice.pk,
        Vote.objects.filter(approval=approval).exclude(voter=alice).get().voter_id,
    }
    # Both of her signatures are kept (and verify).
    assert SignedVerdict.objects.filter(approval=approval, voter=alice).count() == 2


def test_someone_elses_key_under_your_passkeys_id_does_not_block_your_signatures() -> None:
    """A credential id is public (the audit log carries it) and allauth.mfa registers one id
    to two people: Mallory registered her own key under Alice's passkey's id and signed once
    with a huge counter; Alice's next signature was refused as a clone ("counter went
    back"), so she could approve no step-up call."""
    fx = step_up_agent()
    mallorys_call = ask(fx, WRITE, call_id="m1")
    alices_call = ask(fx, {**WRITE, "path": "other.tf"}, call_id="a1")
    _, alice_browser, alice_key = keyed_reviewer()
    mallory = make_user(unique("mallory"), groups=("reviewer",))
    mallorys_key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    mallorys_key.credential_id = alice_key.credential_id
    mallorys_key.register(mallory)
    mallorys_key.counter = 4_000_000_000
    assert signed_approve(browser(mallory), mallorys_call, mallorys_key).status_code == 302
    answer = signed_approve(alice_browser, alices_call, alice_key)
    assert answer.status_code == 302, answer.content.decode()[-500:]
    assert status_of(alices_call) == Status.QUEUED
    # A real clone (the same key, its counter behind) is still refused.
    third = ask(fx, {**WRITE, "path": "third.tf"}, call_id="a2")
    alice_key.counter = 0  # the copy's counter: its next signature counts 1
    cloned = signed_approve(alice_browser, third, alice_key)
    assert cloned.status_code == 403 and "counter went back" in cloned.content.decode()
    assert status_of(third) == Status.PENDING_APPROVAL


def test_a_signature_over_a_challenge_older_than_five_minutes_decides_nothing() -> None:
    """A challenge never expired: an assertion signed when the page asked, kept, and sent
    an hour later (by whoever held it and the session) still approved. Its age is set
    back in the session as the clock would (the decision reads the time it was issued)."""
    approval = ask(step_up_agent(), WRITE)
    user, client, key = keyed_reviewer()
    kept = key.assertion(challenge(client, approval))
    session = client.session
    session["harness.step_up_at"] = {
        k: at - 3600 for k, at in session.get("harness.step_up_at", {}).items()
    }
    session.save()
    late = post(
        client,
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": json.dumps(kept)},
    )
    assert late.status_code == 403 and "minutes old" in late.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert not SignedVerdict.objects.filter(approval=approval).exists()
    refused = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.step_up_refused"
    )
    assert refused.actor == f"user:{user.username}" and "minutes old" in refused.payload["reason"]
    # A fresh challenge, signed now, approves it.
    assert signed_approve(client, approval, key).status_code == 302
    assert status_of(approval) == Status.QUEUED


def own_page(user: User) -> Client:
    """`user` signed in with their password and confirmed it again (allauth asks before a
    passkey is added), CSRF enforced: their own "Add a passkey" page works."""
    client = Client(HTTP_HOST=HOST, enforce_csrf_checks=True)
    client.get("/accounts/login/")
    password = "pw-" + user.get_username()  # (tests.support.factories.make_user)
    assert post(client, "/accounts/login/", {"login": user.username, "password": password})[
        "Location"
    ] in ("/", "/approvals/")
    assert post(client, "/accounts/reauthenticate/", {"password": password}).status_code == 302
    return client


def add_on_own_page(client: Client, key: SoftPasskey) -> Any:
    """The browser's part of allauth.mfa's "Add a passkey": the page's creation options,
    the authenticator's registration over its challenge, the form's POST."""
    page = client.get("/accounts/2fa/webauthn/add/")
    assert page.status_code == 200, page.get("Location")
    html = page.content.decode()
    start = html.index('<script id="js_data" type="application/json">') + len(
        '<script id="js_data" type="application/json">'
    )
    data = json.loads(html[start : html.index("</script>", start)])
    challenge = data["creation_options"]["publicKey"]["challenge"]
    credential = json.dumps(key.registration(challenge))
    return post(client, "/accounts/2fa/webauthn/add/", {"name": "key", "credential": credential})


def test_a_passkey_id_registered_to_someone_already_is_refused_on_the_add_page(
    settings: Any,
) -> None:
    """allauth.mfa registered a credential id that is another person's (public: the audit
    log carries it) to Mallory, with her own key; verify_audit then reported Alice's
    genuine signature as BAD ("the recorded public key is not the key registered under
    this credential id"). WebAuthn says to refuse a known credential id at registration."""
    settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True  # the test client's http origin
    approval = ask(step_up_agent(), WRITE)
    _, alice_browser, alice_key = keyed_reviewer()
    assert signed_approve(alice_browser, approval, alice_key).status_code == 302
    mallory = make_user(unique("mallory"), groups=("reviewer",))
    client = own_page(mallory)
    copied = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    copied.credential_id = alice_key.credential_id
    refused = add_on_own_page(client, copied)
    assert refused.status_code == 200 and "registered already" in refused.content.decode()
    assert not Authenticator.objects.filter(user=mallory).exists()
    from tests.approvals.test_step_up import verify_audit

    ok, out = verify_audit()
    assert ok, out
    # A key of her own is added by the same steps.
    added = add_on_own_page(client, SoftPasskey(rp_id=HOST, origin=f"http://{HOST}"))
    assert added.status_code == 302, added.content.decode()[-800:]
    assert Authenticator.objects.filter(user=mallory, type="webauthn").count() == 1


# --- What held -------------------------------------------------------------------------


def test_held_a_decision_without_the_csrf_token_is_refused() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = keyed_reviewer()
    assertion = key.assertion(challenge(client, approval))
    for path, data in (
        (f"/approvals/{approval.pk}/step-up", {"verdict": "approve"}),
        (
            f"/approvals/{approval.pk}/decide",
            {
                "action": "approve",
                "digest": approval.call.digest,
                "assertion": json.dumps(assertion),
            },
        ),
        (f"/approvals/{approval.pk}/edit", {"digest": approval.call.digest, "arguments": "{}"}),
    ):
        assert client.post(path, data).status_code == 403
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_held_an_auditor_with_a_passkey_neither_gets_a_challenge_nor_approves() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = keyed_reviewer("auditor")
    asked = post(client, f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    assert asked.status_code == 403
    decided = post(
        client,
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": "{}"},
    )
    assert decided.status_code == 403
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_held_a_reviewer_removed_from_the_team_after_signing_decides_nothing() -> None:
    fx = step_up_agent()
    team = create_team(name=unique("t"), actor="test")
    fx.agent.team = team
    fx.agent.save(update_fields=["team"])
    approval = ask(fx, WRITE)
    member = make_user(unique("member"))
    add_member(team=team, user=member, role="reviewer", actor="test")
    key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    key.register(member)
    client = browser(member)
    assertion = key.assertion(challenge(client, approval))
    remove_member(team=team, user=member, role="reviewer", actor="test")
    answer = post(
        client,
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": json.dumps(assertion)},
    )
    assert answer.status_code == 403
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_held_only_the_latest_challenge_of_a_verdict_counts() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = keyed_reviewer()
    older = key.assertion(challenge(client, approval))
    challenge(client, approval)  # asked again: the older signature's nonce is replaced
    answer = post(
        client,
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": json.dumps(older)},
    )
    assert answer.status_code == 403 and "another challenge" in answer.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_held_the_django_admin_changes_no_call() -> None:
    approval = ask(step_up_agent(), WRITE)
    boss = User.objects.create_superuser(unique("boss"), password="pw-boss-long-enough")
    client = browser(boss)
    path = f"/admin/dispatcher/toolcall/{approval.call_id}/change/"
    changed = post(client, path, {"status": "queued"})
    assert changed.status_code == 403
    path = f"/admin/approvals/approvalrequest/{approval.pk}/change/"
    assert post(client, path, {"step_up": "[]"}).status_code == 403
    approval.refresh_from_db()
    assert approval.step_up == ["approve"] and status_of(approval) == Status.PENDING_APPROVAL
