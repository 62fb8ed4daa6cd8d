"""verify_audit and a credential id registered again by another person after its owner
removed the passkey: the add page refuses only an id registered now, so once Alice
removed her passkey, Mallory registered Alice's credential id (public: the audit log
carries it) with her own key through allauth's own "Add a passkey", and verify_audit
then reported Alice's genuine, earlier signature BAD ("the recorded public key is not
the key registered under this credential id"). A row under that id that is not the
reviewer's says nothing of the reviewer's key: the recorded key is read, as for a
passkey removed."""

from __future__ import annotations

from typing import Any

import pytest
from allauth.mfa.models import Authenticator

from tests.approvals.conftest import ask
from tests.approvals.test_step_up import HOST, WRITE, step_up_agent, verify_audit
from tests.redteam.test_rtstep_attacks import (
    add_on_own_page,
    keyed_reviewer,
    own_page,
    signed_approve,
)
from tests.support.factories import make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db


def test_an_id_registered_again_by_another_person_leaves_the_old_signature_good(
    settings: Any,
) -> None:
    settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True  # the test client's http origin
    approval = ask(step_up_agent(), WRITE)
    alice, alice_browser, alice_key = keyed_reviewer()
    assert signed_approve(alice_browser, approval, alice_key).status_code == 302
    assert verify_audit()[0]
    # Alice removes her passkey (a lost phone): her signature stays in the log.
    Authenticator.objects.filter(user=alice, type=Authenticator.Type.WEBAUTHN).delete()
    ok, out = verify_audit()
    assert ok, out
    # Mallory registers Alice's credential id, with her own key, on allauth's own page.
    mallory = make_user(unique("mallory"), groups=("reviewer",))
    copied = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    copied.credential_id = alice_key.credential_id
    added = add_on_own_page(own_page(mallory), copied)
    assert added.status_code == 302, added.content[:500]
    assert Authenticator.objects.filter(user=mallory, type=Authenticator.Type.WEBAUTHN).exists()
    ok, out = verify_audit()
    assert ok, out
    assert "BAD" not in out


def test_a_swapped_key_under_the_reviewers_own_id_is_still_bad(settings: Any) -> None:
    """The reviewer's own row under the id, with another key than the record's: BAD, as
    before (a record whose key was swapped)."""
    from fido2.cose import ES256
    from fido2.utils import websafe_encode

    from approvals.models import SignedVerdict
    from audit.assertions import _cose_bytes, problem_in, registered_keys

    approval = ask(step_up_agent(), WRITE)
    alice, alice_browser, alice_key = keyed_reviewer()
    assert signed_approve(alice_browser, approval, alice_key).status_code == 302
    row = SignedVerdict.objects.get(voter=alice)
    stored = {
        "approval": row.approval_id,
        "call_id": str(row.approval.call_id),
        "digest": row.digest,
        "verdict": row.verdict,
        "nonce": row.nonce,
        "rp_id": row.rp_id,
        "reviewer_id": row.voter_id,
        "public_key": row.public_key,
        "effect_digest": row.approval.effect_digest,
        "credential_id": row.credential_id,
        "authenticator_data": row.authenticator_data,
        "client_data": row.client_data,
        "signature": row.signature,
    }
    assert problem_in(stored, registered_keys()) is None
    stranger = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    cose = ES256.from_cryptography_key(stranger.key.public_key())
    swapped = {**stored, "public_key": websafe_encode(_cose_bytes(cose))}
    assert "not the key registered" in (problem_in(swapped, registered_keys()) or "")
