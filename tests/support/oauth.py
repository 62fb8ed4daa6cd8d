"""OAuth test parts: a client metadata document served over https from another loopback
port (a real TLS server with a test CA, trustme), PKCE, and the steps of a sign-in through
Django's test client (consent, code, token; harness-hook's client and a device code)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib
import json
import secrets
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import trustme
from django.contrib.auth.models import User
from django.test import Client, override_settings

from teams.services import add_member, create_team
from tests.support.factories import make_user, unique

if TYPE_CHECKING:
    from teams.models import Team

MCP = "http://testserver/mcp/"
HOOKS = "http://testserver/api/v1/hooks/"
REDIRECT = "http://127.0.0.1/callback"  # any port: a native client's loopback redirect


@dataclass
class DocumentServer:
    """Serves JSON documents by path over https on 127.0.0.1 (`documents` may change)."""

    port: int
    ca_file: Path
    documents: dict[str, Any] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def client(self, path: str, redirect_uris: list[str], name: str = "Test Client") -> str:
        """Publish a client metadata document at `path`; its URL (the client_id)."""
        client_id = self.url(path)
        self.documents[path] = {
            "client_id": client_id,
            "client_name": name,
            "client_uri": self.url("/"),
            "redirect_uris": redirect_uris,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        return client_id


@contextmanager
def document_server(tmp: Path) -> Iterator[DocumentServer]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    ca_file = tmp / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server_box: dict[str, DocumentServer] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            docs = server_box["s"]
            docs.fetched.append(self.path)
            document = docs.documents.get(self.path)
            if isinstance(document, dict) and "$redirect" in document:  # a 302 elsewhere
                self.send_response(302)
                self.send_header("Location", str(document["$redirect"]))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps(document).encode() if document is not None else b"{}"
            self.send_response(200 if document is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    server_box["s"] = DocumentServer(port=httpd.server_address[1], ca_file=ca_file)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_box["s"]
    finally:
        httpd.shutdown()
        httpd.server_close()


def pkce() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# --- A sign-in through Django's test client ---------------------------------------------


@pytest.fixture
def documents(tmp_path: Path) -> Iterator[DocumentServer]:
    """A document server the outbound door may reach (its host allowed, its CA trusted)."""
    with (
        document_server(tmp_path) as server,
        override_settings(
            HARNESS_OUTBOUND_ALLOW=["127.0.0.1"], HARNESS_OUTBOUND_CA_FILE=str(server.ca_file)
        ),
    ):
        yield server


def signed_in(user: User, *, recently: bool = True) -> Client:
    """A browser signed in as `user`: just now (allauth's record of a password sign-in,
    which approving an agent needs within 5 minutes), or, with recently=False, long ago
    (Django's force_login alone, which allauth keeps no record of)."""
    client = Client()
    client.force_login(user)
    if recently:
        just_signed_in(client, user)
    return client


def just_signed_in(client: Client, user: User, method: str = "password") -> None:
    """Record in the client's session that `user` signed in now, as allauth's login does
    (record_authentication, read back by identity.services.signed_in_recently)."""
    from allauth.account.internal.flows.login import record_authentication
    from django.test import RequestFactory

    request = RequestFactory().get("/")
    request.session = client.session
    request.user = user
    record_authentication(request, user, method=method)
    request.session.save()


def member(team: Team | None = None) -> User:
    """A person who is a member of `team` (a new one by default)."""
    person = make_user(unique("dev"))
    team = team or create_team(name=unique("team"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    return person


def authorize_params(client_id: str, challenge: str, **extra: str) -> dict[str, str]:
    return {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": "http://127.0.0.1:5555/callback",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st-1",
        "resource": MCP,
        **extra,
    }


def consent(
    browser: Client, params: dict[str, str], mode: str = "standard", team: Team | None = None
) -> Any:
    page = browser.get("/oauth/authorize/", params)
    assert page.status_code == 200, page.content[:500]
    form = {k: v for k, v in params.items()}
    chosen = team or page.context["teams"][0]
    form.update(
        scope=" ".join(page.context["scopes"]), allow="Authorize", mode=mode, team=str(chosen.pk)
    )
    return browser.post("/oauth/authorize/", form)


def code_from(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 302, response.content[:500]
    return parse_qs(urlsplit(response["Location"]).query)


def token(client_id: str, code: str, verifier: str, resource: str = MCP) -> Any:
    return Client().post(
        "/oauth/token/",
        {
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": "http://127.0.0.1:5555/callback",
            "resource": resource,
        },
    )


def refresh(client_id: str, refresh_token: str) -> Any:
    return Client().post(
        "/oauth/token/",
        {"grant_type": "refresh_token", "client_id": client_id, "refresh_token": refresh_token},
    )


def authorization_code(
    documents: DocumentServer,
    person: User | None = None,
    *,
    client_id: str = "",
    team: Team | None = None,
    **extra: str,
) -> tuple[str, str, str]:
    """(client_id, code, verifier): `person` (a new member by default) consents, for `team`
    (the first offered by default), to a client (a new document, "Claude Test", by default)."""
    client_id = client_id or documents.client(
        f"/{unique('client')}.json", [REDIRECT], name="Claude Test"
    )
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge, **extra)
    query = code_from(consent(signed_in(person or member()), params, team=team))
    return client_id, query["code"][0], verifier


def sign_in_agent(
    documents: DocumentServer,
    person: User,
    *,
    client_id: str = "",
    team: Team | None = None,
    **extra: str,
) -> tuple[str, dict[str, Any]]:
    """(client_id, the token answer): `person` signs an agent in, as authorization_code,
    its code exchanged for the resource it was asked for."""
    client_id, code, verifier = authorization_code(
        documents, person, client_id=client_id, team=team, **extra
    )
    answer = token(client_id, code, verifier, resource=extra.get("resource", MCP))
    assert answer.status_code == 200, answer.content
    return client_id, answer.json()


def harness_hook_client() -> None:
    """The public client `harness-hook login` signs in with, made by agentauth's migration
    0002 itself (its step is a get_or_create): a test database flushed by a live test
    before has lost the rows the migrations made."""
    from django.apps import apps

    step = importlib.import_module("agentauth.migrations.0002_harness_hook_client")
    step.create(apps, None)


@pytest.fixture
def no_wrong_codes_counted() -> Iterator[None]:
    """The device page counts wrong codes in the cache by user id, and SQLite gives a
    rolled-back test's ids again: a test that locks someone out starts with no counts and
    leaves none, so the lock never falls on another test's person."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def pending_device_code() -> str:
    """A user code as `harness-hook login` asks for one, pending (no one has approved it)."""
    harness_hook_client()
    answer = Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": "harness-hook", "resource": HOOKS}),
        content_type="application/x-www-form-urlencoded",
    )
    assert answer.status_code == 200, answer.content
    return str(answer.json()["user_code"])
