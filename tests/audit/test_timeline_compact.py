"""The compact timeline: one line per call that opens in place to its full card, filters
by tool and outcome, and what the reviewer saw rendered as the approval page shows it."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from audit.models import AuditChain
from tests.audit.test_timeline_pages import Step, write_session
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

DIFF = "--- a/n.txt\n+++ b/n.txt\n@@ -1 +1 @@\n-old\n+new <b>\n"


def mixed_session() -> tuple[str, dict[str, str]]:
    """Four calls: a read allowed by mode, a write approved by a reviewer (its diff shown),
    a command denied by a reviewer (its argv shown), and an unknown tool rejected."""
    ids = {name: unique(name) for name in ("read", "write", "command", "nope")}
    steps: list[Step] = [("session.started", "", {"agent": "bulk", "mode": "standard"})]

    def received(name: str, tool: str, arguments: str) -> None:
        steps.append(
            (
                "call.received",
                ids[name],
                {"tool": tool, "arguments": arguments, "tool_use_id": name},
            )
        )

    received("read", "read_file", '{"path": "notes/today.txt"}')
    steps.append(("call.allowed", ids["read"], {"to": "queued", "by": "mode:standard"}))
    steps.append(
        ("call.completed", ids["read"], {"to": "completed", "content": "hello", "is_error": False})
    )
    received("write", "write_file", '{"path": "n.txt", "content": "new <b>"}')
    asked = {"to": "pending_approval", "by": "mode:standard", "tool": "write_file"}
    diff = {"kind": "diff", "path": "n.txt", "diff": DIFF, "new_file": False}
    steps.append(("call.approval_requested", ids["write"], {**asked, "presentation": diff}))
    steps.append(
        ("call.approved", ids["write"], {"to": "queued", "by": "user:rita", "tool": "write_file"})
    )
    steps.append(
        (
            "call.completed",
            ids["write"],
            {"to": "completed", "content": "wrote", "is_error": False, "tool": "write_file"},
        )
    )
    received("command", "run_command", '{"command": "rm -rf build"}')
    argv = {"kind": "command", "argv": ["rm", "-rf", "build"], "cwd": "/w", "text": "rm -rf build"}
    steps.append(
        (
            "call.approval_requested",
            ids["command"],
            {**asked, "tool": "run_command", "presentation": argv},
        )
    )
    steps.append(
        (
            "call.denied",
            ids["command"],
            {"to": "denied", "by": "user:rita", "tool": "run_command", "content": "no"},
        )
    )
    received("nope", "nope_tool", "{}")
    steps.append(
        ("call.rejected", ids["nope"], {"to": "rejected", "by": "resolve", "tool": "nope_tool"})
    )
    chain = write_session(steps, 4)
    AuditChain.objects.filter(chain=chain).update(
        tools=" read_file write_file run_command nope_tool "
    )
    return chain, ids


@pytest.fixture
def auditor(client: Client) -> Client:
    client.force_login(make_user(unique("auditor"), groups=("auditor",)))
    return client


def lines(html: str) -> dict[str, str]:
    """Each call's one line (its <summary>), by call id."""
    found = re.findall(
        r'id="call-([^"]+)".*?<summary class="call-line">(.*?)</summary>', html, re.S
    )
    return {call_id: " ".join(re.sub(r"<[^>]+>", " ", text).split()) for call_id, text in found}


def test_one_line_per_call_with_time_tool_arguments_outcome_and_who(auditor: Client) -> None:
    chain, ids = mixed_session()
    html = auditor.get(f"/audit/sessions/{chain}/").content.decode()
    shown = lines(html)
    assert list(shown) == [ids["read"], ids["write"], ids["command"], ids["nope"]]
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d read_file path=notes/today.txt completed mode:standard", shown[ids["read"]]
    )
    assert shown[ids["write"]].endswith(
        "write_file path=n.txt content=new &lt;b&gt; completed user:rita"
    )
    assert shown[ids["command"]].endswith("run_command command=rm -rf build denied user:rita")
    assert "rejected" in shown[ids["nope"]]
    # The full card is there, folded: the line is a <summary> of a closed <details>.
    assert html.count("<details>") == 4 and "<details open" not in html


def test_what_the_reviewer_saw_is_the_diff_and_the_argv_not_a_repr(auditor: Client) -> None:
    chain, ids = mixed_session()
    html = auditor.get(f"/audit/sessions/{chain}/").content.decode()
    write = html.split(f'id="call-{ids["write"]}"')[1].split("</article>")[0]
    saw = write.split("What the reviewer saw")[1]
    assert '<pre class="diff">' in saw
    assert '<span class="add">+new &lt;b&gt;</span>' in saw  # escaped, marked as added
    assert '<span class="del">-old</span>' in saw
    command = html.split(f'id="call-{ids["command"]}"')[1].split("</article>")[0]
    assert '<ol class="argv"><li><code>rm</code></li><li><code>-rf</code></li>' in command
    assert "Working directory: <code>/w</code>" in command
    assert "{&#x27;kind&#x27;" not in html and "'kind'" not in html  # no Python dict repr


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?tool=run_command", ["command"]),
        ("?outcome=completed", ["read", "write"]),
        ("?outcome=approved", ["write"]),
        ("?outcome=asked", ["write", "command"]),
        ("?outcome=denied&tool=run_command", ["command"]),
        ("?outcome=denied&tool=read_file", []),
        ("?outcome=rejected", ["nope"]),
    ],
)
def test_filters_by_tool_and_outcome(auditor: Client, query: str, expected: list[str]) -> None:
    chain, ids = mixed_session()
    response = auditor.get(f"/audit/sessions/{chain}/{query}", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert list(lines(html)) == [ids[name] for name in expected]
    assert f'hx-get="/audit/sessions/{chain}/{query}"' in html.replace("&amp;", "&")
    if not expected:
        assert "No calls match these filters." in html


def test_filtered_pages_keep_the_filter_in_the_pager(auditor: Client) -> None:
    from tests.audit.test_timeline_pages import bulk_session, link

    chain, ids = bulk_session(30)
    html = auditor.get(f"/audit/sessions/{chain}/?tool=read_file").content.decode()
    assert (
        link(html, "Older calls")
        == "?tool=read_file&before=" + link(html, "Older calls").split("before=")[1]
    )  # type: ignore[union-attr]
    older = auditor.get(f"/audit/sessions/{chain}/{link(html, 'Older calls')}").content.decode()
    assert link(older, "Latest") == f"/audit/sessions/{chain}/?tool=read_file"
    assert len(re.findall(r'class="card audit-call"', older)) == 5


@pytest.mark.parametrize("query", ["?tool=rm_everything", "?outcome=exploded", "?tool=%00"])
def test_unknown_filters_answer_404_naming_what_exists(auditor: Client, query: str) -> None:
    chain, _ = mixed_session()
    response = auditor.get(f"/audit/sessions/{chain}/{query}")
    assert response.status_code == 404


def test_htmx_history_restore_gets_the_whole_page(auditor: Client) -> None:
    chain, _ = mixed_session()
    headers = {"HX-Request": "true", "HX-History-Restore-Request": "true"}
    html = auditor.get(f"/audit/sessions/{chain}/", headers=headers).content.decode()
    assert "<html" in html and 'ws-connect="/ws/audit/sessions/' in html


def test_a_page_change_moves_the_live_refresh_and_a_refresh_does_not(auditor: Client) -> None:
    chain, _ = mixed_session()
    url = f"/audit/sessions/{chain}/?outcome=denied"
    page_change = auditor.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<span id="audit-refresh"' in page_change and 'hx-swap-oob="true"' in page_change
    assert f'hx-get="{url}"' in page_change
    headers = {"HX-Request": "true", "HX-Trigger": "audit-refresh"}
    refresh = auditor.get(url, headers=headers).content.decode()
    assert "audit-refresh" not in refresh and 'class="card audit-call"' in refresh
