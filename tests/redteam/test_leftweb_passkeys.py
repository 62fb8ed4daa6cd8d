"""Passkeys registered under one credential id by two people, before a registration of a
known credential id was refused (allauth.mfa added it to whoever asked): verify_audit
looked the signing key up by credential id only, found the other person's row (the
last one read) and reported the genuine signature BAD ("the recorded public key is not
the key registered under this credential id"). The signer's own row is the one read."""

from __future__ import annotations

import pytest

from approvals.models import SignedVerdict
from tests.approvals.conftest import ask
from tests.approvals.test_step_up import HOST, WRITE, step_up_agent, verify_audit
from tests.redteam.test_rtstep_attacks import browser, keyed_reviewer, signed_approve
from tests.support.factories import make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db


def test_two_people_sharing_a_credential_id_both_have_their_signatures_verified() -> None:
    fx = step_up_agent()
    alices_call = ask(fx, WRITE, call_id="a1")
    mallorys_call = ask(fx, {**WRITE, "path": "other.tf"}, call_id="m1")
    alice, alice_browser, alice_key = keyed_reviewer()
    # The second row, as an old version stored it (the add page refuses it now): the
    # same credential id, another person, another key.
    mallory = make_user(unique("mallory"), groups=("reviewer",))
    mallorys_key = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    mallorys_key.credential_id = alice_key.credential_id
    mallorys_key.register(mallory)
    assert signed_approve(alice_browser, alices_call, alice_key).status_code == 302
    assert signed_approve(browser(mallory), mallorys_call, mallorys_key).status_code == 302
    assert SignedVerdict.objects.filter(voter=alice).count() == 1
    assert SignedVerdict.objects.filter(voter=mallory).count() == 1
    ok, out = verify_audit()
    assert ok, out
    assert "BAD" not in out


def test_a_record_naming_a_registered_id_with_a_key_of_no_row_is_still_bad() -> None:
    """Keyed by (credential id, key): a record whose key was swapped for one nobody
    registered under that id is not checked against the key it carries."""
    from fido2.utils import websafe_encode

    from audit.assertions import problem_in, registered_keys

    approval = ask(step_up_agent(), WRITE)
    alice, alice_browser, alice_key = keyed_reviewer()
    other = make_user(unique("bob"), groups=("reviewer",))
    shared = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    shared.credential_id = alice_key.credential_id
    shared.register(other)
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
    keys = registered_keys()
    assert problem_in(stored, keys) is None
    # Bob's key (registered under the same id) named as the signer: not his signature.
    from audit.assertions import _cose_bytes

    bobs = next(r for r in keys.rows(alice_key.credential_id) if r.user_id == other.pk)
    forged = {**stored, "public_key": websafe_encode(_cose_bytes(bobs.credential.public_key))}
    assert problem_in(forged, keys) is not None
    # A key no one registered under that id, named with Alice's id: refused as before.
    stranger = SoftPasskey(rp_id=HOST, origin=f"http://{HOST}")
    from fido2.cose import ES256

    cose = ES256.from_cryptography_key(stranger.key.public_key())
    swapped = {**stored, "public_key": websafe_encode(_cose_bytes(cose))}
    assert "not the key registered" in (problem_in(swapped, keys) or "")
