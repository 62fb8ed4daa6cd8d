"""/permissions/: admins only, editing with named errors, simulator and backtest partials, revoke."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dispatcher.admission import context_of
from dispatcher.policy import grants, profiles
from dispatcher.policy.models import PermissionProfile, SessionGrant
from tests.support.factories import AgentFixture, make_user, unique

from .conftest import start_session, submit

pytestmark = pytest.mark.django_db


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_only_admins_see_permissions(agent: AgentFixture, reviewer: User, admin: User) -> None:
    owner = agent.owner
    urls = ["/permissions/", f"/permissions/users/{owner.pk}/"]
    for url in urls:
        assert _client(reviewer).get(url).status_code == 403
        assert Client().get(url, headers=agent.headers).status_code == 302  # to the login page
        assert _client(admin).get(url).status_code == 200
    superuser = User.objects.create_superuser(unique("root"), password="x")
    assert _client(superuser).get("/permissions/").status_code == 200
    post = Client().post(
        f"/permissions/users/{owner.pk}/", {"mode": "trusted"}, headers=agent.headers
    )
    assert post.status_code == 302 and PermissionProfile.objects.get(user=owner).mode == "standard"


def test_index_lists_users_with_mode_counts_and_agents(agent: AgentFixture, admin: User) -> None:
    profiles.update_profile(
        user=agent.owner,
        mode="trusted",
        allow=["read_file"],
        ask=[],
        deny=["run_command(rm *)"],
        actor=admin,
    )
    page = _client(admin).get("/permissions/").content.decode()
    row = page[page.index(f'id="user-{agent.owner.pk}"') :].split("</tr>")[0]
    assert agent.owner.username in row and "trusted" in row and agent.agent.name in row
    assert "<td>1</td><td>0</td><td>1</td>" in row


def test_edit_saves_a_version_and_invalid_rules_rerender_naming_the_pattern(
    agent: AgentFixture, admin: User
) -> None:
    client, owner = _client(admin), agent.owner
    url = f"/permissions/users/{owner.pk}/"
    version = PermissionProfile.objects.get(user=owner).version
    bad = client.post(
        url,
        {
            "mode": "standard",
            "allow": "write_file(src/**\nread_file",
            "ask": "",
            "deny": "",
            "version": version,
        },
    )
    assert bad.status_code == 400
    body = bad.content.decode()
    assert "write_file(src/**" in body and "Nothing was saved" in body
    assert "read_file</textarea>" in body  # what the admin typed is kept
    good = client.post(
        url,
        {
            "mode": "trusted",
            "allow": "write_file(src/**)\n",
            "ask": "",
            "deny": "run_command(rm *)",
            "version": version,
        },
        follow=True,
    )
    assert good.status_code == 200
    profile = PermissionProfile.objects.get(user=owner)
    assert (profile.mode, profile.allow, profile.deny) == (
        "trusted",
        ["write_file(src/**)"],
        ["run_command(rm *)"],
    )
    body = good.content.decode()
    assert f"Saved {owner.username}&#x27;s profile as v{profile.version}" in body
    assert "+ deny: run_command(rm *)" in body and admin.username in body
    stale = client.post(
        url, {"mode": "locked", "allow": "", "ask": "", "deny": "", "version": version}
    )
    assert stale.status_code == 409


def test_simulate_partial_shows_saved_and_proposed_decisions(
    agent: AgentFixture, admin: User
) -> None:
    response = _client(admin).post(
        f"/permissions/users/{agent.owner.pk}/simulate",
        {
            "tool": "write_file",
            "arguments": '{"path": "src/a.py", "content": "<script>x</script>"}',
            "mode": "standard",
            "allow": "write_file(src/**)",
            "ask": "",
            "deny": "",
        },
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert "mode:standard" in body and "rule:allow:write_file(src/**)" in body
    assert "<script>" not in body and "&lt;script&gt;" in body


def test_simulate_a_past_call_and_bad_json(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "x.txt", "content": ""})
    client = _client(admin)
    url = f"/permissions/users/{agent.owner.pk}/simulate"
    past = client.post(url, {"call": str(call.pk)}, headers={"HX-Request": "true"}).content.decode()
    assert "mode:standard" in past and str(call.pk) in past
    bad = client.post(url, {"tool": "read_file", "arguments": "{nope"}).content.decode()
    assert "not valid JSON" in bad
    other = make_user(unique("other"))
    foreign = client.post(f"/permissions/users/{other.pk}/simulate", {"call": str(call.pk)})
    assert "No call" in foreign.content.decode()


def test_backtest_partial_lists_changes(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    submit(agent, session, "w1", "write_file", {"path": "src/a.py", "content": ""})
    response = _client(admin).post(
        f"/permissions/users/{agent.owner.pk}/backtest",
        {"mode": "standard", "allow": "write_file(src/**)", "ask": "", "deny": ""},
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert "1 of " in body and "last 1 call would change" in body
    assert 'class="before">ask' in body and 'class="after">allow' in body


def test_revoke_from_the_page(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "a.txt", "content": ""})
    grant = grants.grant_for_session(ctx=context_of(call), actor=admin)
    client = _client(admin)
    assert "write_file(/a.txt)" in client.get("/permissions/").content.decode()
    assert "write_file(/a.txt)" in client.get(f"/permissions/sessions/{session}/").content.decode()
    response = client.post(f"/permissions/grants/{grant.pk}/revoke", headers={"HX-Request": "true"})
    assert response.status_code == 200 and "revoked" in response.content.decode()
    assert SessionGrant.objects.get(pk=grant.pk).revoked_by == admin
    assert "write_file(/a.txt)" not in client.get("/permissions/").content.decode()
