"""The /tools/ pages (admins only): upstream MCP servers, their tools, and the side-by-side
review of a held definition. Every change is a POST through `services`."""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from audit.roles import ADMIN, role_required
from dispatcher.tools.sources import services
from dispatcher.tools.sources.management.report import LINES
from dispatcher.tools.sources.models import McpServer, McpTool, ServerVersion, ToolState
from floor.errors import ServiceError


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


@role_required(ADMIN)
def index(request: HttpRequest) -> HttpResponse:
    servers = McpServer.objects.prefetch_related("tools")
    return render(
        request,
        "sources/index.html",
        {
            "servers": servers,
            "held": McpTool.objects.held().select_related("server"),
            "versions": ServerVersion.objects.order_by("-created_at")[:20],
            "form": request.POST if request.method == "POST" else {},
        },
    )


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


@require_POST
@role_required(ADMIN)
def add(request: HttpRequest) -> HttpResponseBase:
    data = request.POST
    try:
        command = shlex.split(data.get("command", "")) if data.get("transport") == "stdio" else []
        server, report = services.add_server(
            name=data.get("name", "").strip(),
            actor=_actor(request),
            command=command,
            url=data.get("url", "").strip() if data.get("transport") == "http" else "",
            env=services.parse_pairs(_lines(data.get("env", "")), "Variable"),
            headers=services.parse_pairs(_lines(data.get("headers", "")), "Header"),
            paths=_lines(data.get("paths", "")),
            trust_annotations=data.get("trust_annotations") == "on",
            timeout=float(data.get("timeout") or 60),
        )
    except (ServiceError, ValueError) as exc:
        messages.error(request, str(exc))
        return index(request)
    messages.success(
        request, f"Registered '{server.name}': {len(report.unchanged)} tools pinned and offered."
    )
    return redirect("sources:index")


@require_POST
@role_required(ADMIN)
def refresh(request: HttpRequest, name: str) -> HttpResponse:
    try:
        report = services.refresh_server(name=name, actor=_actor(request))
    except ServiceError as exc:
        messages.error(request, str(exc))
        return redirect("sources:index")
    found = [f"{name}__{tool}: {LINES[key]}" for key in LINES for tool in getattr(report, key)]
    messages.success(request, f"Refreshed '{name}'. " + "; ".join(found))
    return redirect("sources:index")


@require_POST
@role_required(ADMIN)
def remove(request: HttpRequest, name: str) -> HttpResponse:
    try:
        services.remove_server(name=name, actor=_actor(request))
    except ServiceError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Removed '{name}'; its tools are no longer offered.")
    return redirect("sources:index")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)


@role_required(ADMIN)
def review(request: HttpRequest, exposed: str) -> HttpResponse:
    tool = get_object_or_404(McpTool.objects.select_related("server"), exposed_name=exposed)
    if request.method == "POST":
        try:
            services.accept_tool(
                exposed=exposed,
                fingerprint=request.POST.get("fingerprint", ""),
                actor=_actor(request),
            )
        except ServiceError as exc:
            messages.error(request, str(exc))
            return redirect("sources:review", exposed=exposed)
        messages.success(request, f"Accepted the new definition of {exposed}; it is offered again.")
        return redirect("sources:index")
    held = tool.state in (ToolState.CHANGED, ToolState.NEW)
    rows = [
        ("Description", tool.description, tool.seen_description),
        ("Input schema", _pretty(tool.input_schema), _pretty(tool.seen_input_schema)),
        ("Annotations", _pretty(tool.annotations), _pretty(tool.seen_annotations)),
        ("Fingerprint", tool.fingerprint, tool.seen_fingerprint),
    ]
    return render(
        request,
        "sources/review.html",
        {
            "tool": tool,
            "held": held,
            "rows": [(label, old, new, old != new) for label, old, new in rows],
        },
    )
