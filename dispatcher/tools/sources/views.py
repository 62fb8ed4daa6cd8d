"""The /tools/ pages (admins only): upstream MCP servers, their tools, and the side-by-side
review of a held definition. Every change is a POST through `services`.

An organization admin sees and changes every server and registers servers for a team or
for everyone; a team's admin sees and changes their teams' servers only, and registers
servers for their teams (`request.reach`, read with the role; teams.scope). Another
team's server is not found."""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.contrib import messages
from django.db.models import Exists, OuterRef
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from audit.roles import ADMIN, HtmxHttpRequest, role_required
from dispatcher.tools import sandbox, sandbox_servers
from dispatcher.tools.sources import services
from dispatcher.tools.sources.management.report import LINES
from dispatcher.tools.sources.models import McpServer, McpTool, ServerVersion, ToolState
from floor.errors import ServiceError
from teams.models import Team


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _servers(request: HtmxHttpRequest) -> Any:
    """The servers this admin manages: a team admin's teams' (the organization's servers
    are the organization admins')."""
    return request.reach.filter(McpServer.objects.all(), "team_id")


def _reached(request: HtmxHttpRequest, name: str) -> None:
    if not _servers(request).filter(name=name).exists():
        raise Http404(f"No MCP server named '{name}' is registered for your teams.")


@role_required(ADMIN)
def index(request: HtmxHttpRequest) -> HttpResponse:
    servers = _servers(request).select_related("team").prefetch_related("tools")
    versions = ServerVersion.objects.order_by("-created_at")
    if not request.reach.everything:
        # Their servers' own versions: those recorded since the server of that name was
        # registered. A removed server's history is the organization's, also once another
        # team registers a server of the same name.
        versions = versions.filter(
            Exists(
                _servers(request).filter(
                    name=OuterRef("server_name"), created_at__lte=OuterRef("created_at")
                )
            )
        )
    return render(
        request,
        "sources/index.html",
        {
            "servers": servers,
            "held": McpTool.objects.held().filter(server__in=servers).select_related("server"),
            "versions": versions[:20],
            "teams": list(request.reach.filter(Team.objects.all(), "pk")),
            "everyone": request.reach.everything,
            "form": request.POST if request.method == "POST" else {},
        },
    )


def _team(request: HtmxHttpRequest, name: str) -> Team | None:
    """The team a new server is for (None: every team's agents, organization admins
    only). Raises ServiceError for a team this admin does not reach."""
    if not name and request.reach.everything:
        return None
    team = request.reach.filter(Team.objects.all(), "pk").filter(name=name).first()
    if team is None:
        raise ServiceError("Choose the team whose agents the server serves (one of yours).")
    return team


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _team_admin_may_register(command: list[str], paths: list[str], env: dict[str, str]) -> None:
    """What a team's admin may not give a server (ServiceError saying why): paths on the
    host, which the server sees (another team's fixed workspace, any directory the sandbox
    user reads), as they give no agent a fixed workspace, whether as Paths or as a file
    the command names that the sandbox would show it to start (an npm prefix, a virtual
    environment: sandbox_servers.beyond_what_is_shown); and with the sandbox off, a
    stdio command at all, which would run as Harness at registration."""
    if paths:
        raise ServiceError(
            "Only an organization admin gives a server paths on the host: leave Paths empty "
            "(the server starts in a private /tmp), or ask an organization admin."
        )
    if command and sandbox.mode() == "off":
        raise ServiceError(
            "With HARNESS_SANDBOX=off a stdio server runs as Harness on the host, so only an "
            "organization admin registers one: register a streamable HTTP server instead."
        )
    beyond = sandbox_servers.beyond_what_is_shown(command, env) if command else None
    if beyond is not None:
        raise ServiceError(
            f"Only an organization admin runs a server from a program or with files outside "
            f"the system directories ({beyond[:300]}): the sandbox would show the server "
            "what lies there (a whole npm prefix or virtual environment). Use programs of "
            "/usr or /bin, or ask an organization admin (HARNESS_SANDBOX_READ_ONLY)."
        )


@require_POST
@role_required(ADMIN)
def add(request: HtmxHttpRequest) -> HttpResponseBase:
    data = request.POST
    try:
        team = _team(request, data.get("team", "").strip())
        command = shlex.split(data.get("command", "")) if data.get("transport") == "stdio" else []
        env = services.parse_pairs(_lines(data.get("env", "")), "Variable")
        trust_annotations = data.get("trust_annotations") == "on"
        if not request.reach.everything:
            _team_admin_may_register(command, _lines(data.get("paths", "")), env)
            if trust_annotations:
                # A trusted `readOnlyHint` makes a tool read-only to Harness: it runs under
                # the organization's read_only ceiling, and unasked in standard mode, on the
                # word of a server whose hints a team admin may write themselves.
                raise ServiceError(
                    "Only an organization admin trusts a server's annotations: a trusted "
                    "readOnlyHint lets a tool run under the organization's read_only "
                    "ceiling. Register it without trusting them."
                )
        server, report = services.add_server(
            name=data.get("name", "").strip(),
            actor=_actor(request),
            command=command,
            url=data.get("url", "").strip() if data.get("transport") == "http" else "",
            env=env,
            headers=services.parse_pairs(_lines(data.get("headers", "")), "Header"),
            paths=_lines(data.get("paths", "")),
            trust_annotations=trust_annotations,
            timeout=float(data.get("timeout") or 60),
            team=team,
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
def refresh(request: HtmxHttpRequest, name: str) -> HttpResponse:
    _reached(request, name)
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
def remove(request: HtmxHttpRequest, name: str) -> HttpResponse:
    _reached(request, name)
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
def review(request: HtmxHttpRequest, exposed: str) -> HttpResponse:
    tools = McpTool.objects.filter(server__in=_servers(request)).select_related("server")
    tool = get_object_or_404(tools, exposed_name=exposed)
    if request.method == "POST":
        try:
            services.accept_tool(
                exposed=exposed,
                fingerprint=request.POST.get("fingerprint", ""),
                actor=_actor(request),
                trusts_annotations=request.reach.everything,
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
