"""A code binds the resource it was granted for (RFC 8707). A code granted without a
`resource` was exchanged for a token of whichever resource the token request then named:
the hooks API as well as the MCP endpoint. Such a code is for the default resource (MCP,
what a token request naming none gets); any other is invalid_target."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dispatcher.gateways import mcp_http
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    MCP,
    REDIRECT,
    DocumentServer,
    authorize_params,
    code_from,
    consent,
    documents,
    member,
    pkce,
    signed_in,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _code_without_resource(documents: DocumentServer) -> tuple[str, str, str]:
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge)
    del params["resource"]
    query = code_from(consent(signed_in(member()), params))
    return client_id, query["code"][0], verifier


def _exchange(client_id: str, code: str, verifier: str, resource: str | None) -> Any:
    body = {
        "grant_type": "authorization_code",
        "client_id": client_id,
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": "http://127.0.0.1:5555/callback",
    }
    if resource is not None:
        body["resource"] = resource
    return Client().post("/oauth/token/", body)


def test_a_code_granted_without_a_resource_is_for_mcp_only(documents: DocumentServer) -> None:
    refused = _exchange(*_code_without_resource(documents), resource=HOOKS)
    assert refused.status_code == 400, refused.content[:500]
    assert refused.json()["error"] == "invalid_target"
    said = refused.json()["error_description"]
    assert f"granted without a resource, so it is for {MCP} (MCP) only" in said, said
    assert "sign in again naming it" in said.lower()

    for resource in (MCP, None):
        answer = _exchange(*_code_without_resource(documents), resource=resource)
        assert answer.status_code == 200, answer.content[:500]
        access = answer.json()["access_token"]
        assert mcp_http.authenticate(access, "", MCP)[0] is not None
        assert mcp_http.authenticate(access, "", HOOKS) == (None, None)


def test_a_code_granted_for_a_resource_is_exchanged_for_it_only(
    documents: DocumentServer,
) -> None:
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    for granted, asked in ((HOOKS, MCP), (MCP, HOOKS)):
        verifier, challenge = pkce()
        params = authorize_params(client_id, challenge, resource=granted)
        code = code_from(consent(signed_in(member()), params))["code"][0]
        refused = _exchange(client_id, code, verifier, resource=asked)
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_target"
