"""Step-up: a rule asks a passkey for a verdict; the reviewer signs the request, the call's
digest and the verdict; the vote and the audit event keep the assertion; verify_audit
checks it. Real assertions from a software P-256 passkey registered through allauth.mfa
(tests/support/passkeys.py); the browser test uses Chromium's virtual authenticator."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from approvals import links
from approvals.models import ApprovalRequest, SignedVerdict
from audit import signing
from audit.assertions import challenge_for
from audit.models import AuditChain, AuditEvent
from audit.services import canonical_event, chain_hash
from dispatcher.models import Status
from dispatcher.policy import profiles
from tests.approvals.conftest import ask
from tests.audit.tamper import sql, triggers_disabled
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db

HOST = "localhost"  # a relying party WebAuthn accepts over http (the test client's host)
WRITE = {"path": "prod.tf", "content": "apply"}


def step_up_agent(step_up: Any = True, approvals: int = 1) -> AgentFixture:
    fx = make_agent(mode="standard")
    entry = {"rule": "write_file", "approvals": approvals, "step_up": step_up}
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=[], ask=[entry], deny=[], actor="test"
    )
    return fx


def reviewer_with_key() -> tuple[User, Client, SoftPasskey]:
    user = make_user(unique("rev"), groups=("reviewer",))
    key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    key.register(user)
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    return user, client, key


def challenge(client: Client, approval: ApprovalRequest, verdict: str = "approve") -> bytes:
    """Ask the server for a challenge (as the page does) and return its bytes."""
    from fido2.utils import websafe_decode

    response = client.post(f"/approvals/{approval.pk}/step-up", {"verdict": verdict})
    assert response.status_code == 200, response.content
    return websafe_decode(response.json()["publicKey"]["challenge"])


def decide(
    client: Client, approval: ApprovalRequest, assertion: Any = None, action: str = "approve"
) -> Any:
    data = {"action": action, "digest": approval.call.digest}
    if assertion is not None:
        data["assertion"] = json.dumps(assertion)
    return client.post(f"/approvals/{approval.pk}/decide", data)


def status_of(approval: ApprovalRequest) -> str:
    approval.call.refresh_from_db()
    return str(approval.call.status)


def verify_audit() -> tuple[bool, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("verify_audit", stdout=out, stderr=err)
    except CommandError as error:
        return False, err.getvalue() + str(error)
    return True, out.getvalue()


# --- The rule ---------------------------------------------------------------------------


def test_a_step_up_rule_is_recorded_on_the_request_and_said_in_its_reason() -> None:
    approval = ask(step_up_agent(), WRITE)
    assert approval.step_up == ["approve"] and not approval.is_quorum
    assert "signed with a reviewer's passkey" in approval.reason
    both = ask(step_up_agent(["approve", "deny"], approvals=2), WRITE)
    assert both.step_up == ["approve", "deny"] and both.approvals_required == 2


@pytest.mark.parametrize("value", ["yes", [], ["approve", "maybe"], 1])
def test_a_bad_step_up_value_is_named_and_nothing_is_saved(value: Any) -> None:
    user = make_user(unique("dev"))
    entry = {"rule": "write_file", "step_up": value}
    with pytest.raises(profiles.InvalidProfile, match='"step_up" must be true'):
        profiles.update_profile(
            user=user, mode="standard", allow=[], ask=[entry], deny=[], actor="t"
        )


def test_step_up_false_is_the_plain_rule() -> None:
    user = make_user(unique("dev"))
    profiles.update_profile(
        user=user,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "step_up": False}],
        deny=[],
        actor="t",
    )
    assert profiles.rules_document(user)["ask"] == ["write_file"]


# --- Approving with a passkey -----------------------------------------------------------


def test_approving_needs_a_signature_and_a_signed_approval_is_kept_and_audited() -> None:
    approval = ask(step_up_agent(), WRITE)
    user, client, key = reviewer_with_key()
    unsigned = decide(client, approval)
    assert unsigned.status_code == 400
    assert "must be signed with your passkey" in unsigned.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL
    refused = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.step_up_refused"
    )
    assert refused.actor == f"user:{user.username}"

    signed = decide(client, approval, key.assertion(challenge(client, approval)))
    assert signed.status_code == 302, signed.content.decode()
    assert status_of(approval) == Status.QUEUED
    vote = SignedVerdict.objects.get(approval=approval)
    assert (vote.voter, vote.verdict, vote.digest) == (user, "approve", approval.call.digest)
    assert vote.signature and vote.authenticator_data and vote.client_data and vote.credential_id
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    record = event.payload["step_up_signature"]
    assert record["signature"] == vote.signature and record["digest"] == approval.call.digest
    assert record["verdict"] == "approve" and record["reviewer_id"] == user.pk
    assert record["passkey"] == "test key" and "masked" not in event.payload
    ok, out = verify_audit()
    assert ok and "passkey signatures" in out, out


@pytest.mark.parametrize("sent", ["not json", "[]", '{"id": "AA"}'])
def test_an_unreadable_assertion_is_a_clear_400(sent: str) -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, _ = reviewer_with_key()
    challenge(client, approval)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": sent},
    )
    assert response.status_code == 400 and "missing or unreadable" in response.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_a_passkey_of_another_person_does_not_sign_for_you() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, _ = reviewer_with_key()
    _, _, bobs_key = reviewer_with_key()
    response = decide(client, approval, bobs_key.assertion(challenge(client, approval)))
    assert response.status_code == 403
    assert "This passkey is not one of yours" in response.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert not SignedVerdict.objects.filter(approval=approval).exists()


def test_a_person_without_a_passkey_is_told_to_add_one() -> None:
    approval = ask(step_up_agent(), WRITE)
    user = make_user(unique("rev"), groups=("reviewer",))
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    response = client.post(f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    assert response.status_code == 400 and "you have none" in response.json()["error"]


def test_a_replayed_assertion_is_refused() -> None:
    agent = step_up_agent(approvals=2)
    first = ask(agent, WRITE)
    second = ask(agent, {**WRITE, "path": "other.tf"}, call_id="w2")
    _, client, key = reviewer_with_key()
    used = key.assertion(challenge(client, first))
    sent = client.post(
        f"/approvals/{first.pk}/decide",
        {"action": "approve", "digest": "0" * 64, "assertion": json.dumps(used)},
    )
    assert sent.status_code == 409  # refused (the digest), but the challenge was used up
    # The same assertion again: its one-time challenge is gone.
    again = decide(client, first, used)
    assert again.status_code == 403 and "a replay" in again.content.decode()
    assert decide(client, first, key.assertion(challenge(client, first))).status_code == 302
    # ...and on another call, whose challenge this session did ask for.
    challenge(client, second)
    elsewhere = decide(client, second, used)
    assert elsewhere.status_code == 403
    assert "The passkey signed another challenge" in elsewhere.content.decode()
    assert SignedVerdict.objects.filter(approval=second).count() == 0
    assert status_of(second) == Status.PENDING_APPROVAL


def test_an_assertion_for_another_digest_is_refused() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    from fido2.utils import websafe_decode

    response = client.post(f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    nonce = client.session["harness.step_up"][f"{approval.pk}:approve"]
    assert websafe_decode(response.json()["publicKey"]["challenge"]) == challenge_for(
        approval_id=approval.pk,
        call_id=str(approval.call_id),
        digest=approval.call.digest,
        verdict="approve",
        nonce=nonce,
    )
    other = challenge_for(
        approval_id=approval.pk,
        call_id=str(approval.call_id),
        digest="0" * 64,
        verdict="approve",
        nonce=nonce,
    )
    refused = decide(client, approval, key.assertion(other))
    assert refused.status_code == 403 and "another challenge" in refused.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_an_assertion_made_before_the_call_was_edited_decides_nothing() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    signed = key.assertion(challenge(client, approval))
    editor, editor_client, _ = reviewer_with_key()
    edited = editor_client.post(
        f"/approvals/{approval.pk}/edit",
        {"digest": approval.call.digest, "arguments": json.dumps({**WRITE, "content": "plan"})},
    )
    assert edited.status_code == 302
    # The edit does not approve the new call: a passkey must sign it.
    replacement = ApprovalRequest.objects.get(call__edited_from=approval.call)
    assert status_of(replacement) == Status.PENDING_APPROVAL
    late = decide(client, approval, signed)
    assert late.status_code == 409
    assert f"Already decided by {editor.username}: the call is edited" in late.content.decode()
    moved = client.post(
        f"/approvals/{replacement.pk}/decide",
        {"action": "approve", "digest": replacement.call.digest, "assertion": json.dumps(signed)},
    )
    assert moved.status_code == 403 and "a replay" in moved.content.decode()
    assert status_of(replacement) == Status.PENDING_APPROVAL


def test_a_step_up_deny_is_signed_too() -> None:
    approval = ask(step_up_agent(["approve", "deny"]), WRITE)
    _, client, key = reviewer_with_key()
    assert decide(client, approval, action="deny").status_code == 400
    response = decide(client, approval, key.assertion(challenge(client, approval, "deny")), "deny")
    assert response.status_code == 302
    assert status_of(approval) == Status.DENIED
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.denied")
    assert event.payload["step_up_signature"]["verdict"] == "deny"
    # An approve-only rule leaves the deny as it was: no key.
    plain = ask(step_up_agent(), {**WRITE, "path": "x.tf"})
    assert decide(client, plain, action="deny").status_code == 302
    assert status_of(plain) == Status.DENIED


def test_a_quorum_of_signed_votes_keeps_each_vote() -> None:
    approval = ask(step_up_agent(approvals=2), WRITE)
    for _ in range(2):
        _, client, key = reviewer_with_key()
        assert decide(client, approval, key.assertion(challenge(client, approval))).status_code
    assert status_of(approval) == Status.QUEUED
    assert SignedVerdict.objects.filter(approval=approval).count() == 2
    vote = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="approval.vote")
    assert vote.payload["step_up_signature"]["verdict"] == "approve"
    assert verify_audit()[0]


def test_no_session_grant_stands_in_for_a_passkey() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    challenge(client, approval)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve_session", "digest": approval.call.digest},
    )
    assert (
        response.status_code == 400
        and "cannot be allowed for the rest" in response.content.decode()
    )


def test_a_one_tap_link_opens_the_page_and_decides_nothing() -> None:
    approval = ask(step_up_agent(), WRITE)
    user, client, _ = reviewer_with_key()
    path = urlsplit(links.make_url(approval, user, "approve")).path
    opened = client.get(path)
    assert opened.status_code == 302 and opened["Location"] == f"/approvals/{approval.pk}/"
    page = client.get(opened["Location"]).content.decode()
    assert "a link cannot decide it" in page and "signed with your passkey" in page
    posted = client.post(path, {"digest": approval.call.digest})
    assert posted.status_code == 302
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_the_agent_api_answers_as_for_any_pending_call() -> None:
    fx = step_up_agent()
    approval = ask(fx, WRITE)
    response = Client().get(
        f"/api/v1/calls/{approval.call_id}",
        headers=fx.headers,
    )
    assert response.status_code == 200 and response.json()["status"] == "pending_approval"


# --- What an auditor checks ---------------------------------------------------------------


def rewrite_payload(event: AuditEvent, payload: dict[str, Any]) -> None:
    """An insider holding the database and the audit key: change one event's payload,
    recompute every hash after it and sign the new head. Only the passkey's signature
    (which needs the reviewer's key) still tells."""
    chain = event.chain
    events = list(AuditEvent.objects.filter(chain=chain, seq__gte=event.seq).order_by("seq"))
    prev = event.prev_hash
    with triggers_disabled():
        for row in events:
            body = payload if row.pk == event.pk else row.payload
            canonical = canonical_event(
                chain=chain,
                seq=row.seq,
                kind=row.kind,
                actor=row.actor,
                subject=row.subject,
                payload=body,
                created_at=row.created_at.isoformat(),
            )
            new_hash = chain_hash(prev, canonical)
            sql(
                "UPDATE audit_auditevent SET payload = %s, prev_hash = %s, hash = %s WHERE id = %s",
                [json.dumps(body), prev, new_hash, row.pk],
            )
            prev = new_hash
    head = AuditChain.objects.get(chain=chain)
    AuditChain.objects.filter(chain=chain).update(
        last_hash=prev, head_signature=signing.sign_head(chain, head.last_seq, prev)
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r | {"digest": "0" * 64}, "another challenge"),
        (lambda r: r | {"signature": r["signature"][:-6] + "AAAAAA"}, "does not verify"),
        (lambda r: r | {"reviewer_id": 999999}, "registered to another person"),
        (lambda r: r | {"public_key": "AA"}, "incomplete or unreadable"),
        (lambda r: r | {"authenticator_data": r["authenticator_data"][:-4]}, "unreadable"),
    ],
)
def test_verify_audit_detects_a_tampered_stored_assertion(change: Any, problem: str) -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    assert decide(client, approval, key.assertion(challenge(client, approval))).status_code == 302
    assert verify_audit()[0]
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    payload = dict(event.payload)
    payload["step_up_signature"] = change(dict(payload["step_up_signature"]))
    rewrite_payload(event, payload)
    ok, out = verify_audit()
    assert not ok and "step-up signature" in out and problem in out, out


def test_verify_audit_detects_a_tampered_signed_vote() -> None:
    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    assert decide(client, approval, key.assertion(challenge(client, approval))).status_code == 302
    row = SignedVerdict.objects.get(approval=approval)
    SignedVerdict.objects.filter(pk=row.pk).update(digest="f" * 64)  # the vote row, not the log
    ok, out = verify_audit()
    assert not ok and f"signed vote {row.pk}" in out and "another challenge" in out, out


def test_notifications_offer_the_page_for_a_signed_verdict() -> None:
    approval = ask(step_up_agent(), WRITE)
    user, _, _ = reviewer_with_key()
    made = links.links_for(approval, user)
    assert urlsplit(made["approve"]).path == f"/approvals/{approval.pk}/"
    assert "/approvals/links/" in made["deny"]  # an approve-only rule: deny by link as ever


def test_an_export_proves_its_signed_approvals_on_its_own(tmp_path: Path) -> None:
    from audit.verify import verify_file

    approval = ask(step_up_agent(), WRITE)
    _, client, key = reviewer_with_key()
    assert decide(client, approval, key.assertion(challenge(client, approval))).status_code == 302
    path = tmp_path / "session.jsonl"
    call_command("export_audit", "--session", str(approval.call.session_id), "--output", str(path))
    report = verify_file(path)
    assert report.ok and report.assertions == 1, report.problems
    # The same export with the signature changed (and the hashes recomputed, as someone
    # holding the log could): the chain may be rebuilt, the passkey's signature cannot.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for event in lines:
        if event["kind"] == "call.approved":
            signed = event["payload"]["step_up_signature"]
            signed["signature"] = signed["signature"][:-8] + "AAAAAAAA"
    prev = "0" * 64
    for event in lines:
        event["prev_hash"] = prev
        event["hash"] = prev = chain_hash(
            prev,
            canonical_event(
                **{
                    k: event[k]
                    for k in ("chain", "seq", "kind", "actor", "subject", "payload", "created_at")
                }
            ),
        )
    path.write_text("".join(json.dumps(event) + "\n" for event in lines))
    report = verify_file(path)
    assert [p.what for p in report.problems] == [
        "step-up signature: the signed assertion does not verify: The passkey's signature "
        "does not verify against its public key."
    ]


def test_a_signature_counter_that_goes_back_is_refused_as_a_cloned_key() -> None:
    agent = step_up_agent()
    first = ask(agent, WRITE)
    second = ask(agent, {**WRITE, "path": "b.tf"}, call_id="w2")
    _, client, key = reviewer_with_key()
    key.counter = 41
    assert decide(client, first, key.assertion(challenge(client, first))).status_code == 302
    assert SignedVerdict.objects.get(approval=first).sign_count == 42
    key.counter = 10  # a copy of the key, with its own count
    refused = decide(client, second, key.assertion(challenge(client, second)))
    assert (
        refused.status_code == 403
        and "counter went back (11, after 42)" in refused.content.decode()
    )
    assert status_of(second) == Status.PENDING_APPROVAL


def test_a_previewed_call_binds_the_effect_digest_into_the_signed_challenge() -> None:
    """A previewed command's signature covers the effect shown: a signature over the same
    request without it proves nothing, and verify_audit recomputes it with it."""
    from fido2.utils import websafe_decode

    approval = ask(step_up_agent(), WRITE)
    effect = "e" * 64  # as dispatcher.previews records it on the request
    ApprovalRequest.objects.filter(pk=approval.pk).update(effect_digest=effect)
    approval.refresh_from_db()
    _, client, key = reviewer_with_key()
    response = client.post(f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    nonce = client.session["harness.step_up"][f"{approval.pk}:approve"]
    given = websafe_decode(response.json()["publicKey"]["challenge"])
    fields = {
        "approval_id": approval.pk,
        "call_id": str(approval.call_id),
        "digest": approval.call.digest,
        "verdict": "approve",
        "nonce": nonce,
    }
    assert given == challenge_for(**fields, effect_digest=effect)
    assert given != challenge_for(**fields)
    data = {"action": "approve", "digest": approval.call.digest, "effect_digest": effect}
    unbound = client.post(
        f"/approvals/{approval.pk}/decide",
        data | {"assertion": json.dumps(key.assertion(challenge_for(**fields)))},
    )
    assert unbound.status_code == 403 and "another challenge" in unbound.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL

    signed = client.post(
        f"/approvals/{approval.pk}/decide",
        data | {"assertion": json.dumps(key.assertion(challenge(client, approval)))},
    )
    assert signed.status_code == 302, signed.content.decode()
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert event.payload["step_up_signature"]["effect_digest"] == effect
    ok, out = verify_audit()
    assert ok, out
    # The kept vote is checked against the request's effect digest: another one fails.
    ApprovalRequest.objects.filter(pk=approval.pk).update(effect_digest="f" * 64)
    ok, out = verify_audit()
    assert not ok and "signed vote" in out, out
