"""The session timeline shows one page of calls at a time, at a cost that does not grow
with the session: the newest calls first, older and newer calls a link away, every call
on exactly one page, a constant number of queries and a bounded page size."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditChain, AuditEvent
from audit.services import GENESIS_HASH, canonical_event, chain_hash
from audit.timeline import PAGE_CALLS
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db


Step = tuple[str, str, dict[str, Any]]  # kind, call id ("" for a session event), payload


def bulk_session(calls: int, *, late_first: bool = False) -> tuple[str, list[str]]:
    """A session of `calls` read_file calls written fast (bulk_create) with its head row.

    Each call is received, allowed, started and completed; its later events come after the
    next call's call.received, so calls interleave in seq as they do in a live session.
    With `late_first`, the first call waits for a reviewer and is approved and completed
    only after every other call. Returns the chain and the call ids in arrival order.
    """
    ids = [str(uuid.uuid4()) for _ in range(calls)]

    def rest(i: int) -> list[Step]:  # call i's events after its call.received
        if late_first and i == 0:
            return [("call.approval_requested", ids[0], {"to": "pending_approval"})]
        return [
            ("call.allowed", ids[i], {"to": "queued", "action": "allow", "by": "mode:standard"}),
            ("call.started", ids[i], {"to": "running"}),
            ("call.completed", ids[i], {"to": "completed", "content": f"contents of f{i}"}),
        ]

    steps: list[Step] = [("session.started", "", {"agent": "bulk", "mode": "standard"})]
    for i, call_id in enumerate(ids):
        arguments = f'{{"path": "f{i}.txt"}}'
        steps.append(("call.received", call_id, {"tool_use_id": f"t{i}", "arguments": arguments}))
        steps += rest(i - 1) if i else []
    steps += rest(calls - 1) if calls else []
    if late_first and calls:
        steps.append(
            ("call.approved", ids[0], {"to": "queued", "action": "approve", "by": "user:rev"})
        )
        steps.append(("call.completed", ids[0], {"to": "completed", "content": "the late result"}))
    return write_session(steps, calls), ids


def write_session(steps: list[Step], calls: int) -> str:
    """Insert the steps as one valid chain (subjects as the dispatcher writes them) and the
    chain's head row with its session summary; returns the chain."""
    session_id = uuid.uuid4()
    chain, start, prev = str(session_id), timezone.now() - timedelta(hours=1), GENESIS_HASH
    events = []
    for seq, (kind, call_id, extra) in enumerate(steps, 1):
        subject = f"call:{call_id}" if call_id else f"session:{chain}"
        payload = {"call_id": call_id, "tool": "read_file", **extra} if call_id else extra
        at = start + timedelta(milliseconds=seq)
        fields = {"chain": chain, "seq": seq, "kind": kind, "actor": "agent:bulk"}
        fields |= {"subject": subject, "payload": payload}
        digest = chain_hash(prev, canonical_event(**fields, created_at=at.isoformat()))
        events.append(
            AuditEvent(**fields, session_id=session_id, created_at=at, prev_hash=prev, hash=digest)
        )
        prev = digest
    AuditEvent.objects.bulk_create(events, batch_size=2000)
    AuditChain.objects.create(
        chain=chain,
        session_id=session_id,
        agent="bulk",
        owner="tester",
        title="bulk",
        mode="standard",
        first_at=start,
        last_at=events[-1].created_at,
        last_seq=len(events),
        last_hash=prev,
        last_event_id=0,
        tools=" read_file ",
        calls=calls,
        allowed=calls,
        completed=calls,
    )
    return chain


@pytest.fixture
def auditor(client: Client) -> Client:
    client.force_login(make_user(unique("auditor"), groups=("auditor",)))
    return client


def shown(html: str) -> list[str]:
    """The call ids on a page, top to bottom."""
    return re.findall(r'<article class="card audit-call" id="call-([^"]+)"', html)


def link(html: str, label: str) -> str | None:
    """The href of the first pager link with this label, or None."""
    found = re.search(rf'<a href="([^"]*)"[^>]*>{label}</a>', html)
    return found.group(1).replace("&amp;", "&") if found else None


def get(client: Client, chain: str, query: str = "") -> str:
    response = client.get(f"/audit/sessions/{chain}/{query}")
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_first_visit_shows_the_newest_calls_oldest_first_with_a_link_to_older(
    auditor: Client,
) -> None:
    chain, ids = bulk_session(2 * PAGE_CALLS + 5)
    page = get(auditor, chain)
    assert shown(page) == ids[-PAGE_CALLS:]  # the newest page, in the order they arrived
    assert link(page, "Older calls") and link(page, "Oldest") == "?after=0"
    assert link(page, "Newer calls") is None and link(page, "Latest") is None
    assert f"{2 * PAGE_CALLS + 5} calls in this session" in page
    assert page.count('aria-label="Timeline pages"') == 2  # above and below the calls
    assert "contents of f54" in page and "contents of f29" not in page


def test_older_and_newer_links_show_every_call_exactly_once(auditor: Client) -> None:
    chain, ids = bulk_session(2 * PAGE_CALLS + 5)
    pages: list[list[str]] = []
    query: str | None = ""
    while query is not None:
        html = get(auditor, chain, query)
        pages.insert(0, shown(html))
        query = link(html, "Older calls")
    assert [len(p) for p in pages] == [5, PAGE_CALLS, PAGE_CALLS]
    assert sum(pages, []) == ids

    forward: list[str] = []
    query = "?after=0"
    while query is not None:
        html = get(auditor, chain, query)
        assert len(shown(html)) <= PAGE_CALLS
        forward += shown(html)
        query = link(html, "Newer calls")
    assert forward == ids
    assert link(html, "Latest") == f"/audit/sessions/{chain}/"


def test_a_call_decided_long_after_it_arrived_shows_its_result_on_its_page(
    auditor: Client,
) -> None:
    chain, ids = bulk_session(3 * PAGE_CALLS, late_first=True)
    oldest = get(auditor, chain, "?after=0")
    assert shown(oldest)[0] == ids[0]
    first = oldest.split(f'id="call-{ids[0]}"')[1].split("</article>")[0]
    assert first.startswith(' data-status="completed"')
    assert "the late result" in first and "user:rev" in first  # the reviewer


@pytest.mark.heavy
def test_queries_and_page_size_do_not_grow_with_the_session(auditor: Client) -> None:
    small, small_ids = bulk_session(PAGE_CALLS)  # 1 + 4 x 25 = 101 events
    big, big_ids = bulk_session(1000)  # 4,001 events
    counts: dict[str, list[int]] = {}
    sizes: list[int] = []
    for chain, ids in ((small, small_ids), (big, big_ids)):
        for name, query in (
            ("latest", ""),
            ("oldest", "?after=0"),
            ("older", f"?before={4 * len(ids) - 5}"),  # before the last call
            ("call", f"?call={ids[1]}"),
        ):
            auditor.get(f"/audit/sessions/{chain}/{query}")  # warm (session, groups)
            with CaptureQueriesContext(connection) as queries:
                response = auditor.get(f"/audit/sessions/{chain}/{query}")
            assert response.status_code == 200
            counts.setdefault(name, []).append(len(queries))
            if name == "latest":
                sizes.append(len(response.content))
                assert len(shown(response.content.decode())) == PAGE_CALLS
        with CaptureQueriesContext(connection) as queries:
            fragment = auditor.get(f"/audit/sessions/{chain}/", headers={"HX-Request": "true"})
        counts.setdefault("live refresh", []).append(len(queries))
        assert len(shown(fragment.content.decode())) == PAGE_CALLS
    for name, (at_100, at_4000) in counts.items():
        assert at_100 == at_4000, (name, counts)
    # (9th: the reports that match no call; 10th: the newest reports of the page's calls)
    assert max(counts["latest"]) <= 10, counts
    assert sizes[1] < 1.1 * sizes[0], sizes  # the 4,000-event page is no bigger


def test_a_link_to_a_call_lands_on_the_page_that_holds_it(auditor: Client) -> None:
    chain, ids = bulk_session(2 * PAGE_CALLS)
    page = get(auditor, chain, f"?call={ids[7]}")
    assert shown(page) == ids[7 : 7 + PAGE_CALLS]
    assert link(page, "Older calls") and link(page, "Newer calls")
    earlier = get(auditor, chain, link(page, "Older calls") or "")
    assert shown(earlier) == ids[:7]
    other, _ = bulk_session(1)
    assert auditor.get(f"/audit/sessions/{other}/?call={ids[7]}").status_code == 404


@pytest.mark.parametrize(
    "query",
    [
        "?before=abc",
        "?after=-1",
        "?before=1e3",
        "?after=%EF%BC%91",  # a full-width digit one
        "?after=123456789012345678901234",
        "?before=10&after=2",
        "?call=not-a-call",
        "?call=",
        "?call=" + "x" * 5000,
    ],
)
def test_bad_page_parameters_answer_404_not_an_error(auditor: Client, query: str) -> None:
    chain, _ = bulk_session(3)
    assert auditor.get(f"/audit/sessions/{chain}/{query}").status_code == 404


def test_a_page_past_the_end_is_empty_with_a_way_back(auditor: Client) -> None:
    chain, ids = bulk_session(3)
    page = get(auditor, chain, "?after=999999")
    assert shown(page) == [] and "No calls on this page" in page
    assert link(page, "Latest") == f"/audit/sessions/{chain}/"
    back = get(auditor, chain, link(page, "Older calls") or "")
    assert shown(back) == ids


def test_a_page_before_the_start_is_empty_with_a_way_forward(auditor: Client) -> None:
    chain, ids = bulk_session(3)
    page = get(auditor, chain, "?before=0")
    assert shown(page) == [] and link(page, "Older calls") is None
    assert shown(get(auditor, chain, link(page, "Newer calls") or "")) == ids


def test_the_live_refresh_reloads_the_page_it_is_on(auditor: Client) -> None:
    chain, ids = bulk_session(2 * PAGE_CALLS)
    older = link(get(auditor, chain), "Older calls") or ""
    fragment = auditor.get(f"/audit/sessions/{chain}/{older}", headers={"HX-Request": "true"})
    html = fragment.content.decode()
    assert html.lstrip().startswith('<section id="audit-calls"') and "<html" not in html
    # It reloads itself from the page it is on (the socket only says "changed").
    assert f'hx-get="/audit/sessions/{chain}/{older}"' in html
    assert shown(html) == ids[:PAGE_CALLS]
    assert link(html, "Newer calls") and link(html, "Latest")
    assert "HX-Request" in fragment["Vary"]  # a cache never serves it for a page load


def test_session_figures_come_from_the_chain_head(auditor: Client) -> None:
    chain, _ = bulk_session(2)
    AuditChain.objects.filter(chain=chain).update(denied=7, timed_out=3)  # not in the events
    page = get(auditor, chain)
    assert "2 calls in this session" in page
    assert "7 denied" in page and "3 timed out" in page


def test_the_timeline_knows_every_terminal_status_of_a_call() -> None:
    from audit.timeline import TERMINAL
    from dispatcher.models import TERMINAL_STATUSES

    assert {str(s) for s in TERMINAL_STATUSES} == TERMINAL
