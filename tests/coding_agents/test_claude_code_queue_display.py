"""What a reviewer sees of a Claude Code call in the queue, and that the decision binds
to the digest exactly as for other calls."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher import admission, agents
from dispatcher.models import Status
from dispatcher.proposals import ProposedCall, canonical_json
from tests.support.claude_code_hooks import PROJECT, pre_tool_use, send
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewer_client(reviewer: User) -> Client:
    client = Client()
    client.force_login(reviewer)
    return client


def asked(agent: AgentFixture, tool: str, tool_input: dict[str, object]) -> ApprovalRequest:
    session_id = str(uuid.uuid4())
    send(agent, pre_tool_use(session_id, tool, tool_input), wait=0)
    # The hook gave up at once (wait=0): the call is cancelled, its request still shown.
    return ApprovalRequest.objects.select_related("call").get(call__session__external_id=session_id)


def item(client: Client, approval: ApprovalRequest) -> str:
    return str(client.get(f"/approvals/{approval.pk}/").content.decode())


def test_bash_shows_the_command_its_parts_the_project_and_the_claude_code_session(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = asked(
        agent, "Bash", {"command": "npm ci && npm test | tee log.txt", "description": "Run tests"}
    )
    page = item(reviewer_client, approval)
    assert '<pre class="command">npm ci &amp;&amp; npm test | tee log.txt</pre>' in page
    assert "It runs 3 commands" in page
    assert "<li><code>npm</code> <code>ci</code> </li>" in page
    assert "<code>tee</code> <code>log.txt</code>" in page
    assert f"Project directory (on the developer's machine): <code>{PROJECT}</code>" in page
    assert "claude-code session" in page and approval.call.session.external_id in page
    assert "Described as: Run tests" in page


def test_edit_shows_a_diff_and_write_the_whole_content(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    edit = asked(
        agent,
        "Edit",
        {
            "file_path": f"{PROJECT}/src/app.py",
            "old_string": "debug = True",
            "new_string": "debug = False",
        },
    )
    page = item(reviewer_client, edit)
    assert f"Change to <code>{PROJECT}/src/app.py</code>" in page
    assert '<span class="del">-debug = True</span>' in page
    assert '<span class="add">+debug = False</span>' in page
    write = asked(
        agent, "Write", {"file_path": f"{PROJECT}/NOTES.md", "content": "# Notes\n<b>x</b>\n"}
    )
    page = item(reviewer_client, write)
    assert "(the whole new content)" in page
    assert '<span class="add">+&lt;b&gt;x&lt;/b&gt;</span>' in page


def test_a_multi_edit_shows_every_replacement(reviewer_client: Client, agent: AgentFixture) -> None:
    edits = [{"old_string": "a = 1", "new_string": "a = 2"}, {"old_string": "b", "new_string": "c"}]
    approval = asked(agent, "MultiEdit", {"file_path": f"{PROJECT}/m.py", "edits": edits})
    page = item(reviewer_client, approval)
    assert "+a = 2" in page and "+c" in page


def pending(agent: AgentFixture, tool: str, tool_input: dict[str, Any]) -> ApprovalRequest:
    """A call that asks and stays pending (as while Claude Code's hook waits)."""
    session = agents.client_session(
        agent=agent.agent, client="claude-code", external_id=str(uuid.uuid4()), project_dir=PROJECT
    )
    proposed = ProposedCall("toolu_pending", tool, canonical_json(tool_input), tool_input)
    [call] = admission.submit_calls(session=session, dialect="anthropic", proposed=[proposed])
    return ApprovalRequest.objects.select_related("call").get(call=call)


def test_the_decision_binds_to_the_digest_the_reviewer_saw(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = pending(agent, "Bash", {"command": "make deploy"})
    url = f"/approvals/{approval.pk}/decide"
    wrong = reviewer_client.post(url, {"action": "approve", "digest": "0" * 64})
    assert wrong.status_code == 409
    approval.call.refresh_from_db()
    assert approval.call.status == Status.PENDING_APPROVAL
    right = reviewer_client.post(url, {"action": "approve", "digest": approval.call.digest})
    assert right.status_code == 302
    approval.call.refresh_from_db()
    assert approval.call.status == Status.RELEASED  # allowed for the client, never queued


def test_the_queue_lists_a_pending_claude_code_call(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    approval = pending(agent, "Bash", {"command": "make deploy"})
    page = reviewer_client.get("/approvals/").content.decode()
    assert f"call-{approval.call_id}" in page and "make deploy" in page


def _changed(page: str) -> list[str]:
    """The diff's lines on `page` other than its file and hunk headers: what it changes,
    and the `\\ No newline` lines (shown in the headers' colour: not context)."""
    return [
        line
        for kind, line in re.findall(r'<span class="(add|del|ctx|meta)">(.*?)</span>', page)
        if kind != "meta" or line.startswith("\\")
    ]


@pytest.mark.parametrize(
    ("old", "new", "shown"),
    [
        ("last", "last\n", ["-last", "\\ No newline at end of the text", "+last"]),
        ("last\n", "last", ["-last", "+last", "\\ No newline at end of the text"]),
    ],
)
def test_an_edit_that_only_adds_or_removes_a_final_newline_shows_it(
    reviewer_client: Client, agent: AgentFixture, old: str, new: str, shown: list[str]
) -> None:
    """Each last line was given a newline before the diff was made: an Edit of `last` to
    `last\\n` (a file's missing final newline added) showed the reviewer "(no change)"."""
    edit = asked(
        agent,
        "Edit",
        {"file_path": f"{PROJECT}/src/app.py", "old_string": old, "new_string": new},
    )
    page = item(reviewer_client, edit)
    lines = _changed(page)
    assert "(no change)" not in page
    assert lines == shown, lines


def test_a_write_without_a_final_newline_says_so(
    reviewer_client: Client, agent: AgentFixture
) -> None:
    write = asked(agent, "Write", {"file_path": f"{PROJECT}/run.sh", "content": "echo hi"})
    lines = _changed(item(reviewer_client, write))
    assert lines == ["+echo hi", "\\ No newline at end of file"], lines
