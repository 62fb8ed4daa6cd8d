"""Passkeys in a real browser: Chromium's virtual authenticator (the DevTools WebAuthn
domain, through Playwright's CDP session) against a live daphne + Celery worker. A
reviewer registers a passkey through allauth.mfa, signs in with it (no password), and
approves a step-up call by touching it; the audit log then verifies."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from approvals import services
from approvals.models import ApprovalRequest, SignedVerdict
from audit.models import AuditEvent
from dispatcher.policy import profiles
from tests.support.browser import login
from tests.support.factories import make_agent, make_user, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.browser, pytest.mark.live]


def virtual_authenticator(context: Any, page: Any) -> tuple[Any, str]:
    """A platform authenticator that holds discoverable credentials and answers every
    request as if a person touched it and verified (Chromium's DevTools WebAuthn domain)."""
    cdp = context.new_cdp_session(page)
    cdp.send("WebAuthn.enable")
    added = cdp.send(
        "WebAuthn.addVirtualAuthenticator",
        {
            "options": {
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            }
        },
    )
    return cdp, str(added["authenticatorId"])


def test_register_sign_in_with_a_passkey_and_approve_a_step_up_call(
    browser: Any, live_stack: LiveStack, live_db: None
) -> None:
    base = live_stack.url.replace("127.0.0.1", "localhost")  # WebAuthn wants a domain
    username = unique("signer")
    make_user(username, groups=("reviewer",))
    fx = make_agent(mode="standard")
    rule = {"rule": "write_file(prod.tf)", "step_up": True}
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=[], ask=[rule], deny=[], actor="t"
    )

    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    cdp, authenticator = virtual_authenticator(context, page)
    try:
        # Register: allauth.mfa's own page, the browser's navigator.credentials.create.
        login(page, base, username)
        page.goto(f"{base}/accounts/2fa/webauthn/add/")
        # allauth.mfa asks for the password again before a factor is added.
        page.fill("input[name=password]", "pw-" + username)
        page.click("main button[type=submit]")
        page.wait_for_url(lambda url: "/webauthn/add" in url and "reauthenticate" not in url)
        page.fill("input[name=name]", "virtual key")
        page.check("input[name=passwordless]")
        page.click("#mfa_webauthn_add")
        page.wait_for_url(lambda url: "/webauthn/add" not in url)
        credentials = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})
        assert len(credentials["credentials"]) == 1
        page.goto(f"{base}/accounts/me/")
        assert "virtual key" in page.locator("#second-factors").inner_text()

        # Sign out, then in with the passkey alone.
        page.click("form.logout button[type=submit]")
        page.wait_for_url(lambda url: "/accounts/login" in url or "/logout" in url)
        page.goto(f"{base}/accounts/login/")
        page.click("#passkey_login")
        page.wait_for_url(lambda url: "/accounts/login" not in url)
        assert page.locator("header .me").inner_text() == username

        # A step-up call asks; approving it signs with the passkey.
        client = live_stack.client(fx)
        session = client.post("/api/v1/sessions", json={"title": "step-up"}).json()
        call = {"id": "w1", "name": "write_file", "arguments": {"path": "prod.tf", "content": "x"}}
        sent = client.post(f"/api/v1/sessions/{session['id']}/calls", json={"calls": [call]})
        assert sent.json()["calls"][0]["status"] == "pending_approval"
        approval = ApprovalRequest.objects.get(call_id=sent.json()["calls"][0]["id"])
        page.goto(f"{base}/approvals/{approval.pk}/")
        form = page.locator("form.decide.step-up")
        assert "signed with your passkey" in form.inner_text()
        form.locator("button.approve").click()
        page.wait_for_url(f"{base}/approvals/")
        assert "Approved write_file." in page.locator("main").inner_text()
        signed = SignedVerdict.objects.get(approval=approval)
        assert signed.voter.username == username and signed.verdict == "approve"
        event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
        assert event.payload["step_up_signature"]["passkey"] == "virtual key"
        out = StringIO()
        call_command("verify_audit", "--session", str(approval.call.session_id), stdout=out)
        assert "1 passkey signatures" in out.getvalue()

        # The call changes while the page is open: the signature decides nothing, and
        # the page says why.
        call["arguments"] = {"path": "prod.tf", "content": "y"}
        call["id"] = "w2"
        sent = client.post(f"/api/v1/sessions/{session['id']}/calls", json={"calls": [call]})
        second = ApprovalRequest.objects.get(call_id=sent.json()["calls"][0]["id"])
        page.goto(f"{base}/approvals/{second.pk}/")
        editor = make_user(unique("editor"), groups=("reviewer",))
        services.edit(
            approval_id=second.pk,
            user=editor,
            digest=second.call.digest,
            arguments={"path": "prod.tf", "content": "z"},
        )
        page.locator("form.decide.step-up button.approve").click()
        page.locator("#decision-status .notice.bad").wait_for()
        shown = page.locator("#decision-status").inner_text()
        assert f"Already decided by {editor.username}: the call is edited." in shown
        assert not SignedVerdict.objects.filter(approval=second).exists()
        assert not [e for e in errors if "Content Security Policy" in e], errors
    finally:
        context.close()
