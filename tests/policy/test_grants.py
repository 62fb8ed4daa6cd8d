"""Session grants: narrow, scoped to their session, below deny rules and guards, revocable."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from dispatcher.admission import context_of
from dispatcher.models import AgentSession
from dispatcher.policy import grants, profiles
from dispatcher.policy.models import SessionGrant
from floor.errors import ServiceError
from tests.support.factories import AgentFixture

from .conftest import start_session, submit

pytestmark = pytest.mark.django_db


def test_narrow_rule_names_exactly_the_command_or_path(agent: AgentFixture) -> None:
    session = start_session(agent)
    cases = [
        ("run_command", {"argv": ["npm", "test"]}, "run_command(npm test)"),
        ("run_command", {"argv": ["ls", "*.py", "a b"]}, "run_command(ls '[*].py' 'a b')"),
        ("write_file", {"path": "src/app.py", "content": ""}, "write_file(src/app.py)"),
        ("write_file", {"path": "./notes.txt", "content": ""}, "write_file(/notes.txt)"),
        ("write_file", {"path": "a/*.txt", "content": ""}, "write_file(a/\\*.txt)"),
    ]
    for index, (name, arguments, expected) in enumerate(cases):
        call = submit(agent, session, f"c{index}", name, arguments)
        assert grants.narrow_rule(context_of(call)) == expected


def test_narrow_command_rule_does_not_allow_more_arguments(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    call = submit(agent, session, "c1", "run_command", {"argv": ["npm", "test"]})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    more = submit(agent, session, "c2", "run_command", {"argv": ["npm", "test", "--", "x"]})
    assert more.status == "pending_approval"
    same = submit(agent, session, "c3", "run_command", {"argv": ["npm", "test"]})
    assert same.status == "queued" and same.decided_by == "grant:run_command(npm test)"


def test_grant_allows_only_in_its_own_session_and_stops_when_revoked(
    agent: AgentFixture, admin: User
) -> None:
    session, other = start_session(agent), start_session(agent)
    first = submit(agent, session, "w1", "write_file", {"path": "src/app.py", "content": "1"})
    grant = grants.grant_for_session(ctx=context_of(first), actor=admin)
    assert grant.rule == "write_file(src/app.py)"
    created = AuditEvent.objects.get(kind="grant.created", subject=f"grant:{grant.pk}")
    assert created.payload["rule"] == grant.rule and str(created.session_id) == session

    again = submit(agent, session, "w2", "write_file", {"path": "src/app.py", "content": "2"})
    assert again.status == "queued" and again.decided_by == "grant:write_file(src/app.py)"
    elsewhere = submit(agent, other, "w2", "write_file", {"path": "src/app.py", "content": "2"})
    assert elsewhere.status == "pending_approval"
    sibling = submit(agent, session, "w3", "write_file", {"path": "src/other.py", "content": ""})
    assert sibling.status == "pending_approval"

    assert grants.revoke_grant(grant_id=grant.pk, actor=admin) is True
    assert grants.revoke_grant(grant_id=grant.pk, actor=admin) is False  # idempotent
    assert AuditEvent.objects.filter(kind="grant.revoked", subject=f"grant:{grant.pk}").count() == 1
    after = submit(agent, session, "w4", "write_file", {"path": "src/app.py", "content": "3"})
    assert after.status == "pending_approval"


def test_deny_rule_beats_a_grant(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "src/app.py", "content": "1"})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    profiles.update_profile(
        user=agent.owner,
        mode="standard",
        allow=[],
        ask=[],
        deny=["write_file(src/**)"],
        actor=admin,
    )
    again = submit(agent, session, "w2", "write_file", {"path": "src/app.py", "content": "2"})
    assert again.status == "denied" and again.decided_by == "rule:deny:write_file(src/**)"


def test_locked_mode_is_not_widened_by_a_grant(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "src/app.py", "content": "1"})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    profiles.update_profile(user=agent.owner, mode="locked", allow=[], ask=[], deny=[], actor=admin)
    again = submit(agent, session, "w2", "write_file", {"path": "src/app.py", "content": "2"})
    assert again.status == "denied" and again.decided_by == "mode:locked"


def test_guards_still_run_after_a_grant(agent: AgentFixture, admin: User, tmp_path: Path) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "link/x", "content": "1"})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    workspace = Path(AgentSession.objects.get(pk=session).workspace)
    (workspace / "link").symlink_to(tmp_path)
    again = submit(agent, session, "w2", "write_file", {"path": "link/x", "content": "2"})
    assert again.status == "denied" and again.decided_by.startswith("guard:")


def test_same_grant_twice_is_one_grant(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "a.txt", "content": ""})
    first = grants.grant_for_session(ctx=context_of(call), actor=admin)
    assert grants.grant_for_session(ctx=context_of(call), actor=admin).pk == first.pk
    assert SessionGrant.objects.filter(session_id=session).count() == 1


def test_call_without_a_narrow_rule_is_refused(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(
        agent, session, "c1", "run_command", {"argv": ["bash", "-c", "make && make install"]}
    )
    with pytest.raises(ServiceError, match="without a session grant"):
        grants.grant_for_session(ctx=context_of(call), actor=admin)


def test_a_path_grant_covers_exactly_that_path(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "src", "content": "1"})
    grant = grants.grant_for_session(ctx=context_of(call), actor=admin)
    assert grant.rule == "write_file(/src)"
    same = submit(agent, session, "w2", "write_file", {"path": "./src", "content": "2"})
    assert same.status == "queued" and same.decided_by == "grant:write_file(/src)"
    for index, path in enumerate(["src/app.py", "src/a/b.txt", "src2"]):
        under = submit(agent, session, f"u{index}", "write_file", {"path": path, "content": ""})
        assert under.status == "pending_approval", path


def test_a_path_grant_stops_when_the_path_becomes_a_symlink(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session).workspace)
    call = submit(agent, session, "w1", "write_file", {"path": "notes.txt", "content": "1"})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    (workspace / "other.txt").write_text("")
    (workspace / "notes.txt").symlink_to(workspace / "other.txt")
    again = submit(agent, session, "w2", "write_file", {"path": "notes.txt", "content": "2"})
    assert again.status == "pending_approval"


def test_a_command_grant_holds_only_in_its_working_directory(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    workspace = Path(AgentSession.objects.get(pk=session).workspace)
    for name in ("a", "b"):
        (workspace / name).mkdir()
    call = submit(agent, session, "c1", "run_command", {"argv": ["make"], "cwd": "a"})
    grant = grants.grant_for_session(ctx=context_of(call), actor=admin)
    assert grant.rule == "run_command(make) in cwd a"
    for index, cwd in enumerate(["a", "./a", "a/"]):
        same = submit(agent, session, f"s{index}", "run_command", {"argv": ["make"], "cwd": cwd})
        assert same.status == "queued" and same.decided_by == "grant:run_command(make) in cwd a"
    elsewhere = [{"cwd": "b"}, {"cwd": "."}, {}, {"cwd": "a/x"}]
    for index, extra in enumerate(elsewhere):
        other = submit(agent, session, f"o{index}", "run_command", {"argv": ["make"], **extra})
        assert other.status == "pending_approval", extra


def test_a_command_grant_without_cwd_is_for_the_workspace_root(
    agent: AgentFixture, admin: User
) -> None:
    session = start_session(agent)
    (Path(AgentSession.objects.get(pk=session).workspace) / "sub").mkdir()
    call = submit(agent, session, "c1", "run_command", {"argv": ["npm", "test"]})
    assert grants.grant_for_session(ctx=context_of(call), actor=admin).rule == (
        "run_command(npm test)"
    )
    root = submit(agent, session, "c2", "run_command", {"argv": ["npm", "test"], "cwd": "."})
    assert root.status == "queued"
    sub = submit(agent, session, "c3", "run_command", {"argv": ["npm", "test"], "cwd": "sub"})
    assert sub.status == "pending_approval"


def test_a_grant_never_allows_an_unreadable_command(agent: AgentFixture, admin: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "c1", "run_command", {"argv": ["echo", "hi"]})
    grants.grant_for_session(ctx=context_of(call), actor=admin)
    ctx = context_of(call)
    assert grants.grant_matches("run_command(echo hi)", ctx)
    assert not grants.grant_matches("run_command(echo hi) in cwd b", ctx)
    assert not grants.grant_matches("run_command(echo hi) and more", ctx)
    unreadable = submit(
        agent, session, "c2", "run_command", {"argv": ["python3", "-c", "print(1)"]}
    )
    assert not grants.grant_matches("run_command(python3 *)", context_of(unreadable))
