"""Versioned profile edits, and the agent's next call decided under the new rule."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from dispatcher.policy import profiles
from dispatcher.policy.models import PermissionProfile, ProfileVersion
from tests.support.factories import AgentFixture

from .conftest import start_session, submit

pytestmark = pytest.mark.django_db


def test_update_bumps_version_writes_history_and_audits_the_diff(
    agent: AgentFixture, admin: User
) -> None:
    owner = agent.owner
    before = PermissionProfile.objects.get(user=owner).version
    profile = profiles.update_profile(
        user=owner,
        mode="trusted",
        allow=["write_file(src/**)", "  ", "write_file(src/**)"],
        ask=[],
        deny=["run_command(rm *)"],
        actor=admin,
    )
    assert profile.version == before + 1
    assert profile.allow == ["write_file(src/**)"]  # blanks and repeats dropped
    row = ProfileVersion.objects.get(user=owner, version=profile.version)
    assert row.changed_by == admin and row.mode == "trusted"
    assert row.diff == {
        "mode": ["standard", "trusted"],
        "allow": {"added": ["write_file(src/**)"], "removed": []},
        "deny": {"added": ["run_command(rm *)"], "removed": []},
    }
    event = AuditEvent.objects.filter(kind="profile.changed").latest("id")
    assert event.actor == f"user:{admin.username}"
    assert event.subject == f"user:{owner.username}"
    assert event.payload["version"] == profile.version
    assert event.payload["diff"] == row.diff


def test_saving_the_same_profile_again_changes_nothing(agent: AgentFixture, admin: User) -> None:
    kwargs = dict(
        user=agent.owner, mode="standard", allow=["read_file"], ask=[], deny=[], actor=admin
    )
    first = profiles.update_profile(**kwargs)  # type: ignore[arg-type]
    again = profiles.update_profile(**kwargs)  # type: ignore[arg-type]
    assert again.version == first.version
    assert ProfileVersion.objects.filter(user=agent.owner).count() == 1


def test_invalid_rule_is_named_and_nothing_is_saved(agent: AgentFixture, admin: User) -> None:
    version = PermissionProfile.objects.get(user=agent.owner).version
    with pytest.raises(profiles.InvalidProfile) as raised:
        profiles.update_profile(
            user=agent.owner,
            mode="standard",
            allow=["write_file(src/**", "read_file"],
            ask=["bogus_tool(x)"],
            deny=[],
            actor=admin,
        )
    problems = raised.value.problems
    assert any("write_file(src/**" in p for p in problems)
    assert any("bogus_tool" in p for p in problems)
    assert PermissionProfile.objects.get(user=agent.owner).version == version
    assert not ProfileVersion.objects.filter(user=agent.owner).exists()


def test_unknown_mode_is_refused(agent: AgentFixture, admin: User) -> None:
    with pytest.raises(profiles.InvalidProfile, match="Unknown mode 'godmode'"):
        profiles.update_profile(
            user=agent.owner, mode="godmode", allow=[], ask=[], deny=[], actor=admin
        )


def test_stale_edit_is_refused(agent: AgentFixture, admin: User) -> None:
    version = PermissionProfile.objects.get(user=agent.owner).version
    profiles.update_profile(
        user=agent.owner, mode="trusted", allow=[], ask=[], deny=[], actor=admin
    )
    with pytest.raises(profiles.StaleProfile, match="Reload"):
        profiles.update_profile(
            user=agent.owner,
            mode="read_only",
            allow=[],
            ask=[],
            deny=[],
            actor=admin,
            expected_version=version,
        )


def test_next_call_after_a_rule_change_is_decided_under_the_new_rule(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    first = submit(agent, session, "w1", "write_file", {"path": "src/a.py", "content": "x"})
    assert first.status == "pending_approval" and first.decided_by == "mode:standard"

    profile = profiles.update_profile(
        user=agent.owner,
        mode="standard",
        allow=["write_file(src/**)"],
        ask=[],
        deny=[],
        actor=admin,
    )
    second = submit(agent, session, "w2", "write_file", {"path": "src/b.py", "content": "y"})
    assert second.status == "queued"
    assert second.decided_by == "rule:allow:write_file(src/**)"
    assert second.provenance["profile_version"] == profile.version
    event = AuditEvent.objects.get(kind="call.allowed", subject=f"call:{second.pk}")
    assert event.payload["rule"] == "write_file(src/**)"
    assert f"(profile v{profile.version})" in event.payload["reason"]

    profiles.update_profile(
        user=agent.owner,
        mode="standard",
        allow=["write_file(src/**)"],
        ask=[],
        deny=["write_file(src/secret*)"],
        actor=admin,
    )
    third = submit(agent, session, "w3", "write_file", {"path": "src/secret.py", "content": "z"})
    assert third.status == "denied"
    assert third.decided_by == "rule:deny:write_file(src/secret*)"
    assert f"profile v{profile.version + 1}" in third.reason
