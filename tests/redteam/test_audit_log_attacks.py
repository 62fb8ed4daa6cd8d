"""Red team, the audit log: what an agent sends must neither forge nor break a chain, and
what a database user changes must be reported (real requests, PostgreSQL and SQLite)."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test import Client

from audit.models import AuditChain, AuditEvent
from audit.verify import verify_database
from dispatcher.models import AgentSession
from tests.audit.chains import write_chain
from tests.audit.tamper import sql, triggers_disabled
from tests.support import claude_code_hooks as claude
from tests.support.coding_agent_hooks import post, sid
from tests.support.factories import AgentFixture, make_user

pytestmark = pytest.mark.django_db


def test_a_negative_zero_in_a_hook_leaves_the_chain_verifiable(agent: AgentFixture) -> None:
    """PostgreSQL's jsonb keeps no negative zero: -0.0 reads back as 0.0, so an event
    hashed with "-0.0" no longer matched its hash once stored. Any agent could make its own
    session's chain read as edited (and hide a real edit after it: the verifier names the
    first bad event of a chain only)."""
    session_id = sid()
    body = json.dumps(claude.hook_input("SessionStart", session_id, source=-0.0))
    assert '"source": -0.0' in body
    answer = post(claude.HOOK_URL, agent, body)
    assert answer.status_code == 200, answer.content
    session = AgentSession.objects.get(external_id=session_id)
    event = AuditEvent.objects.get(session_id=session.pk, kind="client.session_started")
    assert event.payload["source"] == 0
    report = verify_database(str(session.pk))
    assert report.ok, [str(p) for p in report.problems]


def test_deleting_a_chains_head_with_its_last_events_is_reported() -> None:
    """A database user without the audit key cut a session's last events and deleted its
    head row: no older signed head is needed for that, and verify_audit said OK (a chain
    was compared with a head only when it had one). The session also left the auditors'
    list and its timeline (both read the head). Every chain written by Harness has a head,
    so a chain with events and no head is reported."""
    events = write_chain(5)
    chain = events[0].chain
    with triggers_disabled():
        sql("DELETE FROM audit_auditevent WHERE chain = %s AND seq > 3", [chain])
    AuditChain.objects.filter(chain=chain).delete()
    report = verify_database(chain)
    assert [str(p) for p in report.problems] == [
        f"chain {chain} end of chain: events exist up to seq 3 but the chain has no head "
        "(its head was deleted: events at the end may have been deleted with it)"
    ]
    assert not verify_database().ok


def _api(client: Client, url: str, body: Any, fx: AgentFixture) -> Any:
    return client.post(
        url, data=json.dumps(body), content_type="application/json", headers=fx.headers
    )


def _streamed(response: Any) -> str:
    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)().decode()


def test_a_weak_masked_secret_is_recoverable_from_an_export_and_the_docs_say_so(
    client: Client, agent: AgentFixture
) -> None:
    """The marker's hash is keyed so that a masked secret cannot be guessed from the log;
    but call.received also keeps the SHA-256 of the exact arguments (unkeyed: approvals
    and passkey signatures are bound to it), and the rest of the arguments is visible. So
    whoever reads an export can try candidate secrets offline until the digest matches.
    That cannot change without breaking the proof of signed approvals; the docs must say
    it, so that nobody relies on masking to hide a guessable secret from auditors."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    arguments = {"path": "db.env", "content": "PGPASSWORD=summer2024"}
    calls = {"calls": [{"id": "t1", "name": "write_file", "arguments": arguments}]}
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rta-aud", groups=("auditor",))
    client.login(username="rta-aud", password="pw-rta-aud")
    lines = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl")).splitlines()
    received = next(e for e in map(json.loads, lines) if e["kind"] == "call.received")
    payload = received["payload"]
    masked = payload["arguments"]
    assert "summer2024" not in masked and "[masked:password#" in masked
    marker = re.search(r"\[masked:password#[0-9a-f]{8}\]", masked)
    assert marker is not None
    words = [
        f"{season}{year}" for season in ("spring", "summer", "autumn") for year in range(2000, 2030)
    ]
    found = [
        w
        for w in words
        if hashlib.sha256(masked.replace(marker.group(0), w).encode()).hexdigest()
        == payload["digest"]
    ]
    assert found == ["summer2024"]  # the attack works: what follows is what the docs say
    docs = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text()
    assert "guessable secret can be found" in docs


def test_arguments_under_every_secret_key_name_are_masked_in_the_export(
    client: Client, agent: AgentFixture
) -> None:
    """docs/audit.md: values under keys named like authorization, credentials, private_key,
    cookie are masked. A call's arguments reach the log as JSON text, where only names
    ending in token, secret, password, pwd or api key were read as secret: an agent's
    `{"Cookie": ...}` or `{"credentials": ...}` was stored and exported in clear."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    secrets = {
        "headers": {"Cookie": "sid=c00kie-value-1", "Authorization": "auth-value-2"},
        "credentials": "cred-value-3",
        "private_key": "0xdeadbeefcafe4",
        "session-key": "sess-value-5",
        "auth": "plain-auth-6",
        "oauth": "kept-oauth",  # not a secret name: (^|_)auth$ only
    }
    calls = {"calls": [{"id": "t1", "name": "http_fetch", "arguments": secrets}]}
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rta-aud2", groups=("auditor",))
    client.login(username="rta-aud2", password="pw-rta-aud2")
    export = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl"))
    received = next(e for e in map(json.loads, export.splitlines()) if e["kind"] == "call.received")
    arguments = json.loads(received["payload"]["arguments"])  # still JSON
    assert received["payload"]["masked"] is True
    for value in ("c00kie-value-1", "auth-value-2", "cred-value-3", "deadbeef", "sess-value-5"):
        assert value not in export, value
    assert "plain-auth-6" not in export
    assert arguments["oauth"] == "kept-oauth"
    assert arguments["headers"]["Cookie"].startswith("[masked:")


def test_a_made_up_tool_name_cannot_list_a_session_under_another_tool(
    client: Client, agent: AgentFixture
) -> None:
    """The session summary keeps the tools called as words (" read_file run_command "). A
    call of a tool named "nope run_command\\u2028x" (rejected: no such tool, nothing ran)
    added three words, so the auditors' list filtered by run_command showed the session,
    and its page offered run_command as a tool it had called."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    names = ["nope run_command\u2028x", "nope run_command y"]
    calls = {
        "calls": [{"id": f"t{n}", "name": name, "arguments": {}} for n, name in enumerate(names)]
    }
    answer = _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent)
    assert {c["status"] for c in answer.json()["calls"]} == {"rejected"}
    received = AuditEvent.objects.filter(chain=sid, kind="call.received").order_by("seq")
    assert [e.payload["tool"] for e in received] == names  # the events keep what was asked
    assert "run_command" not in AuditChain.objects.get(chain=sid).tools.split()
    make_user("rta-aud3", groups=("auditor",))
    client.login(username="rta-aud3", password="pw-rta-aud3")
    assert sid not in client.get("/audit/sessions/?tool=run_command").content.decode()
    assert client.get(f"/audit/sessions/{sid}/?tool=run_command").status_code == 404


def test_made_up_tool_names_are_not_listed_in_the_session_summary(
    client: Client, agent: AgentFixture
) -> None:
    """Each distinct one-word name an agent made up (rejected: no such tool) was added to
    the session summary's tools: the list grew without bound, and the session page's tool
    filter offered every made-up name beside the real ones. Only names that resolved to a
    tool are listed now (a call rejected at receive, unreadable, never resolved either);
    the events keep every name asked."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    made_up = [f"made_up_{n}" for n in range(30)]
    calls = [{"id": f"m{n}", "name": name, "arguments": {}} for n, name in enumerate(made_up)]
    calls.append({"id": "real", "name": "read_file", "arguments": {"path": "missing.txt"}})
    calls.append({"id": "unreadable", "name": "made_up_raw", "arguments": "{not json"})
    answer = _api(client, f"/api/v1/sessions/{sid}/calls", {"calls": calls}, agent)
    statuses = {c["tool_use_id"]: c["status"] for c in answer.json()["calls"]}
    assert statuses["m0"] == statuses["unreadable"] == "rejected", statuses
    assert statuses["real"] != "rejected", statuses
    received = AuditEvent.objects.filter(chain=sid, kind="call.received")
    assert {e.payload["tool"] for e in received} >= {*made_up, "read_file"}
    assert AuditChain.objects.get(chain=sid).tools.split() == ["read_file"]
    make_user("rta-aud6", groups=("auditor",))
    client.login(username="rta-aud6", password="pw-rta-aud6")
    assert client.get(f"/audit/sessions/{sid}/?tool=made_up_3").status_code == 404
    assert client.get(f"/audit/sessions/{sid}/?tool=read_file").status_code == 200


def test_a_time_offset_written_into_sqlite_is_reported() -> None:
    """SQLite keeps times as text. Adding an offset ("+05:00") to a stored time moves the
    event for every reader (Django reads the offset: five hours earlier in the timeline),
    but the verifier replaced the offset by UTC and found the hashed text again: OK."""
    events = write_chain(3)
    chain, target = events[0].chain, events[1]
    if connection.vendor == "postgresql":
        with triggers_disabled():
            sql(
                "UPDATE audit_auditevent SET created_at = created_at - interval '5 hours' "
                "WHERE id = %s",
                [target.pk],
            )
    else:
        with triggers_disabled():
            sql(
                "UPDATE audit_auditevent SET created_at = created_at || '+05:00' WHERE id = %s",
                [target.pk],
            )
    moved = AuditEvent.objects.get(pk=target.pk).created_at
    assert target.created_at - moved == timedelta(hours=5)
    report = verify_database(chain)
    assert [(p.seq, p.what.split(":")[0]) for p in report.problems] == [(2, "hash mismatch")]


def test_the_tool_filter_shows_a_tool_name_with_its_bidi_characters_escaped(
    client: Client, agent: AgentFixture
) -> None:
    """Everything else on the session page shows an agent's text through `visible`; the
    tool filter's choices (the session's tool names) showed a right-to-left override raw,
    and so did the session list's Tools column."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    calls = {"calls": [{"id": "t1", "name": "fr\u202eelif_daer", "arguments": {}}]}
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code == 200
    # Such a name never resolves, so it is no longer listed; a summary written before
    # that (or any name the list holds) is still shown escaped.
    assert AuditChain.objects.get(chain=sid).tools.split() == []
    AuditChain.objects.filter(chain=sid).update(tools=" fr\u202eelif_daer ")
    make_user("rta-aud5", groups=("auditor",))
    client.login(username="rta-aud5", password="pw-rta-aud5")
    page = client.get(f"/audit/sessions/{sid}/").content.decode()
    options = re.findall(r"<option value=\"[^\"]*\"(?: selected)?>([^<]*)</option>", page)
    assert "fr\\u202eelif_daer" in options
    assert not [o for o in options if "\u202e" in o]
    listed = client.get("/audit/sessions/").content.decode()
    assert "fr\\u202eelif_daer" in listed and "\u202e" not in listed


def test_a_call_allowed_by_a_long_session_grant_is_recorded(client: Client, tmp_path: Path) -> None:
    """A reviewer's session grant names the call's exact command ("grant:run_command(...)"),
    and a command is often longer than the 200 characters that ToolCall.decided_by and
    the audit actor hold. On PostgreSQL every later call the grant allowed failed (500,
    value too long); SQLite kept the text whole. The decision's `by` is cut to fit; its
    rule stays whole in the provenance."""
    from dispatcher.policy.models import SessionGrant
    from tests.support.factories import make_agent

    fx = make_agent(mode="standard", workspace=str(tmp_path))
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, fx).json()["id"]
    word = "x" * 230
    rule = f"run_command(echo {word})"
    SessionGrant.objects.create(session_id=sid, rule=rule, tool="run_command")
    calls = {"calls": [{"id": "t1", "name": "run_command", "arguments": {"argv": ["echo", word]}}]}
    answer = _api(client, f"/api/v1/sessions/{sid}/calls", calls, fx)
    assert answer.status_code in (200, 202), answer.content[:300]
    [call] = answer.json()["calls"]
    assert call["decision"] == "allow" and call["decided_by"].startswith("grant:run_command(echo x")
    decided = AuditEvent.objects.get(chain=sid, kind="call.allowed")
    assert len(decided.actor) <= 200 and decided.payload["rule"] == rule
    assert verify_database(sid).ok


def test_a_call_reported_again_and_again_does_not_grow_its_timeline_page(
    client: Client, agent: AgentFixture
) -> None:
    """A client may report a finished call again: each report is recorded on the call's
    card as client.report_orphaned (hooks._record_orphan), and the page read every one.
    20,000 reports made the page take 3.7 s and 3.9 MB (0.3 s before), on every live
    refresh. The page shows the newest ORPHANS_SHOWN; the log and exports keep them all."""
    from audit.services import EventSpec, record_events
    from audit.timeline import ORPHANS_SHOWN
    from dispatcher import agents
    from tests.support.factories import submit_one

    session = agents.start_session(agent=agent.agent, title="t")
    call = submit_one(session, "read_file", {"path": "x"})
    report = {"call_id": str(call.pk), "event": "PostToolUse", "tool_name": "Read"}
    specs = [
        EventSpec(
            "client.report_orphaned",
            f"agent:{agent.agent.name}",
            f"call:{call.pk}",
            {**report, "reason": f"report {n}"},
        )
        for n in range(ORPHANS_SHOWN + 30)
    ]
    with transaction.atomic():  # what as many hook requests record (tests/coding_agents)
        record_events(specs, session_id=session.pk)
    make_user("rta-aud5", groups=("auditor",))
    client.login(username="rta-aud5", password="pw-rta-aud5")
    page = client.get(f"/audit/sessions/{session.pk}/").content.decode()
    shown = page.count('class="note-clientreport_orphaned"')
    assert shown == ORPHANS_SHOWN
    assert f"report {ORPHANS_SHOWN + 29}" in page and "report 0<" not in page
