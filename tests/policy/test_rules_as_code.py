"""Rules as code: manage.py set_rules / get_rules through the dashboard's service."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import Client

from audit.models import AuditEvent
from dispatcher.policy import profiles
from dispatcher.policy.models import ProfileVersion
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

DOCUMENT: dict[str, Any] = {
    "mode": "standard",
    "allow": ["read_file", "run_command(npm test *)"],
    "ask": [
        "write_file(src/**)",
        {"rule": "run_command(terraform apply *)", "approvals": 2, "group": "sre"},
        {"rule": "delete_file", "approvals": 3},
    ],
    "deny": ["read_file(**/.env)"],
}


def write(tmp_path: Path, document: Any) -> str:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(document) if not isinstance(document, str) else document)
    return str(path)


def get_rules(username: str) -> Any:
    out = StringIO()
    call_command("get_rules", username, stdout=out)
    return json.loads(out.getvalue())


def test_set_then_get_round_trips_the_file_with_quorum_entries(tmp_path: Path) -> None:
    Group.objects.get_or_create(name="sre")
    user = make_user(unique("dev"))
    out = StringIO()
    call_command("set_rules", user.username, write(tmp_path, DOCUMENT), stdout=out)
    assert "profile v2" in out.getvalue()
    assert get_rules(user.username) == DOCUMENT
    # ...and what get_rules printed is accepted back as it is, changing nothing.
    printed = StringIO()
    call_command("get_rules", user.username, stdout=printed)
    again = StringIO()
    call_command("set_rules", user.username, write(tmp_path, printed.getvalue()), stdout=again)
    assert "unchanged" in again.getvalue()
    assert ProfileVersion.objects.filter(user=user).count() == 1


def test_set_rules_is_versioned_and_audited_like_the_dashboard(tmp_path: Path) -> None:
    Group.objects.get_or_create(name="sre")
    user = make_user(unique("dev"))
    call_command("set_rules", user.username, write(tmp_path, DOCUMENT), stdout=StringIO())
    version = ProfileVersion.objects.get(user=user)
    assert version.ask == DOCUMENT["ask"] and version.diff["ask"]["added"] == DOCUMENT["ask"]
    event = AuditEvent.objects.filter(kind="profile.changed", actor="cli").latest("id")
    assert event.payload["user"] == user.username and event.payload["ask"] == DOCUMENT["ask"]
    profile = profiles.profile_for(user)
    assert profile.ask[1] == "run_command(terraform apply *)"
    assert [(q.rule, q.approvals, q.group) for q in profile.quorum] == [
        ("run_command(terraform apply *)", 2, "sre"),
        ("delete_file", 3, ""),
    ]


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({**DOCUMENT, "ask": [{"rule": "write_file", "approvals": 0}]}, "whole number from 1"),
        ({**DOCUMENT, "ask": [{"rule": "write_file", "approvals": "2"}]}, "whole number from 1"),
        ({**DOCUMENT, "ask": [{"rule": "write_file", "approvals": True}]}, "whole number from 1"),
        ({**DOCUMENT, "ask": [{"rule": "write_file", "quorum": 2}]}, "unknown key(s) quorum"),
        ({**DOCUMENT, "ask": [{"approvals": 2}]}, '"rule" must be a rule text'),
        ({**DOCUMENT, "allow": [{"rule": "read_file", "approvals": 2}]}, "only ask rules"),
        (
            {**DOCUMENT, "ask": [{"rule": "write_file", "approvals": 2, "group": "nobody"}]},
            "group 'nobody' does not exist",
        ),
        (
            {**DOCUMENT, "ask": [{"rule": "write_fil(x)", "approvals": 2}]},
            "unknown tool 'write_fil'",
        ),
        ({**DOCUMENT, "mode": "yolo"}, "Unknown mode 'yolo'"),
        ({**DOCUMENT, "extra": 1}, "Unknown key(s) extra"),
        ({**DOCUMENT, "deny": "read_file"}, "'deny' must be a list"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_set_rules_refuses_a_bad_file_naming_the_problem_and_saves_nothing(
    tmp_path: Path, document: Any, problem: str
) -> None:
    Group.objects.get_or_create(name="sre")
    user = make_user(unique("dev"))
    with pytest.raises(CommandError) as raised:
        call_command("set_rules", user.username, write(tmp_path, document), stdout=StringIO())
    assert problem in str(raised.value) and "Nothing was saved" in str(raised.value)
    assert not ProfileVersion.objects.filter(user=user).exists()


def test_set_rules_names_unreadable_files_and_unknown_users(tmp_path: Path) -> None:
    user = make_user(unique("dev"))
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("set_rules", user.username, write(tmp_path, "{nope"), stdout=StringIO())
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("set_rules", user.username, str(tmp_path / "missing.json"))
    with pytest.raises(CommandError, match="No user named"):
        call_command("get_rules", "nobody-at-all")


def test_the_dashboard_editor_shows_and_saves_quorum_lines(tmp_path: Path) -> None:
    Group.objects.get_or_create(name="sre")
    user = make_user(unique("dev"))
    call_command("set_rules", user.username, write(tmp_path, DOCUMENT), stdout=StringIO())
    admin = Client()
    admin.force_login(make_user(unique("admin"), groups=("admin",)))
    page = admin.get(f"/permissions/users/{user.pk}/").content.decode()
    line = '{"rule": "run_command(terraform apply *)", "approvals": 2, "group": "sre"}'
    # The row editor shows the quorum beside the rule, and carries it in the row's extra.
    assert "needs 2 approvals from group sre" in page
    assert "&quot;approvals&quot;: 2" in page
    form = {
        "mode": "standard",
        "allow": "\n".join(DOCUMENT["allow"]),
        "ask": "write_file(src/**)\n" + line,
        "deny": "read_file(**/.env)",
        "version": "2",
    }
    response = admin.post(f"/permissions/users/{user.pk}/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert get_rules(user.username)["ask"] == [
        "write_file(src/**)",
        {"rule": "run_command(terraform apply *)", "approvals": 2, "group": "sre"},
    ]


def test_default_rules_may_hold_quorum_entries_checked_at_start_up() -> None:
    from django.test import override_settings

    from dispatcher.checks import check_rules_in_settings

    quorum = {"rule": "write_file", "approvals": 2}
    with override_settings(HARNESS_DEFAULT_RULES={"ask": [quorum]}):
        assert check_rules_in_settings() == []
        profile = profiles.profile_for(make_user(unique("fresh")))
        assert profile.ask == ("write_file",) and profile.quorum[0].approvals == 2
    with override_settings(HARNESS_DEFAULT_RULES={"allow": [quorum]}):
        [error] = check_rules_in_settings()
        assert error.id == "dispatcher.E031" and "only ask rules" in error.msg
