"""Red team: an OAuth client's name is the `client_name` of a metadata document its
author publishes (CIMD, on by default), and it becomes the name of every agent a person
signs in through it (agentauth.services.client_name). A right-to-left override in it was
shown raw on the consent page, the agents pages and the audit pages, where the approval
queue shows the same name through `visible` (e4cf58b made the session page's other
fields visible and left the agent's name raw)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dispatcher import agents
from tests.redteam.test_audit_log_attacks import _api
from tests.support.factories import AgentFixture, make_user, unique
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
__all__ = ["documents"]

NAME = "Claude \u202eedoC"  # reads "Claude Code" backwards once the override acts


def _shown(page: Any) -> str:
    assert page.status_code == 200, page.status_code
    html = str(page.content.decode())
    assert "\u202e" not in html, "the client's name was shown raw"
    assert "\\u202e" in html, "the client's name is not on the page at all"
    return html


def test_a_client_names_right_to_left_override_is_shown_escaped(
    documents: DocumentServer, tmp_path: Any
) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT], name=NAME)
    _, challenge = pkce()
    _shown(signed_in(person).get("/oauth/authorize/", authorize_params(client_id, challenge)))
    sign_in_agent(documents, person, client_id=client_id)
    _shown(signed_in(person).get("/account/agents/"))

    admin = make_user(unique("rt3b-admin"), groups=("admin",))
    agent = person.agents.get()
    assert agent.name == NAME  # the document's name, as is
    _shown(signed_in(admin).get("/agents/"))
    _shown(signed_in(admin).get(f"/agents/{agent.pk}/"))

    # Its sessions on the audit pages (an agent of the same name that calls the API).
    owner = make_user(unique("rt3b-owner"))
    named, token = agents.create_agent(
        owner=owner, name=NAME, workspace=str(tmp_path), actor="test"
    )
    fx = AgentFixture(named, token, owner)
    sid = _api(Client(), "/api/v1/sessions", {"title": "t"}, fx).json()["id"]
    auditor = signed_in(make_user(unique("rt3b-aud"), groups=("auditor",)))
    _shown(auditor.get(f"/audit/sessions/{sid}/"))
    _shown(auditor.get("/audit/sessions/"))
