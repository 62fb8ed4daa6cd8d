"""Red team (rt2web): the admin's add page of an OAuth client refused a client_id with
"://" in it (a URL names a client metadata document, read from the document on the first
consent), but not one that reads as that URL on the consent page's "Identified by" line:
`https：//claude.ai/...` (a fullwidth colon), `https:∕∕claude.ai/...` (division
slashes), `//claude.ai/...` (a scheme-relative URL: urlsplit reads its host). A client_id
an admin types is printable ASCII (RFC 6749's VSCHAR, no space at its ends) and holds no
`//`."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from oauth2_provider.models import Application

from tests.support.factories import unique

pytestmark = pytest.mark.django_db

URL = "/admin/oauth2_provider/application/add/"


def _admin() -> Client:
    root = User.objects.create_superuser(unique("root"), password="pw-root")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(root)
    assert browser.get(URL).status_code == 200
    return browser


def _form(browser: Client, client_id: str) -> dict[str, str]:
    return {
        "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,
        "client_id": client_id,
        "user": "",
        "redirect_uris": "https://evil.example/cb",
        "post_logout_redirect_uris": "",
        "allowed_origins": "",
        "client_type": "public",
        "authorization_grant_type": "authorization-code",
        "client_secret": "",
        "name": "Claude Code",
        "algorithm": "",
    }


@pytest.mark.parametrize(
    "client_id",
    [
        "https\uff1a//claude.ai/oauth/claude-code-client-metadata",
        "https:\u2215\u2215claude.ai/oauth/claude-code-client-metadata",
        "https:\u200b//claude.ai/oauth/claude-code-client-metadata",
        "//claude.ai/oauth/claude-code-client-metadata",
    ],
)
def test_an_admin_adds_no_client_whose_id_reads_as_a_documents_url(client_id: str) -> None:
    browser = _admin()
    refused = browser.post(URL, _form(browser, client_id))
    assert refused.status_code == 200, refused.status_code
    assert "metadata document" in refused.content.decode()
    assert not Application.objects.filter(client_id=client_id).exists()


def test_an_ordinary_client_id_is_still_added() -> None:
    browser = _admin()
    added = browser.post(URL, _form(browser, "manual-client.v2"))
    assert added.status_code == 302, added.content[:500]
    assert Application.objects.filter(client_id="manual-client.v2").exists()
