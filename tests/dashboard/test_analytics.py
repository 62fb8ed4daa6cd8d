"""Approval analytics on a generated history with known answers: what is always approved
is suggested as an allow rule, what is always denied as a deny rule, with backtests; one
click applies a suggestion (versioned, audited); rubber stamping is flagged."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from audit import kinds
from audit.models import AuditEvent
from dispatcher import analytics
from dispatcher.models import AgentSession, ToolCall
from dispatcher.policy.models import PermissionProfile
from tests.support.factories import make_agent, make_user, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


class History:
    """Reviewer decisions written directly (bulk_create), one second apart in time order."""

    def __init__(self) -> None:
        self.fx = make_agent()
        self.session = AgentSession.objects.create(
            agent=self.fx.agent,
            team_id=self.fx.agent.team_id,
            mode="standard",
            workspace=str(settings.HARNESS_WORKSPACE_ROOT),
        )
        self.start = timezone.now() - timedelta(hours=5)
        self.calls: list[ToolCall] = []
        self.times: list[Any] = []

    def decide(
        self, name: str, arguments: dict[str, Any], reviewer: str, approve: bool, seconds: float
    ) -> None:
        at = self.start + timedelta(minutes=len(self.calls))
        decided = at + timedelta(seconds=seconds)
        self.times.append(at)
        self.calls.append(
            ToolCall(
                session=self.session,
                tool_use_id=uuid.uuid4().hex,
                name=name,
                raw_arguments="{}",
                arguments=arguments,
                digest="",
                dialect="native",
                batch_id=uuid.uuid4(),
                batch_index=0,
                status="completed" if approve else "denied",
                decision="allow" if approve else "deny",
                decided_by=f"user:{reviewer}",
                created_at=at,
                queued_at=decided if approve else None,
                finished_at=decided,
            )
        )

    def save(self) -> User:
        ToolCall.objects.bulk_create(self.calls)
        # created_at is auto_now_add (bulk_create sets it to now): put the times back.
        for call, at in zip(self.calls, self.times, strict=True):
            ToolCall.objects.filter(pk=call.pk).update(created_at=at)
        return self.fx.owner


NPM = {"argv": ["npm", "test", "--", "--watch"]}
RM = {"argv": ["rm", "-rf", "build"]}


@pytest.fixture
def history() -> tuple[History, User]:
    h = History()
    for i in range(20):  # npm test: approved 20 of 20 times, by alice, in 8-12 s
        h.decide("run_command", NPM, "alice", True, 8 + i % 5)
        if i in (6, 13):  # rm -rf build: denied twice, between them
            h.decide("run_command", RM, "alice", False, 30)
    for i in range(4):  # writes to secrets/: denied 4 of 4 times
        h.decide("write_file", {"path": f"secrets/k{i}.pem", "content": "x"}, "carol", False, 5)
    for i in range(6):  # docs: approved 5, denied once: no suggestion either way
        h.decide("write_file", {"path": f"docs/p{i}.md", "content": "x"}, "carol", i != 3, 6)
    for i in range(25):  # bob: 25 approvals in a row, each within a second
        h.decide("read_file", {"path": f"notes/n{i}.txt"}, "bob", True, 0.5)
    h.decide("run_command", {"argv": ["bash", "-c", "make"]}, "alice", True, 9)
    return h, h.save()


def by_rule(found: list[Any]) -> dict[str, Any]:
    return {s.rule: s for s in found}


def test_always_approved_is_suggested_as_allow_with_its_backtest(
    history: tuple[History, User],
) -> None:
    _, owner = history
    report = analytics.report()
    suggested = by_rule(report["suggestions"])
    npm = suggested["run_command(npm test *)"]
    assert npm.action == "allow" and npm.pattern.owner == owner
    assert (npm.pattern.approved, npm.pattern.denied) == (20, 0)
    assert 8 <= npm.pattern.median_seconds <= 12
    # The backtest: those 20 calls would no longer ask.
    assert len(npm.backtest.changes) == 20
    assert {(c.before.action, c.after.action) for c in npm.backtest.changes} == {("ask", "allow")}


def test_always_denied_is_suggested_as_deny_and_twice_denied_is_not_allowed(
    history: tuple[History, User],
) -> None:
    suggested = by_rule(analytics.report()["suggestions"])
    assert suggested["write_file(secrets/**)"].action == "deny"
    assert "run_command(rm -rf *)" not in suggested  # denied twice: neither allow nor deny
    assert "write_file(docs/**)" not in suggested  # 5 approved, 1 denied: mixed
    assert not [r for r in suggested if r.startswith("run_command(bash")]  # never for a shell
    assert all(s.action == "allow" for r, s in suggested.items() if "npm" in r or "notes" in r)


def test_rubber_stamping_is_flagged_per_reviewer(history: tuple[History, User]) -> None:
    reviewers = {r.reviewer: r for r in analytics.report()["reviewers"]}
    bob = reviewers["bob"]
    assert bob.fast == 25 and bob.longest_streak == 25
    assert bob.reasons == ["25 of 25 decisions in under 2 seconds", "25 approvals in a row"]
    alice = reviewers["alice"]
    assert alice.longest_streak < analytics.LONG_STREAK and alice.reasons == []


def test_the_page_shows_suggestions_and_flags_to_admins_only(
    client: Client, history: tuple[History, User]
) -> None:
    client.force_login(make_user(unique("rev"), groups=("reviewer",)))
    assert client.get("/permissions/analytics/").status_code == 403
    client.force_login(make_user(unique("adm"), groups=("admin",)))
    html = client.get("/permissions/analytics/").content.decode()
    assert '<code class="suggested-rule">run_command(npm test *)</code>' in html
    assert "Approved 20 of 20 times" in html
    assert "rubber stamping?" in html.split('id="reviewer-bob"')[1].split("</tr>")[0]
    assert "careful" in html.split('id="reviewer-alice"')[1].split("</tr>")[0]


def test_one_click_applies_a_versioned_audited_rule(
    client: Client, history: tuple[History, User]
) -> None:
    _, owner = history
    admin = make_user(unique("adm"), groups=("admin",))
    client.force_login(admin)
    version = PermissionProfile.objects.get(user=owner).version
    form = {
        "user": owner.pk,
        "action": "allow",
        "rule": "run_command(npm test *)",
        "version": version,
    }
    page = client.post("/permissions/analytics/apply", form, follow=True).content.decode()
    assert "Added allow rule" in page
    profile = PermissionProfile.objects.get(user=owner)
    assert profile.allow == ["run_command(npm test *)"] and profile.version == version + 1
    event = AuditEvent.objects.filter(kind=kinds.PROFILE_CHANGED).latest("id")
    assert event.actor == f"user:{admin.username}" and event.payload["allow"] == profile.allow
    # Suggested no more, and a second click on the old page is refused as stale.
    assert "run_command(npm test *)" not in by_rule(analytics.report()["suggestions"])
    stale = client.post("/permissions/analytics/apply", form, follow=True).content.decode()
    assert (
        "was changed" in stale and PermissionProfile.objects.get(user=owner).version == version + 1
    )


@pytest.mark.parametrize(
    "form",
    [
        {"action": "ask", "rule": "read_file"},
        {"action": "allow", "rule": "run_command(npm (x"},
        {"action": "allow", "rule": "read_file", "version": "v1"},
    ],
)
def test_bad_applies_are_refused_with_a_reason(client: Client, form: dict[str, str]) -> None:
    owner = make_user(unique("owner"))
    client.force_login(make_user(unique("adm"), groups=("admin",)))
    before = PermissionProfile.objects.filter(user=owner).first()
    data = {"user": owner.pk, "version": before.version if before else 1, **form}
    page = client.post("/permissions/analytics/apply", data, follow=True)
    assert page.status_code == 200 and 'class="notice bad"' in page.content.decode()
    after = PermissionProfile.objects.filter(user=owner).first()
    assert (after.version if after else None) == (before.version if before else None)
