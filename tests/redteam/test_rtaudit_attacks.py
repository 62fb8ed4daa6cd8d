"""Red team, the audit log's screens and verifier (rtaudit): the replay shows each call as
the log says it stands, a filter value no session holds is a 404 (never a 500), and the
verifier names an edited event even when every head names a made-up key."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit import export
from audit.models import AuditChain, AuditEvent
from audit.replay import build_replay
from audit.services import MORE_TOOLS, TOOLS_LISTED
from audit.timeline import build_timeline
from dispatcher.models import AgentSession
from teams.services import set_escalation
from tests.audit.chains import write_chain
from tests.audit.tamper import sql, triggers_disabled
from tests.audit.test_signed_heads import checkpoint
from tests.audit.test_verify import run_verify
from tests.support import claude_code_hooks as claude
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db


def _auditor(client: Client) -> Client:
    name = unique("rtaudit-aud")
    make_user(name, groups=("auditor",))
    client.login(username=name, password="pw-" + name)
    return client


def _calls_table(page: str) -> str:
    """The replay's "Calls so far" table body (every state of every call)."""
    found = re.search(r'<tbody data-role="calls">(.*?)</tbody>', page, re.S)
    assert found is not None, page[:500]
    return found.group(1)


# --- The replay shows each call as it stood -------------------------------------------


def test_the_replay_keeps_an_escalated_ask_pending_and_never_names_a_team_as_its_status() -> None:
    """approval.escalated records the team the ask is offered to as "to"; the replay read
    every event's "to" as the call's new status: from the escalation on, the call stood as
    "status <team name>", and the pending list said no call waited for a reviewer."""
    pay, sec = make_team("rtaudit-pay"), make_team("rtaudit-sec")
    set_escalation(team=pay.team, after=60, to=sec.team, actor="test")
    created = ApprovalRequest.objects.get(pk=pay.approval.pk).created_at
    assert approvals.escalate_due(created + timedelta(seconds=61)) == [pay.approval.pk]

    timeline = build_timeline(str(pay.session.pk))
    assert timeline is not None
    replay = build_replay(timeline.events)
    last = len(replay.steps) - 1
    standing = [s.state for s in replay.calls if s.first <= last <= s.last]
    assert [state.status for state in standing] == ["pending_approval"]
    assert [s.state.tool for s in replay.pending if s.first <= last <= s.last] == ["write_file"]

    page = pay.client("auditor").get(f"/audit/sessions/{pay.session.pk}/replay/")
    assert page.status_code == 200
    table = _calls_table(page.content.decode())
    assert sec.team.name not in table
    assert "organization reviewers" not in table


def test_the_replay_never_shows_an_unreleased_report_as_what_the_model_got_back(
    client: Client, agent: AgentFixture
) -> None:
    """A client reported running a call Harness denied (client.report_orphaned, naming
    the call, with the output it claims): the timeline shows it as a note on the card; the
    replay showed the claimed output as what the denied call gave the model."""
    session = str(uuid.uuid4())
    denied = claude.pre_tool_use(session, "Bash", {"command": "sudo rm -rf /srv"}, "toolu_den")
    assert claude.decision(claude.send(agent, denied))[0] == "deny"
    claimed = "CLAIMED-OUTPUT-" + uuid.uuid4().hex[:8]
    ran_anyway = {**denied, "hook_event_name": "PostToolUse", "tool_response": {"stdout": claimed}}
    assert claude.send(agent, ran_anyway).status_code == 200
    sid = AgentSession.objects.get(external_id=session).pk

    page = _auditor(client).get(f"/audit/sessions/{sid}/replay/").content.decode()
    assert claimed in page  # the report's own step shows its payload as stored
    table = _calls_table(page)
    assert claimed not in table
    assert "denied" in table


# --- Filters: a 404 for a value no session holds, never a 500 ------------------------------


def test_a_nul_in_the_tool_filter_of_a_session_past_its_tool_cap_is_a_404(
    client: Client, settings: Any, tmp_path: Path
) -> None:
    """Past TOOLS_LISTED names a session's summary ends in MORE_TOOLS and its page filters
    by any tool name: a NUL in it reached PostgreSQL (which keeps no NUL in text) and the
    page answered 500."""
    settings.HARNESS_AGENT_REQUEST_BURST = 1000  # the names as fast as the test sends them
    fx = make_agent(mode="standard", workspace=str(tmp_path))
    session = str(uuid.uuid4())
    for n in range(TOOLS_LISTED + 1):
        body = claude.pre_tool_use(session, f"Made{n}", {"file_path": f"{tmp_path}/a"}, f"t{n}")
        assert claude.send(fx, body).status_code == 200
    sid = AgentSession.objects.get(external_id=session).pk
    assert MORE_TOOLS in AuditChain.objects.get(chain=str(sid)).tools.split()

    auditor = _auditor(client)
    assert auditor.get(f"/audit/sessions/{sid}/", {"tool": "Made3"}).status_code == 200
    for value in ("\x00", "Made3\x00", "\x00" * 300):
        answer = auditor.get(f"/audit/sessions/{sid}/", {"tool": value})
        assert answer.status_code == 404, value


# --- The verifier names what was edited ---------------------------------------------------


def test_an_edited_event_is_named_even_when_every_head_names_a_made_up_key() -> None:
    """A database user without the audit key edited an event and wrote, on every head, a
    signature naming some other key id: verify_audit answered only "Every signature was
    made with another key ... set HARNESS_AUDIT_KEY", as if the configuration were wrong,
    and listed nothing it found (the edited event included)."""
    events = write_chain(4)
    chain = events[0].chain
    with triggers_disabled():
        sql(
            "UPDATE audit_auditevent SET actor = %s WHERE chain = %s AND seq = 2",
            ["agent:someone-else", chain],
        )
    made_up = "hmac-sha256:0123456789abcdef:" + "0" * 64
    AuditChain.objects.filter(chain=chain).update(head_signature=made_up)

    ok, output = run_verify("--session", chain)
    assert not ok
    assert f"chain {chain} seq 2 (event id {events[1].pk}): hash mismatch" in output
    assert "0123456789abcdef" in output


def test_the_wrong_key_alone_is_still_one_clear_error() -> None:
    """(What the change above keeps: a log that only names another key is not a list of
    forgeries.)"""
    chain = write_chain(3)[0].chain
    made_up = "hmac-sha256:0123456789abcdef:" + "0" * 64
    AuditChain.objects.filter(chain=chain).update(head_signature=made_up)
    ok, output = run_verify("--session", chain)
    assert not ok
    assert "Every signature was made with another key (key id 0123456789abcdef)" in output
    assert "BAD" not in output


@pytest.mark.parametrize(
    "line",
    [
        "[1, 2]",
        '"text"',
        '{"chain": "x"}',
        '{"chain": "x", "seq": "1", "kind": "k", "actor": "a", "subject": "", "payload": {},'
        ' "created_at": "t", "prev_hash": "0", "hash": "0"}',
        '{"chain": ["x"], "seq": 1, "kind": "k", "actor": "a", "subject": "", "payload": {},'
        ' "created_at": "t", "prev_hash": "0", "hash": "0"}',
    ],
)
def test_a_malformed_export_line_is_named_not_a_traceback(tmp_path: Path, line: str) -> None:
    """`verify_audit --file` reads a file someone hands over: a line that is JSON but not
    an event raised KeyError or TypeError out of the command (a traceback)."""
    path = tmp_path / "export.jsonl"
    path.write_text(line + "\n")
    ok, output = run_verify("--file", str(path))
    assert not ok
    assert f"{path}:1" in output and "not an audit event" in output


def test_verifying_an_export_cut_short_does_not_read_as_whole(tmp_path: Path) -> None:
    """An export with its last events cut off verifies (an export carries no heads), and
    verify_audit --file printed "OK: ... verified" and nothing else: read as "the export
    is whole". It now says what "OK" does not cover, and against a checkpoint the cut
    is found."""
    chain = write_chain(5)[0].chain
    whole = b"".join(
        chunk.data
        for chunk in export.export_chunks(AuditEvent.objects.filter(chain=chain), "jsonl")
    )
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(whole.splitlines(keepends=True)[:3]))
    ok, output = run_verify("--file", str(cut))
    assert ok and "OK: 1 chains, 3 events verified." in output
    assert "not detected" in output and "--against" in output

    marks = tmp_path / "checkpoints.jsonl"
    checkpoint(marks, chain)
    ok, output = run_verify("--file", str(cut), "--against", str(marks))
    assert not ok and "the chain ends at seq 3" in output
