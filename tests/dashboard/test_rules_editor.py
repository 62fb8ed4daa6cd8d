"""The rules editor: one rule per row (tool from the registry, specifier typed), each row
checked as saving checks it, examples per tool, and entries it does not show kept whole."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.http import QueryDict
from django.test import Client

from audit import kinds
from audit.models import AuditEvent
from dispatcher.policy import editor, rules
from dispatcher.policy.models import PermissionProfile
from tests.policy.conftest import start_session, submit
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(make_user(unique("admin"), groups=("admin",)))
    return client


def rows_post(version: int, *rows: tuple[str, str, str], mode: str = "standard") -> dict[str, Any]:
    return {
        "rows": "1",
        "mode": mode,
        "version": str(version),
        "rule_action": [r[0] for r in rows],
        "rule_tool": [r[1] for r in rows],
        "rule_spec": [r[2] for r in rows],
        "rule_extra": ["" for _ in rows],
        "rule_key": [f"k{i}" for i in range(len(rows))],
    }


def test_the_page_shows_one_row_per_rule_deny_first(
    admin_client: Client, agent: AgentFixture
) -> None:
    PermissionProfile.objects.filter(user=agent.owner).update(
        allow=["read_file"], ask=["write_file(src/**)"], deny=["run_command(rm *)"]
    )
    html = admin_client.get(f"/permissions/users/{agent.owner.pk}/").content.decode()
    actions = re.findall(r'<fieldset class="rule-row action-(\w+)"', html)
    assert actions == ["deny", "ask", "allow", "allow"]  # the last: a blank row to fill
    assert 'value="rm *"' in html and 'value="src/**"' in html
    # The tool is picked from the registry.
    first = html.split('<fieldset class="rule-row action-deny"')[1].split("</fieldset>")[0]
    assert '<option value="run_command" selected>run_command</option>' in first
    assert '<option value="read_file">read_file</option>' in first


def test_saving_rows_versions_and_audits(admin_client: Client, agent: AgentFixture) -> None:
    profile = PermissionProfile.objects.get(user=agent.owner)
    response = admin_client.post(
        f"/permissions/users/{agent.owner.pk}/",
        rows_post(
            profile.version,
            ("allow", "read_file", ""),
            ("deny", "run_command", "rm *"),
            ("allow", "", ""),  # a blank row is ignored
            ("ask", "write_file", "src/**"),
        ),
    )
    assert response.status_code == 302
    profile.refresh_from_db()
    assert (profile.allow, profile.ask, profile.deny) == (
        ["read_file"],
        ["write_file(src/**)"],
        ["run_command(rm *)"],
    )
    event = AuditEvent.objects.filter(kind=kinds.PROFILE_CHANGED).latest("id")
    assert event.payload["version"] == profile.version


def test_a_bad_row_is_named_as_the_server_names_it(
    admin_client: Client, agent: AgentFixture
) -> None:
    profile = PermissionProfile.objects.get(user=agent.owner)
    url = f"/permissions/users/{agent.owner.pk}/"
    response = admin_client.post(
        url, rows_post(profile.version, ("allow", "run_command", "npm test (x"))
    )
    assert response.status_code == 400
    expected = rules.validate_rules({"allow": ["run_command(npm test (x)"]})
    assert expected  # the server refuses it too
    html = response.content.decode()
    row = html.split('id="rule-check-k0"')[1].split("</p>")[0]
    assert expected[0].replace("'", "&#x27;") in row
    assert 'value="npm test (x"' in html  # what was typed is kept
    assert PermissionProfile.objects.get(user=agent.owner).version == profile.version


def test_the_check_endpoint_answers_each_row_with_examples(
    admin_client: Client, agent: AgentFixture
) -> None:
    response = admin_client.post(
        f"/permissions/users/{agent.owner.pk}/check",
        rows_post(
            1,
            ("allow", "run_command", ""),
            ("deny", "run_command", "npm (x"),
            ("ask", "read_file", "src/**"),
        ),
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200 and "HX-Request" in response["Vary"]
    html = response.content.decode()
    assert "<html" not in html and html.count('hx-swap-oob="true"') == 4
    checks = dict(re.findall(r'id="rule-check-(k\d)"[^>]*>(.*?)</p>', html, re.S))
    assert "e.g. <code>npm test *</code>" in checks["k0"]  # examples for the tool
    assert "run_command(npm (x)" in checks["k1"] and "unbalanced" in checks["k1"]
    assert "✓" in checks["k2"]
    assert "1 rule to fix before saving." in html


def test_a_blank_row_comes_from_the_server(admin_client: Client, agent: AgentFixture) -> None:
    url = f"/permissions/users/{agent.owner.pk}/row?action=deny"
    fragment = admin_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert fragment.strip().startswith('<fieldset class="rule-row action-deny"')
    assert admin_client.get(url).status_code == 302  # a page load goes to the editor


def test_entries_with_more_than_a_rule_are_shown_and_kept_whole() -> None:
    quorum = {"rule": "run_command(git push *)", "approvals": 2, "group": "leads"}
    rows = editor.rows_from_lists({"ask": [quorum, "write_file"], "allow": [], "deny": []})
    assert [r.text for r in rows] == ["run_command(git push *)", "write_file"]
    assert rows[0].extra_reads == "needs 2 approvals from group leads"
    # Round trip through a posted form: the hidden extra brings the object back.
    data = QueryDict(mutable=True)
    for row in rows:
        data.update(
            {
                "rule_action": row.action,
                "rule_tool": row.tool,
                "rule_spec": row.specifier,
                "rule_extra": row.extra_json,
                "rule_key": row.key,
            }
        )
    assert editor.lists_from_rows(editor.rows_from_post(data))["ask"] == [quorum, "write_file"]


def test_a_profile_holding_object_entries_still_renders(
    admin_client: Client, agent: AgentFixture
) -> None:
    quorum = {"rule": "run_command(git push *)", "approvals": 2, "group": "leads"}
    PermissionProfile.objects.filter(user=agent.owner).update(ask=[quorum, 7])
    response = admin_client.get(f"/permissions/users/{agent.owner.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "needs 2 approvals from group leads" in html and 'value="git push *"' in html
    assert "&quot;approvals&quot;: 2" in html  # carried in the row's hidden field


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("rule_action", "maybe", "Choose deny, ask or allow"),
        ("rule_extra", "{not json", "are unreadable"),
    ],
)
def test_tampered_rows_are_refused_with_a_reason(
    admin_client: Client, agent: AgentFixture, field: str, value: str, says: str
) -> None:
    form = rows_post(1, ("allow", "read_file", ""))
    form[field] = [value]
    response = admin_client.post(f"/permissions/users/{agent.owner.pk}/", form)
    assert response.status_code == 400 and says in response.content.decode()


def test_backtest_reads_the_rows(admin_client: Client, agent: AgentFixture) -> None:
    session = start_session(agent)
    submit(agent, session, "w1", "write_file", {"path": "src/a.py", "content": ""})
    submit(agent, session, "r1", "read_file", {"path": "README.md"})
    response = admin_client.post(
        f"/permissions/users/{agent.owner.pk}/backtest",
        rows_post(1, ("allow", "write_file", "src/**")),
        headers={"HX-Request": "true"},
    )
    html = response.content.decode()
    assert f"1 of {agent.owner.username}'s last 2 calls would change" in html
    assert 'class="after">allow' in html
