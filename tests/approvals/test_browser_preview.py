"""The reviewer's Chromium shows a command's previewed effect above the command (diffs,
output, exit status, all as text), and approving applies exactly that effect: a live
daphne previews at admission, a live Celery worker applies (Playwright, Debian chromium,
the real sandbox)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.models import AgentSession
from tests.approvals.test_browser import HOSTILE, Reviewer
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack
from tests.tools.support import require_bwrap

pytestmark = [pytest.mark.browser, pytest.mark.live]

SCRIPT = (
    "sed -i s/beta/BETA/ notes.txt && sed -i s/one/ONE/ other.txt && "
    "printf 'made\\n' > new.txt && rm old.txt && printf '%s\\n' \"$1\""
)


class CommandAgent(threading.Thread):
    """The agent's POST ...?wait=60 of one run_command call, in the background."""

    def __init__(self, client: httpx.Client, session_id: str) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.url = f"/api/v1/sessions/{session_id}/calls"
        argv = ["sh", "-c", SCRIPT, "sh", HOSTILE]
        self.body = {"calls": [{"id": "r1", "name": "run_command", "arguments": {"argv": argv}}]}
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = self.client.post(self.url, params={"wait": 60}, json=self.body)

    def result(self) -> dict[str, Any]:
        self.join(65)
        assert self.response is not None and self.response.status_code == 200
        return dict(self.response.json()["results"][0])


def test_the_reviewer_sees_the_effect_and_approving_applies_it(
    browser: Any, live_stack: LiveStack, live_agent: AgentFixture, live_db: None
) -> None:
    require_bwrap()
    reviewer = Reviewer(browser, live_stack)
    client = live_stack.client(live_agent, timeout=70)
    session_id = client.post("/api/v1/sessions", json={"title": "preview"}).json()["id"]
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    (workspace / "other.txt").write_text("one\ntwo\n")
    (workspace / "old.txt").write_text("bye\n")
    agent = CommandAgent(client, session_id)
    try:
        item = reviewer.item("This command would")
        item.wait_for(timeout=20000)  # previewed at admission, then pushed live
        summary = item.locator(".effect-summary").inner_text()
        assert summary == "This command would: change 2 files, create 1, delete 1"
        effect = item.locator("section.effect")
        assert "-beta" in effect.inner_text() and "+BETA" in effect.inner_text()
        assert "Exit status: 0" in effect.inner_text()
        output = item.locator("pre.effect-output").inner_text()
        assert "<script>alert('script')</script>" in output and "\\u202eevil.txt" in output
        assert item.locator("img, script, [hx-get]").count() == 0
        above = effect.bounding_box()["y"] < item.locator("ol.argv").bounding_box()["y"]
        assert above  # the effect comes before the command
        reviewer.page.wait_for_timeout(300)  # time for any injected handler to fire
        assert reviewer.dialogs == []
        item.get_by_role("button", name="Approve", exact=True).click()
        result = agent.result()
    finally:
        reviewer.context.close()
    assert result["is_error"] is False and result["content"].startswith("exit code 0\n<script>")
    assert (workspace / "notes.txt").read_text() == "alpha\nBETA\n"
    assert (workspace / "other.txt").read_text() == "ONE\ntwo\n"
    assert (workspace / "new.txt").read_text() == "made\n"
    assert not (workspace / "old.txt").exists()
    client.close()
