"""Auditor screens: session list, timeline, replay, transcript, exports.

Session authentication only (an agent's bearer token is never looked at here), and only
auditors (group "auditor", a team's auditors, or superusers) get in. A team's auditor
reads their teams' sessions only (those started while the agent worked for one of them,
AgentSession.team, whatever team it is in now: `request.reach`, read with the role by
`role_required`; teams.scope): another team's session is not found (404), and lists and
exports leave it out. `manage.py export_audit` stays the organization's whole log.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.core.paginator import Paginator
from django.db.models import Count, Max, Q, QuerySet
from django.http import Http404, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.vary import vary_on_headers

from dispatcher.models import AgentSession
from teams.scope import Scope

from . import export, kinds, replay, streaming
from .models import AuditChain, AuditEvent
from .roles import AUDITOR, HtmxHttpRequest, role_required
from .services import MORE_TOOLS
from .timeline import (
    OUTCOME_FILTERS,
    CallPage,
    anthropic_batch,
    call_page,
    json_list,
    openai_batch,
    orphan_reports,
    received_seq,
    session_started,
    transcript_batches,
)

PAGE_SIZE = 50
# A timeline page cursor is the seq of a call.received event (at most 18 digits: a bigint).
CURSOR = re.compile(r"[0-9]{1,18}")
MAX_CALL_ID = 100

STATUS_FILTERS = {
    "completed": Q(completed__gt=0),
    "error": Q(errors__gt=0),
    "timed_out": Q(timed_out__gt=0),
    "outcome_unknown": Q(outcome_unknown__gt=0),
    "denied": Q(denied__gt=0),
    "rejected": Q(rejected__gt=0),
    "cancelled": Q(cancelled__gt=0),
    "expired": Q(expired__gt=0),
}
DECISION_FILTERS = {
    "allow": Q(allowed__gt=0) | Q(approved__gt=0),
    "ask": Q(asked__gt=0),
    "approved": Q(approved__gt=0),
    "deny": Q(denied__gt=0),
    "reject": Q(rejected__gt=0),
    "cancel": Q(cancelled__gt=0),
}


def _day(text: str) -> datetime | None:
    try:
        return datetime.combine(date.fromisoformat(text), time.min, tzinfo=UTC)
    except ValueError:
        return None


def chains_in(reach: Scope, chains: QuerySet[AuditChain]) -> QuerySet[AuditChain]:
    """`chains` of sessions whose team `reach` covers (a subquery: no statement
    of its own)."""
    return reach.filter_via(chains, "session_id", AgentSession.objects.all(), "team_id")


def filtered_sessions(params: Any, reach: Scope) -> QuerySet[AuditChain]:
    sessions = chains_in(reach, AuditChain.objects.sessions())
    if any("\x00" in params.get(name, "") for name in ("agent", "user", "tool")):
        return sessions.none()  # no name holds a NUL (and PostgreSQL would refuse the read)
    if agent := params.get("agent", "").strip():
        sessions = sessions.filter(agent=agent)
    if owner := params.get("user", "").strip():
        sessions = sessions.filter(owner=owner)
    if tool := params.get("tool", "").strip():
        # a session whose list ran past its cap may have called it (services.MORE_TOOLS)
        sessions = sessions.filter(
            Q(tools__contains=f" {tool} ") | Q(tools__contains=f" {MORE_TOOLS} ")
        )
    if params.get("status") in STATUS_FILTERS:
        sessions = sessions.filter(STATUS_FILTERS[params["status"]])
    if params.get("decision") in DECISION_FILTERS:
        sessions = sessions.filter(DECISION_FILTERS[params["decision"]])
    if since := _day(params.get("since", "")):
        sessions = sessions.filter(last_at__gte=since)
    if (until := _day(params.get("until", ""))) and until.date() < date.max:
        # (until the last day there is: no bound; its next day is past datetime's range)
        sessions = sessions.filter(first_at__lt=until + timedelta(days=1))
    return sessions.order_by("-last_at")


@role_required(AUDITOR)
def session_list(request: HtmxHttpRequest) -> HttpResponse:
    page = Paginator(filtered_sessions(request.GET, request.reach), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "filters": request.GET,
        "query": query.urlencode(),
        "statuses": list(STATUS_FILTERS),
        "decisions": list(DECISION_FILTERS),
    }
    return render(request, "audit/sessions.html", context)


def _head(request: HtmxHttpRequest, session_id: UUID) -> AuditChain:
    """The session's chain head, if the auditor's reach covers it (404 otherwise, as for
    a session that does not exist)."""
    chains = chains_in(request.reach, AuditChain.objects.filter(chain=str(session_id)))
    head = chains.first()
    if head is None:
        raise Http404("No audit events for this session.")
    return head


def _reached(request: HtmxHttpRequest, session_id: UUID) -> None:
    if not request.reach.everything:
        _head(request, session_id)


def _cursor(params: Any, name: str) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    if not CURSOR.fullmatch(text):
        raise Http404(
            f"'{name}' must be the number of a call in this timeline; open the timeline without it."
        )
    return int(text)


def _filters(head: AuditChain, params: Any) -> dict[str, str]:
    """The compact timeline's filters: a tool of this session, an outcome (OUTCOME_FILTERS).

    Raises Http404 for values the session cannot have, naming the ones it can.
    """
    tool, outcome = params.get("tool", ""), params.get("outcome", "")
    listed = head.tools.split()
    # (no tool's name holds a NUL, and PostgreSQL would refuse the read: a session past
    # its list's cap filters by any other name)
    if tool and ("\x00" in tool or (tool not in listed and MORE_TOOLS not in listed)):
        raise Http404(f"This session never called '{tool[:100]}'; it called: {head.tools.strip()}.")
    if outcome and outcome not in OUTCOME_FILTERS:
        raise Http404(f"Unknown outcome. Choose one of: {', '.join(OUTCOME_FILTERS)}.")
    return {"tool": tool, "outcome": outcome}


def _page(chain: str, params: Any, filters: dict[str, str]) -> CallPage:
    """The page the query asks for: ?before=<seq>, ?after=<seq>, ?call=<id>, or the newest calls.

    Raises Http404 for a malformed cursor or a call that is not in this session.
    """
    before, after, call_id = _cursor(params, "before"), _cursor(params, "after"), params.get("call")
    if sum(p is not None for p in (before, after, call_id)) > 1:
        raise Http404("Give one of 'before', 'after' or 'call'; open the timeline without them.")
    if call_id is not None:
        seq = (
            received_seq(chain, call_id)
            if len(call_id) <= MAX_CALL_ID and "\x00" not in call_id
            else None
        )
        if seq is None:
            raise Http404("No such call in this session; open the timeline to see its calls.")
        after = seq - 1
    return call_page(chain, before=before, after=after, **filters)


@role_required(AUDITOR)
@vary_on_headers("HX-Request")  # one URL, two bodies: a cache never hands a page load the fragment
def session_detail(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """One page of the session's calls, and its summary from the chain's head row.

    A constant number of queries whatever the session's length. An htmx request (the
    live refresh, the pager, the filters) gets the calls fragment only, except when htmx
    restores a page missing from its history cache: that needs the whole page.
    """
    chain = str(session_id)
    head = _head(request, session_id)
    filters = _filters(head, request.GET)
    query = urlencode({k: v for k, v in filters.items() if v})
    latest = reverse("audit:session", args=[session_id]) + (f"?{query}" if query else "")
    context = {
        "head": head,
        "page": _page(chain, request.GET, filters),
        "session_id": session_id,
        "filters": filters,
        # The pager's links: `page_base` + "before=<seq>"; the newest page of this filter.
        "page_base": f"?{query}&" if query else "?",
        "latest_url": latest,
        "here": request.get_full_path(),
        "outcomes": list(OUTCOME_FILTERS),
        "tools": [name for name in head.tools.split() if name != MORE_TOOLS],
        "more_tools": MORE_TOOLS in head.tools.split(),
    }
    htmx = request.htmx
    if htmx and not htmx.history_restore_request:
        # A page change (pager, filters) also moves the live refresh to the new page.
        context["refresh_oob"] = htmx.trigger != "audit-refresh"
        return render(request, "audit/session.html#calls", context)
    context["session"] = session_started(chain)
    context["orphans"] = orphan_reports(chain)
    return render(request, "audit/session.html", context)


def _events_of(request: HtmxHttpRequest, session_id: UUID) -> str:
    """The session's chain; 404 for one the auditor's reach does not cover, or with no
    events."""
    _reached(request, session_id)
    chain = str(session_id)
    if not AuditEvent.objects.filter(chain=chain).exists():
        raise Http404("No audit events for this session.")
    return chain


def _session_page(
    request: HtmxHttpRequest, session_id: UUID, template: str, context: dict[str, Any]
) -> str:
    """The page of a session (`_events_of` has checked it), with `marks` where its
    streamed sections go (audit.streaming)."""
    context |= {
        "session": session_started(str(session_id)),
        "session_id": session_id,
        "marks": {name: streaming.mark(name) for name in ("steps", "pending", "calls", "batches")},
    }
    return render_to_string(template, context, request=request)


@role_required(AUDITOR)
def session_replay(request: HtmxHttpRequest, session_id: UUID) -> HttpResponseBase:
    """Every step of the session and each call's states (audit.replay), streamed from the
    database once the page is long: a session of any length in bounded memory."""
    chain = _events_of(request, session_id)
    # The session as it is now: its sections read no event recorded after (a chain's
    # events are numbered in the order they are appended)
    counted = AuditEvent.objects.filter(chain=chain).aggregate(steps=Count("pk"), last=Max("seq"))
    steps, last = counted["steps"], counted["last"] or 0
    if busy := _refused_early(request, steps, streaming.REPLAY_EVENT_BYTES):
        return busy
    page = _session_page(request, session_id, "audit/replay.html", {"steps": steps})
    sections = replay.page_sections(chain, steps, last)
    pieces = streaming.sections(page, list(sections), sections)
    return streaming.respond(pieces, HTML, lambda: _slot(request))


TRANSCRIPTS = {"openai": openai_batch, "anthropic": anthropic_batch}
HTML = "text/html; charset=utf-8"


@role_required(AUDITOR)
def session_transcript(request: HtmxHttpRequest, session_id: UUID) -> HttpResponseBase:
    """The session as the model saw it, a page or a download of messages (?format=),
    streamed a few hundred calls at a time once it is long (timeline.transcript_batches)."""
    chain, fmt = _events_of(request, session_id), request.GET.get("format", "")
    # (only its calls make a transcript: a call's decision, start and end, and the
    # session's other events, add nothing to it)
    if _refusal(request) and (
        busy := _refused_early(
            request,
            AuditEvent.objects.filter(chain=chain, kind=kinds.CALL_RECEIVED).count(),
            streaming.TRANSCRIPT_EVENT_BYTES,
        )
    ):
        return busy
    if fmt in TRANSCRIPTS:
        to_messages = TRANSCRIPTS[fmt]
        messages = (m for batch in transcript_batches(chain) for m in to_messages(batch))
        response = streaming.respond(
            json_list(messages), "application/json; charset=utf-8", lambda: _slot(request)
        )
        if response.status_code == 200:  # (a refused slot's 503 is a message, not the file)
            response["Content-Disposition"] = (
                f'attachment; filename="transcript-{session_id}-{fmt}.json"'
            )
        return response
    page = _session_page(request, session_id, "audit/transcript.html", {})
    batches = streaming.rendered("audit/transcript.html", "batches", transcript_batches(chain))
    pieces = streaming.sections(page, ["batches"], {"batches": batches})
    return streaming.respond(pieces, HTML, lambda: _slot(request))


EXPORTS_BUSY = {
    "HARNESS_MAX_EXPORTS": (
        "Too many audit exports are being downloaded from this server at once "
        "(HARNESS_MAX_EXPORTS). Try again in a minute."
    ),
    "HARNESS_MAX_EXPORTS_PER_TEAM": (
        "Your team's auditors are already downloading as many audit exports from this server "
        "as one team may at once (HARNESS_MAX_EXPORTS_PER_TEAM). Try again once one of them "
        "has finished or been cancelled."
    ),
    "HARNESS_MAX_EXPORTS_PER_PERSON": (
        "You are already downloading as many audit exports from this server as one person "
        "may at once (HARNESS_MAX_EXPORTS_PER_PERSON). Try again once one of them has finished or "
        "been cancelled."
    ),
    export.LAST_SLOT: (
        "The last free audit export slot of this server is kept for a team whose auditors are "
        "downloading none, and your team's auditors already are (HARNESS_MAX_EXPORTS_PER_TEAM). "
        "Try again once one of their downloads has finished or been cancelled."
    ),
}


def _slot_teams(request: HtmxHttpRequest) -> list[Any]:
    reach = request.reach
    return [export.ORGANIZATION] if reach.everything else list(reach.team_ids)


def _busy(refusal: str) -> HttpResponse:
    """The 503 saying which bound refuses an export slot, and when to try again."""
    busy = HttpResponse(EXPORTS_BUSY[refusal], status=503, content_type="text/plain; charset=utf-8")
    busy["Retry-After"] = "60"
    return busy


def _slot(request: HtmxHttpRequest) -> Callable[[], None] | HttpResponseBase:
    """One of the export slots for the person's streamed response (export.SLOTS): its
    release, or the 503 saying which share refuses it."""
    release = export.SLOTS.take(request.user.pk, _slot_teams(request))
    return _busy(release) if isinstance(release, str) else release


def _refusal(request: HtmxHttpRequest) -> str | None:
    return export.SLOTS.refusal(request.user.pk, _slot_teams(request))


def _refused_early(request: HtmxHttpRequest, events: int, floor: int) -> HttpResponse | None:
    """The 503 of a long page refused an export slot, before any query for its body: when
    no slot may be taken now and the session's `events` make a page past
    streaming.BUFFERED_BYTES (at least `floor` bytes each), which would be refused once it
    had rendered its first MiB, work done for nothing. A page that may be short is
    rendered, and answered whole if it is (it takes no slot)."""
    if events * floor <= streaming.BUFFERED_BYTES:
        return None
    refusal = _refusal(request)
    return _busy(refusal) if refusal else None


def _stream(
    request: HtmxHttpRequest, events: QuerySet[AuditEvent], fmt: str, name: str
) -> HttpResponseBase:
    if fmt not in export.FORMATS:
        raise Http404(f"Unknown export format. Choose one of: {', '.join(export.FORMATS)}.")
    release = _slot(request)
    if isinstance(release, HttpResponseBase):
        return release
    content_type, extension = export.FORMATS[fmt]
    response = streaming.Held(
        export.async_chunks(events, fmt), content_type=content_type, release=release
    )
    response["Content-Disposition"] = f'attachment; filename="{name}.{extension}"'
    return response


@role_required(AUDITOR)
def session_export(request: HtmxHttpRequest, session_id: UUID, fmt: str) -> HttpResponseBase:
    _reached(request, session_id)
    events = AuditEvent.objects.filter(chain=str(session_id))
    return _stream(request, events, fmt, f"audit-{session_id}")


@role_required(AUDITOR)
def filtered_export(request: HtmxHttpRequest) -> HttpResponseBase:
    chains = filtered_sessions(request.GET, request.reach).values("chain")
    events = AuditEvent.objects.filter(chain__in=chains)
    return _stream(request, events, request.GET.get("format", "jsonl"), "audit-export")
