"""Deleting an OAuth client revokes the agents people approved for it, whichever way it
is deleted: the admin's delete page (one client), its "delete selected" action (many at
once), or a plain `.delete()` (the shell, a user deleted with the clients they own). The
deletion took the agents' links and tokens with it (cascade) and left each agent active,
linked to nothing: out of the signed-in cap's count and of the leaving steps' reach, its
bearer token open to rotation. RFC 7592's DELETE revoked them already."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from oauth2_provider.models import Application

from agentauth.models import AgentClient
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Agent, Status, ToolCall
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import submit_one, unique
from tests.support.oauth import HOOKS, DocumentServer, documents, member, sign_in_agent

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _signed_in(documents: DocumentServer) -> tuple[Agent, str, Application]:
    """An agent a person signed in through a new client, its hooks token working."""
    client_id, answer = sign_in_agent(documents, member(), resource=HOOKS)
    application = Application.objects.get(client_id=client_id)
    agent = AgentClient.objects.get(application=application).agent
    assert _hook(answer["access_token"]).status_code == 200
    return agent, answer["access_token"], application


def _hook(access_token: str) -> Any:
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/a.txt"})
    return Client().post(
        f"{HOOK_URL}?wait=0",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {access_token}"},
    )


def _admin() -> Client:
    """An admin's browser that sends the CSRF token as a browser does (checks enforced)."""
    admin = User.objects.create_superuser(unique("admin"), password="pw-admin")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin)
    return browser


def _csrf(browser: Client, page: str) -> str:
    assert browser.get(page).status_code == 200
    return str(browser.cookies["csrftoken"].value)


def _assert_revoked(agent: Agent, access_token: str, actor: str) -> None:
    assert _hook(access_token).status_code == 401
    assert not Agent.objects.get(pk=agent.pk).is_active
    revoked = AuditEvent.objects.filter(kind="agent.revoked", subject=f"agent:{agent.pk}")
    assert [e.actor for e in revoked] == [actor]


def test_the_admins_delete_page_revokes_the_clients_agents(documents: DocumentServer) -> None:
    agent, access_token, application = _signed_in(documents)
    browser = _admin()
    page = f"/admin/oauth2_provider/application/{application.pk}/delete/"
    csrf = _csrf(browser, page)
    assert browser.post(page, {"post": "yes"}).status_code == 403  # no CSRF token: refused
    assert Agent.objects.get(pk=agent.pk).is_active
    answer = browser.post(page, {"post": "yes", "csrfmiddlewaretoken": csrf})
    assert answer.status_code == 302, answer.content[:500]
    assert not Application.objects.filter(pk=application.pk).exists()
    _assert_revoked(agent, access_token, f"user:{_username(browser)}")


def _username(browser: Client) -> str:
    return str(User.objects.get(pk=browser.session["_auth_user_id"]).username)


def test_the_admins_delete_selected_action_revokes_every_clients_agents(
    documents: DocumentServer,
) -> None:
    signed = [_signed_in(documents) for _ in range(2)]
    browser = _admin()
    page = "/admin/oauth2_provider/application/"
    csrf = _csrf(browser, page)
    answer = browser.post(
        page,
        {
            "action": "delete_selected",
            "_selected_action": [str(application.pk) for _, _, application in signed],
            "post": "yes",
            "csrfmiddlewaretoken": csrf,
        },
    )
    assert answer.status_code == 302, answer.content[:500]
    for agent, access_token, application in signed:
        assert not Application.objects.filter(pk=application.pk).exists()
        _assert_revoked(agent, access_token, f"user:{_username(browser)}")


def test_a_plain_delete_revokes_the_clients_agents(documents: DocumentServer) -> None:
    agent, access_token, application = _signed_in(documents)
    session = agents.start_session(agent=agent)
    queued = submit_one(session, "read_file", {"path": "a.txt"})
    assert queued.status == Status.QUEUED
    application.delete()
    _assert_revoked(agent, access_token, "harness:client-deleted")
    # its call queued for a worker is denied in the same commit, as a void denies them
    queued = ToolCall.objects.get(pk=queued.pk)
    assert queued.status == Status.DENIED, queued.status
    assert f"The agent '{agent.name}' was revoked" in queued.content
    # and a queryset's delete, as a user deleted with the clients they own cascades
    agent, access_token, application = _signed_in(documents)
    Application.objects.filter(pk=application.pk).delete()
    _assert_revoked(agent, access_token, "harness:client-deleted")
