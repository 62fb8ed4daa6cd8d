"""Reviewer screens: the live queue, a page per call, and the decision POST.

Session auth only: agent bearer tokens are never looked at here, so an agent reaches
these URLs as an anonymous user.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from audit.roles import REVIEWER, has_role
from dispatcher.models import Status

from . import queries, services
from .models import ApprovalRequest

QUEUE = "approvals/queue.html"


def _require_reviewer(request: HttpRequest) -> None:
    if not has_role(request.user, REVIEWER):
        raise PermissionDenied("Only reviewers can see and decide tool calls.")


@login_required
@require_GET
@vary_on_headers("HX-Request")  # an htmx request gets the items fragment
def queue(request: HttpRequest) -> HttpResponse:
    _require_reviewer(request)
    approvals, more = queries.review_queue()
    template = QUEUE + "#items" if request.htmx else QUEUE  # type: ignore[attr-defined]
    return render(request, template, {"approvals": approvals, "more": more})


@login_required
@require_GET
def detail(request: HttpRequest, approval_id: int) -> HttpResponse:
    _require_reviewer(request)
    approval = queries.one_request(approval_id)
    if approval is None:
        raise Http404("No such approval request.")
    return render(request, "approvals/detail.html", {"approval": approval})


@login_required
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets the decision fragment
def decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    """Approve or deny with the digest the reviewer saw. 200/302, or 403/404/409 with why."""
    _require_reviewer(request)
    action = request.POST.get("action")
    if action not in ("approve", "approve_session", "deny"):
        return _answer(request, approval_id, "Choose Approve or Deny.", status=400)
    try:
        approval = services.decide(
            approval_id=approval_id,
            user=request.user,  # type: ignore[arg-type]
            approve=action != "deny",
            digest=request.POST.get("digest", ""),
            feedback=request.POST.get("feedback", "").strip(),
            allow_session=action == "approve_session",
        )
    except services.DecisionRefused as refusal:
        return _answer(request, approval_id, str(refusal), status=refusal.status)
    verb = "Denied" if action == "deny" else "Approved"
    message = f"{verb} {approval.call.name}."
    grant = getattr(approval, "grant", None)
    if grant is not None:
        message += f" Allowed '{grant.rule}' for the rest of this session."
    if not request.htmx:  # type: ignore[attr-defined]
        messages.success(request, message)
        return redirect("approvals:queue")
    return _fragment(request, approval, message, ok=True, status=200)


def _answer(request: HttpRequest, approval_id: int, message: str, *, status: int) -> HttpResponse:
    approval = queries.one_request(approval_id)
    if approval is None:
        raise Http404("No such approval request.")
    if request.htmx:  # type: ignore[attr-defined]
        return _fragment(request, approval, message, ok=False, status=status)
    context = {"approval": approval, "error": message}
    return render(request, "approvals/detail.html", context, status=status)


def _fragment(
    request: HttpRequest, approval: ApprovalRequest, message: str, *, ok: bool, status: int
) -> HttpResponse:
    context = {
        "approval": approval,
        "message": message,
        "ok": ok,
        # A decision taken or refused because the call left the queue: drop it from the page.
        "remove": ok or approval.call.status != Status.PENDING_APPROVAL,
        "link": reverse("approvals:detail", args=[approval.pk]),
    }
    return render(request, QUEUE + "#decided", context, status=status)
