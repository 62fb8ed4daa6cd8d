"""Notification pages: admins configure channels and see every delivery; reviewers
subscribe a browser to Web Push. Session auth only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from audit.roles import ADMIN, REVIEWER, HtmxHttpRequest, role_required
from floor.errors import ServiceError

from . import channels as channels_service
from . import services
from .models import Channel, Kind

PAGE = "approvals/notifications.html"
FIELDS = (
    "name",
    "kind",
    "url",
    "secret",
    "webhook_url",
    "bot_token",
    "channel",
    "api_url",
    "addresses",
    "match_agents",
    "match_tools",
    "match_rules",
    "users",
    "groups",
)
SERVICE_WORKER = Path(settings.BASE_DIR) / "static" / "harness-sw.js"


def _form_of(channel: Channel) -> dict[str, str]:
    config = channel.config
    return {
        "name": channel.name,
        "kind": channel.kind,
        "url": config.get("url", ""),
        "webhook_url": config.get("webhook_url", ""),
        "channel": config.get("channel", ""),
        "api_url": config.get("api_url", ""),
        "addresses": ", ".join(config.get("addresses", [])),
        "match_agents": ", ".join(channel.match_agents),
        "match_tools": ", ".join(channel.match_tools),
        "match_rules": "\n".join(channel.match_rules),
        "users": ", ".join(u.username for u in channel.users.all()),
        "groups": ", ".join(g.name for g in channel.groups.all()),
    }


ORG_ONLY = (
    "Notification channels and their deliveries are the organization's: only "
    "organization admins see and change them."
)


def _organization_admin(request: HtmxHttpRequest) -> None:
    """Channels serve every team (their deliveries name every team's asks): a team's
    admin is refused (403), as teams.scope reaches them to their teams only."""
    if not request.reach.everything:
        raise PermissionDenied(ORG_ONLY)


def _page(request: HtmxHttpRequest, status: int = 200, **extra: Any) -> HttpResponse:
    services.sync_env_channels()
    channels = Channel.objects.prefetch_related("users", "groups")
    context = {
        "channels": channels,
        "deliveries": channels_service.recent_deliveries(),
        "kinds": Kind.choices,
        "form": extra.pop("form", {"kind": Kind.WEBHOOK}),
        **extra,
    }
    return render(request, PAGE, context, status=status)


@role_required(ADMIN)
@require_http_methods(["GET", "POST"])
def channels(request: HtmxHttpRequest) -> HttpResponseBase:
    """GET the channels and deliveries; POST creates or (with `channel_id`) changes one."""
    _organization_admin(request)
    if request.method == "GET":
        editing = request.GET.get("edit", "")
        if editing.isdigit():
            channel = get_object_or_404(Channel, pk=int(editing))
            return _page(request, form=_form_of(channel), editing=channel)
        return _page(request)
    data = {name: request.POST.get(name, "") for name in FIELDS}
    channel_id = request.POST.get("channel_id", "")
    existing = None
    if channel_id.isdigit():
        existing = get_object_or_404(Channel, pk=int(channel_id))
        for secret in ("secret", "bot_token"):  # blank: keep what is set
            if not data[secret] and existing.config.get(secret):
                data[secret] = existing.config[secret]
    try:
        channel = channels_service.save_channel(
            actor=request.user,
            data=data,
            channel_id=existing.pk if existing else None,
        )
    except channels_service.InvalidChannel as invalid:
        return _page(request, status=400, form=data, errors=invalid.problems, editing=existing)
    messages.success(request, f"Saved the channel '{channel.name}'.")
    return redirect("approvals:channels")


@role_required(ADMIN)
@require_POST
def toggle(request: HtmxHttpRequest, channel_id: int) -> HttpResponseBase:
    _organization_admin(request)
    channel = get_object_or_404(Channel, pk=channel_id)
    channels_service.set_enabled(
        actor=request.user,
        channel_id=channel.pk,
        enabled=not channel.enabled,
    )
    return redirect("approvals:channels")


@role_required(REVIEWER)
@require_POST
def subscribe(request: HtmxHttpRequest) -> HttpResponse:
    """A reviewer's browser subscription (the JSON of PushSubscription.toJSON())."""
    try:
        body = json.loads(request.body or b"{}")
        channels_service.subscribe(
            user=request.user, endpoint=str(body.get("endpoint", "")), keys=body.get("keys")
        )
    except (ValueError, AttributeError):
        return JsonResponse({"error": "Send the subscription as JSON."}, status=400)
    except ServiceError as problem:
        return JsonResponse({"error": str(problem)}, status=400)
    return JsonResponse({"subscribed": True}, status=201)


@require_GET
def service_worker(request: HttpRequest) -> HttpResponse:
    """The push service worker, served under /approvals/ so that it may control it."""
    response = HttpResponse(SERVICE_WORKER.read_text(), content_type="text/javascript")
    response["Cache-Control"] = "no-cache"
    return response
