"""Red team (rtweb): the admin's change page of an OAuth client.

django-oauth-toolkit's Application admin stayed editable when every other admin became
read-only. Its change page let a staff session point a client people already trust at
a redirect URI of its own, unaudited: the next person to approve that client (its name
and address as always, the new URI under "Returns to") sent their agent's code there, and
the staff session exchanged it for the person's agent token (shown before the fix: the
consent answered 302 to that URI, and /oauth/token/ 200 with an access token)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from oauth2_provider.models import Application

from tests.support.factories import unique
from tests.support.oauth import (
    REDIRECT,
    DocumentServer,
    authorize_params,
    documents,
    member,
    pkce,
    sign_in_agent,
    signed_in,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)

EVIL = "https://evil.example/cb"


def _admin() -> Client:
    root = User.objects.create_superuser(unique("root"), password="pw-root")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(root)
    return browser


def test_an_admin_cannot_point_a_trusted_client_at_its_own_redirect(
    documents: DocumentServer,
) -> None:
    client_id = documents.client(f"/{unique('client')}.json", [REDIRECT], name="Claude Test")
    sign_in_agent(documents, member(), client_id=client_id)  # a client people approve
    application = Application.objects.get(client_id=client_id)
    stored = application.redirect_uris
    browser = _admin()
    url = f"/admin/oauth2_provider/application/{application.pk}/change/"
    page = browser.get(url)
    assert page.status_code == 200  # seen...
    form = {
        "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,
        "client_id": client_id,
        "user": "",
        "redirect_uris": EVIL,
        "post_logout_redirect_uris": "",
        "allowed_origins": "",
        "client_type": application.client_type,
        "authorization_grant_type": application.authorization_grant_type,
        "client_secret": "chosen-secret",
        "hash_client_secret": "on",
        "name": application.name,
        "algorithm": application.algorithm,
    }
    assert browser.post(url, form).status_code == 403  # ...not changed
    application.refresh_from_db()
    assert application.redirect_uris == stored
    # The next person to approve the client is sent back to its own URI, never EVIL.
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge, redirect_uri=EVIL)
    answer = signed_in(member()).get("/oauth/authorize/", params)
    assert not str(answer.get("Location") or "").startswith(EVIL)
    assert answer.status_code != 200 or b"evil.example" not in answer.content


def test_the_client_page_shows_no_secret_and_adding_a_client_still_works(
    documents: DocumentServer,
) -> None:
    secret = "unhashed-" + unique("s")
    application = Application.objects.create(
        name="Manual",
        client_type="confidential",
        authorization_grant_type="authorization-code",
        redirect_uris=REDIRECT,
        client_secret=secret,
        hash_client_secret=False,
    )
    browser = _admin()
    page = browser.get(f"/admin/oauth2_provider/application/{application.pk}/change/")
    assert page.status_code == 200
    assert secret not in page.content.decode()
    added = browser.get("/admin/oauth2_provider/application/add/")
    assert added.status_code == 200
    assert "client_secret" in added.context["adminform"].form.fields


def test_an_admin_adds_no_client_under_a_metadata_documents_url() -> None:
    """A client_id that is a URL is a metadata document's, read from the document on the
    first consent; one added here was never read, and its consent page showed that URL's
    host under "Identified by" with the admin's redirect URIs. Refused on the add page."""
    browser = _admin()
    url = "/admin/oauth2_provider/application/add/"
    assert browser.get(url).status_code == 200
    trusted = "https://claude.ai/oauth/claude-code-client-metadata"
    form = {
        "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,
        "client_id": trusted,
        "user": "",
        "redirect_uris": EVIL,
        "post_logout_redirect_uris": "",
        "allowed_origins": "",
        "client_type": "public",
        "authorization_grant_type": "authorization-code",
        "client_secret": "",
        "name": "Claude Code",
        "algorithm": "",
    }
    refused = browser.post(url, form)
    assert refused.status_code == 200 and "metadata document" in refused.content.decode()
    assert not Application.objects.filter(client_id=trusted).exists()
    added = browser.post(url, form | {"client_id": "manual-client-1"})
    assert added.status_code == 302, added.content[:500]
    assert Application.objects.filter(client_id="manual-client-1").exists()
