"""The reviewer's browser against a live daphne + Celery worker (Playwright, Debian chromium)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.browser import login
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.browser, pytest.mark.live]

HOSTILE = (
    "<script>alert('script')</script><img src=x onerror=\"alert('img')\">"
    '<div hx-get="/approvals/" hx-trigger="load" hx-swap="outerHTML">htmx</div>'
    "\u202eevil.txt"
)


class Reviewer:
    """One signed-in reviewer with the queue open; records dialogs and CSP errors."""

    def __init__(self, browser: Any, stack: LiveStack) -> None:
        self.username = unique("reviewer")
        make_user(self.username, groups=("reviewer",))
        self.context = browser.new_context(viewport={"width": 390, "height": 844})  # a phone
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on(
            "console",
            lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
        )
        self.page.on("request", lambda r: self.requests.append(f"{r.method} {r.url}"))
        login(self.page, stack.url, self.username)
        self.page.goto(f"{stack.url}/approvals/")
        self.page.wait_for_selector("#live-state.on", timeout=5000)

    def item(self, text: str) -> Any:
        return self.page.locator("article.approval", has_text=text)


@pytest.fixture
def open_reviewers(browser: Any, live_stack: LiveStack, live_db: None) -> Iterator[list[Any]]:
    opened: list[Reviewer] = []

    def open_one() -> Reviewer:
        opened.append(Reviewer(browser, live_stack))
        return opened[-1]

    yield [open_one]
    for reviewer in opened:
        reviewer.context.close()


class WaitingAgent(threading.Thread):
    """The agent's POST ...?wait=30 for one write_file call, in the background."""

    def __init__(self, stack: LiveStack, fx: AgentFixture, path: str, content: str) -> None:
        super().__init__(daemon=True)
        self.client = stack.client(fx, timeout=40)
        session = self.client.post("/api/v1/sessions", json={"title": "browser"}).json()
        self.url = f"/api/v1/sessions/{session['id']}/calls"
        self.body = {
            "calls": [
                {"id": "w1", "name": "write_file", "arguments": {"path": path, "content": content}}
            ]
        }
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = self.client.post(self.url, params={"wait": 30}, json=self.body)

    def result(self) -> dict[str, Any]:
        self.join(35)
        assert self.response is not None and self.response.status_code == 200
        self.client.close()
        return dict(self.response.json()["results"][0])


def test_new_ask_appears_live_and_approving_by_key_returns_the_tool_result(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = open_reviewers[0]()
    agent = WaitingAgent(live_stack, live_agent, "notes.txt", "hello reviewer\n")
    item = reviewer.item("notes.txt")
    item.wait_for(timeout=3000)  # appeared without a reload
    assert "+hello reviewer" in item.locator("pre.diff").inner_text()
    item.focus()
    reviewer.page.keyboard.press("a")
    result = agent.result()
    assert result["content"] == "Wrote 15 bytes to notes.txt" and result["is_error"] is False
    item.wait_for(state="detached", timeout=3000)
    # (the decision's own answer: on a loaded machine it may be swapped in after the live
    # push has already taken the item away)
    reviewer.page.locator("#decision-status").get_by_text("Approved write_file.").wait_for(
        timeout=5000
    )
    assert not [e for e in reviewer.console_errors if "Content Security Policy" in e]


def test_deny_with_feedback_reaches_the_agent_and_leaves_the_other_queue(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    first, second = open_reviewers[0](), open_reviewers[0]()
    agent = WaitingAgent(live_stack, live_agent, "plan.md", "draft")
    for reviewer in (first, second):
        reviewer.item("plan.md").wait_for(timeout=3000)
    first.item("plan.md").locator("form.decide textarea").fill("Write it to docs/plan.md instead.")
    first.item("plan.md").get_by_role("button", name="Deny").click()
    result = agent.result()
    assert "Write it to docs/plan.md instead." in result["content"]
    second.item("plan.md").wait_for(state="detached", timeout=1500)  # within a second or so
    first.item("plan.md").wait_for(state="detached", timeout=1500)


def test_hostile_arguments_are_shown_as_text_and_run_nothing(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = open_reviewers[0]()
    queue_loads = reviewer.requests.count(f"GET {live_stack.url}/approvals/")
    agent = WaitingAgent(live_stack, live_agent, "hostile.html", HOSTILE)
    pushed = reviewer.item("hostile.html")
    pushed.wait_for(timeout=3000)
    reviewer.page.wait_for_timeout(300)  # time for any injected handler to fire
    assert_shown_as_text(pushed)
    # hx-trigger="load" would have fetched the queue again
    assert reviewer.requests.count(f"GET {live_stack.url}/approvals/") == queue_loads
    # The same call rendered by the server rather than pushed over the socket.
    reviewer.page.goto(live_stack.url + pushed.get_attribute("data-url"))
    assert_shown_as_text(reviewer.page.locator("article.approval"))
    assert reviewer.dialogs == []
    reviewer.page.get_by_role("button", name="Deny").click()
    assert "denied" in agent.result()["content"]


def test_a_folded_ask_offers_no_approve_and_a_does_nothing_until_shown_whole(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = open_reviewers[0]()
    page_errors: list[str] = []
    reviewer.page.on("pageerror", lambda error: page_errors.append(str(error)))
    content = "".join(f"row {i}\n" for i in range(2000))
    agent = WaitingAgent(live_stack, live_agent, "folded.txt", content)
    item = reviewer.item("folded.txt")
    item.wait_for(timeout=3000)  # pushed live, folded
    assert "row 1999" not in item.inner_text() and "folded" in item.inner_text()
    # Neither Approve nor "Approve and allow for the rest of this session": Deny, Show all.
    assert item.get_by_role("button", name="Approve").count() == 0
    assert item.get_by_role("button", name="Deny").count() == 1
    assert item.get_by_text("Approve after reading it whole").is_visible()
    item.focus()
    reviewer.page.keyboard.press("a")  # does nothing on a folded item
    item.get_by_role("button", name="Show all").click()
    unfolded = reviewer.item("row 1999")
    unfolded.wait_for(timeout=3000)  # the whole item, after anything `a` might have sent
    assert not [r for r in reviewer.requests if r.startswith("POST") and "/decide" in r]
    assert agent.is_alive() and page_errors == []
    assert unfolded.get_by_text("Approve after reading it whole").count() == 0
    assert unfolded.get_by_role("button", name="Approve and allow").count() == 1
    unfolded.focus()
    reviewer.page.keyboard.press("a")  # shown whole: `a` approves
    result = agent.result()
    assert result["is_error"] is False and result["content"].startswith("Wrote ")
    assert page_errors == []


def assert_shown_as_text(item: Any) -> None:
    arguments = item.locator("pre.arguments").first.inner_text()
    assert "<script>alert('script')</script>" in arguments
    assert "<img src=x onerror=" in arguments and 'hx-get=\\"/approvals/\\"' in arguments
    assert "\\u202eevil.txt" in arguments and "\u202e" not in arguments
    assert "\\u202eevil.txt" in item.locator("pre.diff").inner_text()
    assert item.locator("img, script, [hx-get]").count() == 0


def test_a_large_ask_is_folded_and_show_all_unfolds_it_in_place(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    reviewer = open_reviewers[0]()
    content = "".join(f"row {i}\n" for i in range(2000)) + HOSTILE
    agent = WaitingAgent(live_stack, live_agent, "large.txt", content)
    item = reviewer.item("large.txt")
    item.wait_for(timeout=3000)  # pushed live, folded
    assert "row 1999" not in item.inner_text() and "folded" in item.inner_text()
    assert item.locator("form.edit").count() == 0
    item.get_by_role("button", name="Show all").click()
    unfolded = reviewer.item("row 1999")
    unfolded.wait_for(timeout=3000)  # the whole item, in place of the folded one
    assert_shown_as_text(unfolded)
    assert unfolded.locator("form.edit").count() == 1 and reviewer.dialogs == []
    unfolded.get_by_role("button", name="Approve", exact=True).click()
    assert agent.result()["is_error"] is False
    assert not [e for e in reviewer.console_errors if "Content Security Policy" in e]


def test_a_queue_closed_for_a_change_of_access_opens_again_and_stays_live(
    open_reviewers: list[Any], live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """The server closes a person's sockets (4403) when their access changes: a role or a
    team given or taken, their password changed on another page (audit.consumers). The
    page opens its socket again, checked anew; htmx's extension reopens only after 1006,
    1011-1013, so the queue stayed "reconnecting…" and showed no new ask until reloaded."""
    from django.contrib.auth.models import User

    from audit.roles import close_sockets, user_group

    reviewer = open_reviewers[0]()
    user = User.objects.get(username=reviewer.username)
    # (from a thread of its own: Playwright runs an event loop in this one)
    closing = threading.Thread(target=close_sockets, args=(user_group(user.pk),))
    closing.start()
    closing.join(10)
    reviewer.page.wait_for_selector("#live-state.off", timeout=10000)
    reviewer.page.wait_for_selector("#live-state.on", timeout=15000)
    agent = WaitingAgent(live_stack, live_agent, "after-close.txt", "still live\n")
    item = reviewer.item("after-close.txt")
    item.wait_for(timeout=10000)  # pushed on the socket opened again, no reload
    item.focus()
    reviewer.page.keyboard.press("a")
    assert agent.result()["is_error"] is False
