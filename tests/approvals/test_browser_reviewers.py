"""Reviewers anywhere, in a real browser against a live daphne + Celery worker: one-tap
links (confirmed, reused, altered), a quorum completed by two reviewers while a third
watches, and edits (one that runs, one a rule denies)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from approvals import links
from approvals.models import ApprovalRequest
from dispatcher.policy import profiles
from tests.approvals.test_browser import Reviewer, WaitingAgent
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack

pytestmark = [pytest.mark.browser, pytest.mark.live]


@pytest.fixture
def reviewers(browser: Any, live_stack: LiveStack, live_db: None) -> Iterator[Any]:
    opened: list[Reviewer] = []

    def open_one() -> Reviewer:
        opened.append(Reviewer(browser, live_stack))
        return opened[-1]

    yield open_one
    for reviewer in opened:
        reviewer.context.close()


def pending(agent: WaitingAgent, fx: AgentFixture, path: str) -> ApprovalRequest:
    import time

    deadline = time.monotonic() + 10
    while True:
        found = ApprovalRequest.objects.filter(
            call__session__agent=fx.agent, call__arguments__path=path
        ).first()
        if found is not None:
            return found
        assert time.monotonic() < deadline, "the call did not ask"
        time.sleep(0.05)


def link_for(stack: LiveStack, approval: ApprovalRequest, username: str, verdict: str) -> str:
    from django.contrib.auth.models import User

    with override_settings(HARNESS_PUBLIC_URL=stack.url):
        return links.make_url(approval, User.objects.get(username=username), verdict)


def test_a_signed_link_shows_the_call_and_confirming_decides_once(
    reviewers: Any, live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = reviewers()
    agent = WaitingAgent(live_stack, live_agent, "linked.txt", "from a phone\n")
    approval = pending(agent, live_agent, "linked.txt")
    url = link_for(live_stack, approval, reviewer.username, "approve")
    page = reviewer.page
    page.goto(url)
    assert "+from a phone" in page.locator("pre.diff").inner_text()
    assert approval.call.digest in page.locator("p.digest").inner_text()
    page.get_by_role("button", name="Confirm: approve").click()
    page.wait_for_selector("#link-done")
    assert "Approved write_file." in page.locator("#link-done").inner_text()
    result = agent.result()
    assert result["content"] == "Wrote 13 bytes to linked.txt"
    # The same link again: it says so and decides nothing.
    page.goto(url)
    assert "already used" in page.locator("#link-refused").inner_text()
    assert not page.get_by_role("button", name="Confirm: approve").count()


def test_an_altered_link_decides_nothing(
    reviewers: Any, live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = reviewers()
    agent = WaitingAgent(live_stack, live_agent, "altered.txt", "x")
    approval = pending(agent, live_agent, "altered.txt")
    url = link_for(live_stack, approval, reviewer.username, "approve")
    head, _, tail = url.rstrip("/").rpartition(":")
    forged = f"{head}:{'x' if tail[0] != 'x' else 'y'}{tail[1:]}/"
    reviewer.page.goto(forged)
    assert "altered" in reviewer.page.locator("#link-refused").inner_text()
    approval.call.refresh_from_db()
    assert approval.call.status == "pending_approval"
    reviewer.page.goto(link_for(live_stack, approval, reviewer.username, "deny"))
    reviewer.page.get_by_role("button", name="Confirm: deny").click()
    assert "denied" in agent.result()["content"]


def test_two_reviewers_complete_a_quorum_while_a_third_watches(
    reviewers: Any, live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    first, second, watcher = reviewers(), reviewers(), reviewers()
    agent = WaitingAgent(live_stack, fx, "quorum.tf", "apply\n")
    for reviewer in (first, second, watcher):
        reviewer.item("quorum.tf").wait_for(timeout=3000)
    progress = watcher.item("quorum.tf").locator("p.progress")
    assert "0 of 2" in progress.inner_text()
    first.item("quorum.tf").get_by_role("button", name="Approve", exact=True).click()
    watcher.page.wait_for_function(
        "name => document.querySelector('p.progress') && "
        "document.querySelector('p.progress').textContent.includes('1 of 2: ' + name)",
        arg=first.username,
        timeout=3000,
    )
    assert agent.response is None  # still waiting for the second approval
    second.item("quorum.tf").get_by_role("button", name="Approve", exact=True).click()
    result = agent.result()
    assert result["content"] == "Wrote 6 bytes to quorum.tf"
    watcher.item("quorum.tf").wait_for(state="detached", timeout=3000)


def test_an_edit_runs_as_a_new_call_and_an_edit_a_rule_denies_is_refused(
    reviewers: Any, live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[],
        deny=["write_file(content:*password*)"],
        actor="test",
    )
    reviewer = reviewers()
    agent = WaitingAgent(live_stack, fx, "config.txt", "debug=true\n")
    item = reviewer.item("config.txt")
    item.wait_for(timeout=3000)
    item.locator("details.edit summary").click()
    editor = item.locator("textarea[name=content]")
    assert editor.input_value() == "debug=true\n"
    editor.fill("password=hunter2\n")
    item.get_by_role("button", name="Run the edited call").click()
    status = reviewer.page.locator("#decision-status")
    status.get_by_text("would not be allowed").wait_for(timeout=3000)
    assert "write_file(content:*password*)" in status.inner_text()
    assert item.is_visible()  # the original still waits

    editor.fill("debug=false\n")
    item.get_by_role("button", name="Run the edited call").click()
    result = agent.result()
    assert f"A reviewer ({reviewer.username}) changed the arguments" in result["content"]
    assert '"content":"debug=false\\n"' in result["content"]
    assert result["content"].endswith("Wrote 12 bytes to config.txt")
    item.wait_for(state="detached", timeout=3000)
