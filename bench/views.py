"""Baseline views for bench/run.py: the floor Harness is measured against."""

from __future__ import annotations

import itertools
import json
import uuid

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from audit.models import AuditEvent

_CHAIN = f"bench-{uuid.uuid4().hex[:16]}"  # one chain per server process; seq unique within it
_SEQ = itertools.count(1)
_HASH = "0" * 64


async def trivial(request: HttpRequest) -> HttpResponse:
    """The trivial async view of the middleware/server-overhead scenario."""
    return JsonResponse({"ok": True})


async def insert(request: HttpRequest) -> HttpResponse:
    """Bare baseline for an admitted call: parse the same body, one INSERT of an audit row, 202."""
    body = json.loads(request.body)
    call = body["calls"][0]
    event = await AuditEvent.objects.acreate(
        chain=_CHAIN,
        seq=next(_SEQ),
        kind="call.received",
        actor="agent:bench",
        subject=f"call:{uuid.uuid4()}",
        payload={"tool_use_id": call["id"], "name": call["name"], "arguments": call["arguments"]},
        created_at=timezone.now(),
        prev_hash=_HASH,
        hash=_HASH,
    )
    return JsonResponse({"id": event.pk, "status": "queued"}, status=202)


async def push(request: HttpRequest) -> HttpResponse:
    """S4 baseline: one audit INSERT, then a raw group_send of a payload of the given size
    to the approvals group through the same channel layer (what the product pushes to)."""
    from channels.layers import get_channel_layer

    from approvals import live

    body = json.loads(request.body)
    token, size = body["token"], int(body["size"])
    event = await AuditEvent.objects.acreate(
        chain=_CHAIN,
        seq=next(_SEQ),
        kind="call.received",
        actor="agent:bench",
        subject=f"call:{uuid.uuid4()}",
        payload={"token": token},
        created_at=timezone.now(),
        prev_hash=_HASH,
        hash=_HASH,
    )
    html = f'<div id="bench-{token}">' + "x" * max(0, size - len(token) - 23) + "</div>"
    layer = get_channel_layer()
    await layer.group_send(live.GROUP, {"type": "queue.push", "html": html})
    return JsonResponse({"id": event.pk}, status=202)
