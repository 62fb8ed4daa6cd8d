"""Reviewer screens: the live queue, a page per call, and the decision POST.

Session auth only: agent bearer tokens are never looked at here, so an agent reaches
these URLs as an anonymous user.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from audit.roles import REVIEWER, HtmxHttpRequest, reach, role_required
from dispatcher.gateways import dialects
from dispatcher.models import Status

from . import links, queries, services, stepup
from .models import ApprovalRequest

QUEUE = "approvals/queue.html"


@role_required(REVIEWER)
@require_GET
@vary_on_headers("HX-Request")  # an htmx request gets the items fragment
def queue(request: HtmxHttpRequest) -> HttpResponse:
    template = QUEUE + "#items" if request.htmx else QUEUE
    context = {
        **queries.queue_context(request.reach),
        "vapid_public_key": settings.HARNESS_VAPID_PUBLIC_KEY,
    }
    return render(request, template, context)


@role_required(REVIEWER)
@require_GET
def detail(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    approval = queries.one_request(approval_id, request.reach)
    if approval is None:
        raise Http404("No such approval request.")
    return render(request, "approvals/detail.html", {"approval": approval, "full": True})


@role_required(REVIEWER)
@require_GET
def full_item(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """One queue item with its large values unfolded (the queue's "Show all")."""
    approval = queries.one_request(approval_id, request.reach)
    if approval is None:
        raise Http404("No such approval request.")
    return render(request, QUEUE + "#item", {"approval": approval, "full": True})


@role_required(REVIEWER)
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets the decision fragment
def decide(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """Approve or deny with the digest the reviewer saw. 200/302, or 403/404/409 with why."""
    action = request.POST.get("action")
    if action not in ("approve", "approve_session", "deny"):
        return _answer(request, approval_id, "Choose Approve or Deny.", status=400)
    try:
        approval = services.decide(
            approval_id=approval_id,
            user=request.user,
            approve=action != "deny",
            digest=request.POST.get("digest", ""),
            feedback=request.POST.get("feedback", "").strip(),
            allow_session=action == "approve_session",
            signed=_signed(request, approval_id, "deny" if action == "deny" else "approve"),
            effect_digest=request.POST.get("effect_digest", ""),
        )
    except services.DecisionRefused as refusal:
        return _answer(request, approval_id, str(refusal), status=refusal.status)
    verb = "Denied" if action == "deny" else "Approved"
    message = f"{verb} {approval.call.name}." + _not_run(approval, action != "deny")
    if not approval.decision:  # one vote of a quorum: the call still waits
        message = f"Your approval of {approval.call.name} counts: {approval.progress()}."
        return _answer(request, approval_id, message, status=200, ok=True)
    grant = getattr(approval, "grant", None)
    if grant is not None:
        message += f" Allowed '{grant.rule}' for the rest of this session."
    if not request.htmx:
        messages.success(request, message)
        return redirect("approvals:queue")
    return _fragment(request, approval, message, ok=True, status=200)


def _not_run(approval: ApprovalRequest, approve: bool) -> str:
    """What an approval says when the guards, re-run as it released the call to its client,
    denied it (services._release_denial)."""
    if approve and approval.decision and approval.call.status == Status.DENIED:
        return f" It will not run: {approval.call.reason}"
    return ""


STEP_UP_NONCES = "harness.step_up"  # session key: {"<approval>:<verdict>": nonce}
STEP_UP_ISSUED = "harness.step_up_at"  # session key: {"<approval>:<verdict>": Unix time}


@role_required(REVIEWER)
@require_POST
def step_up(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """The passkey challenge for one verdict (POST verdict=approve|deny): JSON
    {"publicKey": options} for navigator.credentials.get, or {"error": why} with
    400/404/409 (409: the call is no longer waiting).
    The one-time nonce stays in the person's session until the decision uses it."""
    verdict = request.POST.get("verdict", "")
    approval = queries.one_request(approval_id, request.reach)
    if approval is None:
        return JsonResponse({"error": "This approval request does not exist."}, status=404)
    if verdict not in ("approve", "deny"):
        return JsonResponse({"error": "Choose approve or deny."}, status=400)
    if approval.call.status != Status.PENDING_APPROVAL:
        return JsonResponse({"error": services.already_decided(approval)}, status=409)
    try:
        nonce, options = stepup.begin(
            approval=approval, user=request.user, verdict=verdict, rp_id=_rp_id(request)
        )
    except stepup.StepUpRefused as refused:
        return JsonResponse({"error": str(refused)}, status=400)
    nonces = dict(request.session.get(STEP_UP_NONCES, {}))
    issued = dict(request.session.get(STEP_UP_ISSUED, {}))
    nonces[f"{approval_id}:{verdict}"] = nonce
    issued[f"{approval_id}:{verdict}"] = time.time()
    latest = list(nonces)[-20:]  # the latest few
    request.session[STEP_UP_NONCES] = {k: nonces[k] for k in latest}
    request.session[STEP_UP_ISSUED] = {k: issued[k] for k in latest if k in issued}
    return JsonResponse({"publicKey": options})


def _rp_id(request: HttpRequest) -> str:
    """The WebAuthn relying party: the host the page is on (as allauth.mfa registers)."""
    return request.get_host().partition(":")[0]


def _signed(request: HttpRequest, approval_id: int, verdict: str) -> stepup.Signed | None:
    """The assertion a step-up form sent, with the nonce of this session's challenge,
    which is used up here: an assertion sent again meets no nonce, or another one. A
    challenge issued more than stepup.CHALLENGE_SECONDS ago (or at no recorded time) is
    `stale`: check refuses it."""
    key = f"{approval_id}:{verdict}"
    nonces = dict(request.session.get(STEP_UP_NONCES, {}))
    issued = dict(request.session.get(STEP_UP_ISSUED, {}))
    nonce, at = nonces.pop(key, ""), issued.pop(key, None)
    if "assertion" not in request.POST:
        return None
    request.session[STEP_UP_NONCES] = nonces
    request.session[STEP_UP_ISSUED] = issued
    age = time.time() - at if isinstance(at, int | float) else math.inf
    stale = bool(nonce) and not 0 <= age <= stepup.CHALLENGE_SECONDS
    return stepup.Signed(request.POST["assertion"], str(nonce), _rp_id(request), stale=stale)


@role_required(REVIEWER)
@require_POST
def edit(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """Replace the call by a new one with edited arguments (the JSON text, or for
    write_file the new content). 200/302, or 400/403/404/409 with why."""
    approval = queries.one_request(approval_id, request.reach)
    if approval is None:
        if ApprovalRequest.objects.filter(pk=approval_id).exists():
            # Another team's call: refused as a decision is (docs/teams.md), saying why
            # and showing nothing of it.
            return _answer(request, approval_id, services.OUTSIDE, status=403)
        raise Http404("No such approval request.")
    try:
        arguments = edited_arguments(approval, request.POST)
        outcome = services.edit(
            approval_id=approval_id,
            user=request.user,
            digest=request.POST.get("digest", ""),
            arguments=arguments,
            comment=request.POST.get("feedback", "").strip(),
        )
    except services.DecisionRefused as refusal:
        return _answer(request, approval_id, str(refusal), status=refusal.status)
    new = outcome.replacement
    message = f"Edited {new.name}: the new call is {new.get_status_display().lower()}."
    if outcome.replacement_approval is not None and new.status == Status.PENDING_APPROVAL:
        progress = outcome.replacement_approval.progress()
        message += f" Your edit counts as your approval ({progress})." if progress else ""
    if not request.htmx:
        messages.success(request, message)
        return redirect("approvals:queue")
    return _fragment(request, outcome.approval, message, ok=True, status=200)


def edited_arguments(approval: ApprovalRequest, data: Any) -> Any:
    """The arguments a reviewer's edit form sent: `content` replaces write_file's content;
    otherwise `arguments` is the whole JSON object. Raises DecisionRefused (400)."""
    original = approval.call.arguments or {}
    try:
        if "content" in data and approval.call.name == "write_file":
            edited = {**original, "content": data["content"].replace("\r\n", "\n")}
            dialects.check_storable(edited)
            return edited
        # The agent API's strict JSON: no NaN or Infinity (nor a number too large for a
        # float), nothing the database would refuse (a NUL character, a lone surrogate):
        # a bad edit is a 400, never a 500.
        edited = json.loads(
            data.get("arguments", ""), parse_constant=_not_a_number, parse_float=_finite
        )
        dialects.check_storable(edited)
        return edited
    except (ValueError, RecursionError) as error:
        raise services.DecisionRefused(
            f"The edited arguments are not valid JSON ({error}). Fix them and send again.", 400
        ) from None


def _not_a_number(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large a number")
    return value


def _answer(
    request: HtmxHttpRequest, approval_id: int, message: str, *, status: int, ok: bool = False
) -> HttpResponse:
    approval = queries.one_request(approval_id, request.reach)
    if approval is None:
        # Another team's call: the refusal says why, and shows nothing of the call.
        if status == 403:
            return HttpResponse(message, status=403, content_type="text/plain; charset=utf-8")
        raise Http404("No such approval request.")
    if request.htmx:
        return _fragment(request, approval, message, ok=ok, status=status)
    if ok:
        messages.success(request, message)
        return redirect("approvals:queue")
    context = {"approval": approval, "error": message}
    return render(request, "approvals/detail.html", context, status=status)


def _fragment(
    request: HtmxHttpRequest, approval: ApprovalRequest, message: str, *, ok: bool, status: int
) -> HttpResponse:
    context = {
        "approval": approval,
        "message": message,
        "ok": ok,
        # A decision taken or refused because the call left the queue: drop it from the page.
        "remove": approval.call.status != Status.PENDING_APPROVAL,
        "link": reverse("approvals:detail", args=[approval.pk]),
    }
    return render(request, QUEUE + "#decided", context, status=status)


# --- One-tap links ------------------------------------------------------------------------

LINK = "approvals/link.html"


@never_cache  # (it shows the call: kept nowhere, as the role pages: audit.roles)
@require_http_methods(["GET", "POST"])
def link(request: HttpRequest, token: str) -> HttpResponse:
    """A signed one-tap link: GET shows the call and a confirm button; only the POST
    (CSRF-protected, with the digest shown) decides. No session needed when
    HARNESS_LINKS_REQUIRE_LOGIN is off: the link stands for its recipient, once."""
    try:
        claim = links.read(token)
        links.person_for(claim, request.user, confirming=request.method == "POST")
    except links.LinkRefused as refused:
        if refused.status == 401:
            return redirect_to_login(request.get_full_path())
        return _link_refused(request, refused)
    if claim.approval.needs_key(claim.verdict):
        # A step-up verdict is signed on the call's page, never by a link alone.
        messages.info(request, links.STEP_UP_MESSAGE)
        return redirect("approvals:detail", claim.approval.pk)
    if request.method == "GET":
        queries.attach_history([claim.approval])
        # (a recipient of the next tier sees the session's earlier calls without their
        # reasons, as on the queue: the agent's team's rules decided them)
        queries.mark_escalated_only([claim.approval], reach(claim.recipient, REVIEWER))
        context = {
            "approval": claim.approval,
            "verdict": claim.verdict,
            "recipient": claim.recipient,
        }
        return render(request, LINK, context)
    try:
        approval = links.use(
            token=token,
            user=request.user,
            digest=request.POST.get("digest", ""),
            comment=request.POST.get("feedback", "").strip(),
            effect_digest=request.POST.get("effect_digest", ""),
        )
    except links.LinkRefused as refused:
        return _link_refused(request, refused)
    if not approval.decision:
        done = f"Your approval of {approval.call.name} counts."
    else:
        verb = "Approved" if claim.verdict == "approve" else "Denied"
        done = f"{verb} {approval.call.name}." + _not_run(approval, claim.verdict == "approve")
    return render(
        request, LINK, {"done": done, "approval": approval, "progress": approval.progress()}
    )


def _link_refused(request: HttpRequest, refused: links.LinkRefused) -> HttpResponse:
    """The page of a link that decides nothing, saying why (and where to set up a second
    factor, when that is why)."""
    context = {"refused": str(refused)}
    if isinstance(refused, links.SecondFactorMissing):
        context["setup"] = reverse("identity_mfa_setup")
    return render(request, LINK, context, status=refused.status)
