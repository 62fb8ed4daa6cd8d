"""Every change of upstream MCP servers and their tools: one transaction each, with its
audit event, a new ServerVersion, and the registry's generation bumped.

Registration pins each tool's definition (its fingerprint). A refresh compares what the
server lists now with the pins: a changed or new tool is held (not offered, its calls
rejected) until an admin accepts it; a tool gone upstream is marked missing, never
dropped silently. Talking to the server happens before the transaction opens.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from audit import kinds
from audit.services import record_event
from dispatcher.tools import sandbox_servers
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.sources.definitions import (
    Definition,
    exposed_name,
    server_name_problem,
    unusable,
)
from dispatcher.tools.sources.models import (
    Generation,
    McpServer,
    McpTool,
    ServerVersion,
    ToolState,
    Transport,
)
from floor.errors import ServiceError
from teams.models import Team

if TYPE_CHECKING:
    # (Imported where first used: `upstream` imports the MCP SDK, half a second of every
    # process's start-up, and a process that never talks to an MCP server (a management
    # command, the export) need not pay it. After the first, such an import is a lookup.)
    from dispatcher.tools.sources import upstream


@dataclass
class RefreshReport:
    """What a registration or refresh found, tool by tool (upstream names)."""

    server: str
    unchanged: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    returned: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)

    def as_payload(self) -> dict[str, list[str]]:
        return {k: v for k, v in self.__dict__.items() if k != "server" and v}


def _bump_generation() -> None:
    """A new generation: a value never seen before (a clock reading, not a counter, so a
    rolled-back change cannot leave a process's cache matching a later generation)."""
    value = time.time_ns()
    if not Generation.objects.filter(pk=1).update(value=value):
        try:
            with transaction.atomic():
                Generation.objects.create(pk=1, value=value)
        except IntegrityError:  # created concurrently
            Generation.objects.filter(pk=1).update(value=value)


def _record(server: McpServer, change: str, kind: str, actor: str, extra: dict[str, Any]) -> None:
    snapshot = {
        **server.masked(),
        "tools": {
            t.name: {"state": t.state, "fingerprint": t.fingerprint} for t in server.tools.all()
        },
    }
    ServerVersion.objects.create(
        server_name=server.name,
        version=server.version,
        change=change,
        actor=actor,
        snapshot=snapshot,
    )
    record_event(
        kind=kind,
        actor=actor,
        subject=f"mcp_server:{server.name}",
        payload={"server": server.masked(), "version": server.version, **extra},
    )
    _bump_generation()


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """K=V pairs from the command line or the form; ServiceError names a bad one."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ServiceError(f"{what} {item!r} must be written KEY=VALUE.")
        pairs[key] = value
    return pairs


def add_server(
    *,
    name: str,
    actor: str,
    command: list[str] | None = None,
    url: str = "",
    env: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    paths: list[str] | None = None,
    trust_annotations: bool = False,
    timeout: float = 60.0,
    team: Team | None = None,
) -> tuple[McpServer, RefreshReport]:
    """Register a server: connect, list its tools, pin each definition. With `team`, its
    tools serve that team's agents only (catalog.serves); without, every agent. Raises
    ServiceError (bad name or configuration, name taken, server unreachable)."""
    _check_configuration(name, command, url, paths, timeout, env or {})
    if McpServer.objects.filter(name=name).exists():
        raise ServiceError(f"An MCP server named '{name}' is registered already.")
    server = McpServer(
        name=name,
        transport=Transport.STDIO if command else Transport.HTTP,
        command=list(command or []),
        url=url,
        env=dict(env or {}),
        headers=dict(headers or {}),
        paths=list(paths or []),
        trust_annotations=trust_annotations,
        timeout=timeout,
        created_by=actor,
        team=team,
    )
    definitions = _fetch(server)
    report = RefreshReport(server=name)
    with transaction.atomic():
        try:
            server.save()
        except IntegrityError:
            raise ServiceError(f"An MCP server named '{name}' is registered already.") from None
        now = timezone.now()
        for definition in definitions:
            problem = unusable(name, definition)
            _pin(
                server,
                definition,
                ToolState.UNUSABLE if problem else ToolState.ACTIVE,
                actor,
                now,
                problem or "",
            )
            (report.unusable if problem else report.unchanged).append(definition.name)
        extra = {"tools": report.as_payload(), "team": team.name if team else None}
        _record(server, "added", kinds.MCP_SERVER_ADDED, actor, extra)
    return server, report


def _check_configuration(
    name: str,
    command: list[str] | None,
    url: str,
    paths: list[str] | None,
    timeout: float,
    env: dict[str, str],
) -> None:
    """Raises ServiceError naming the first thing wrong with a server's configuration."""
    problem = server_name_problem(name)
    if problem:
        raise ServiceError(problem)
    if bool(command) == bool(url):
        raise ServiceError("Give exactly one of a command (stdio) or a URL (streamable HTTP).")
    if url and not url.startswith(("http://", "https://")):
        raise ServiceError(f"URL {url!r} must start with http:// or https://.")
    if not 0 < timeout <= 3600:
        raise ServiceError("The timeout must be between 0 and 3600 seconds.")
    if paths and not command:
        raise ServiceError("Paths are for stdio servers (the sandbox they run in).")
    for path in paths or []:
        problem = sandbox_servers.server_path_problem(path)
        if problem:
            raise ServiceError(problem)
    problem = sandbox_servers.environment_problem(env) if command else None
    if problem:
        raise ServiceError(problem)


def _fetch(server: McpServer) -> list[Definition]:
    from dispatcher.tools.sources import upstream

    try:
        return upstream.list_definitions(upstream.endpoint_of(server))
    except upstream.UpstreamError as exc:
        raise ServiceError(
            f"Could not list the tools of MCP server '{server.name}': {exc}"
        ) from exc


def _pin(
    server: McpServer, definition: Definition, state: str, actor: str, now: Any, problem: str = ""
) -> McpTool:
    return McpTool.objects.create(
        server=server,
        name=definition.name,
        exposed_name=exposed_name(server.name, definition.name)[:240],
        state=state,
        problem=problem,
        description=definition.description,
        input_schema=definition.input_schema,
        annotations=definition.annotations,
        fingerprint=definition.fingerprint,
        accepted_by=actor if state == ToolState.ACTIVE else "",
        accepted_at=now if state == ToolState.ACTIVE else None,
    )


def refresh_server(*, name: str, actor: str) -> RefreshReport:
    """List the server's tools again and compare them with the pins. Raises ServiceError."""
    server = _get(name)
    definitions = {d.name: d for d in _fetch(server)}
    report = RefreshReport(server=name)
    with transaction.atomic():
        server = McpServer.objects.select_for_update().get(pk=server.pk)
        now = timezone.now()
        rows = {row.name: row for row in server.tools.all()}
        for tool_name, definition in definitions.items():
            row = rows.get(tool_name)
            if row is None:
                problem = unusable(name, definition)
                tool = _pin(server, definition, ToolState.NEW, actor, now, problem or "")
                if problem:
                    tool.state = ToolState.UNUSABLE
                    tool.save(update_fields=["state"])
                    report.unusable.append(tool_name)
                else:
                    _see(tool, definition, now)
                    report.new.append(tool_name)
                continue
            _compare(row, name, definition, now, report)
        for tool_name, row in rows.items():
            if tool_name not in definitions and row.state != ToolState.MISSING:
                row.state = ToolState.MISSING
                row.save(update_fields=["state"])
                report.missing.append(tool_name)
        server.version = F("version") + 1
        server.save(update_fields=["version", "updated_at"])
        server.refresh_from_db()
        _record(
            server, "refreshed", kinds.MCP_SERVER_REFRESHED, actor, {"tools": report.as_payload()}
        )
    return report


def _see(row: McpTool, definition: Definition, now: Any) -> None:
    row.seen_description = definition.description
    row.seen_input_schema = definition.input_schema
    row.seen_annotations = definition.annotations
    row.seen_fingerprint = definition.fingerprint
    row.seen_at = now
    row.save()


def _compare(
    row: McpTool, server: str, definition: Definition, now: Any, report: RefreshReport
) -> None:
    problem = unusable(server, definition)
    if problem:  # not offered, whatever it was
        row.state, row.problem = ToolState.UNUSABLE, problem
        row.save(update_fields=["state", "problem"])
        report.unusable.append(row.name)
        return
    if row.state == ToolState.NEW:  # not accepted yet: the review shows what it lists now
        _see(row, definition, now)
        report.new.append(row.name)
        return
    if definition.fingerprint == row.fingerprint:
        (report.unchanged if row.state == ToolState.ACTIVE else report.returned).append(row.name)
        row.state, row.problem = ToolState.ACTIVE, ""
        row.seen_description, row.seen_input_schema, row.seen_annotations = "", None, None
        row.seen_fingerprint = ""
        row.save()
        return
    row.state, row.problem = ToolState.CHANGED, ""
    _see(row, definition, now)
    report.changed.append(row.name)


def accept_tool(
    *, exposed: str, fingerprint: str, actor: str, trusts_annotations: bool = True
) -> McpTool:
    """An admin accepts the definition a held tool (changed or new) shows now, having
    seen the one with `fingerprint`: it is pinned and offered again. Raises ServiceError
    when the tool is not held or the definition changed again since it was shown, and,
    without `trusts_annotations` (a team admin, who may not trust a server's annotations),
    when the server's annotations are trusted and the new definition changes them: a
    trusted `readOnlyHint` runs a tool under the organization's read_only ceiling."""
    with transaction.atomic():
        row = (
            McpTool.objects.select_for_update()
            .select_related("server")
            .filter(exposed_name=exposed)
            .first()
        )
        if row is None or row.state not in (ToolState.CHANGED, ToolState.NEW):
            raise ServiceError(f"'{exposed}' is not waiting for review.")
        if row.seen_fingerprint != fingerprint:
            raise ServiceError(
                f"The definition of '{exposed}' changed again since it was shown; review it again."
            )
        if (
            not trusts_annotations
            and row.server.trust_annotations
            and (row.seen_annotations or {}) != (row.annotations or {})
        ):
            raise ServiceError(
                f"Only an organization admin accepts new annotations of '{exposed}': its "
                "server's annotations are trusted, and a trusted readOnlyHint lets a tool "
                "run under the organization's read_only ceiling."
            )
        before = {
            "description": row.description,
            "inputSchema": row.input_schema,
            "annotations": row.annotations,
            "fingerprint": row.fingerprint,
        }
        row.description = row.seen_description
        row.input_schema = row.seen_input_schema or {}
        row.annotations = row.seen_annotations or {}
        row.fingerprint = row.seen_fingerprint
        row.seen_description, row.seen_input_schema, row.seen_annotations = "", None, None
        row.seen_fingerprint = ""
        row.state = ToolState.ACTIVE
        row.accepted_by, row.accepted_at = actor, timezone.now()
        row.save()
        server = row.server
        server.version = F("version") + 1
        server.save(update_fields=["version", "updated_at"])
        server.refresh_from_db()
        _record(
            server,
            "tool accepted",
            kinds.MCP_TOOL_ACCEPTED,
            actor,
            {
                "tool": row.exposed_name,
                "before": before,
                "after": {
                    "description": row.description,
                    "inputSchema": row.input_schema,
                    "annotations": row.annotations,
                    "fingerprint": row.fingerprint,
                },
            },
        )
    return row


def remove_server(*, name: str, actor: str) -> None:
    """Unregister a server: its tools are no longer offered and their calls rejected."""
    with transaction.atomic():
        server = McpServer.objects.select_for_update().filter(name=name).first()
        if server is None:
            raise ServiceError(f"No MCP server named '{name}' is registered.")
        server.version += 1
        _record(server, "removed", kinds.MCP_SERVER_REMOVED, actor, {})
        server.delete()


def _get(name: str) -> McpServer:
    server = McpServer.objects.filter(name=name).first()
    if server is None:
        # (No list of the registered names: a team admin's refresh that lost a race with a
        # removal read here every team's server names.)
        raise ServiceError(f"No MCP server named '{name}' is registered.")
    return server


def run_tool(
    endpoint: upstream.Endpoint,
    tool: str,
    fingerprint: str,
    ctx: ExecutionContext,
    arguments: dict[str, Any],
) -> str:
    """An upstream tool's body (in a worker). When the server lists the tool otherwise
    than pinned, the call is not made: the tool is held (or marked missing) at once, as a
    refresh would, and the model reads why."""
    from dispatcher.tools.sources import upstream

    try:
        return upstream.execute(endpoint, tool, fingerprint, ctx, arguments)
    except upstream.DefinitionChanged as exc:
        note_listing(server_id=endpoint.server_id, tool=tool, definition=exc.definition)
        raise _not_as_pinned(endpoint, tool, exc.definition) from None


async def run_tool_async(
    endpoint: upstream.Endpoint,
    tool: str,
    fingerprint: str,
    ctx: ExecutionContext,
    arguments: dict[str, Any],
) -> str:
    """`run_tool` awaited on the web request's loop (the inline lane: Tool.execute_async);
    a changed definition is noted on a thread."""
    from dispatcher.tools.sources import upstream

    try:
        return await upstream.execute_async(endpoint, tool, fingerprint, ctx, arguments)
    except upstream.DefinitionChanged as exc:
        definition = exc.definition
    await asyncio.to_thread(_note_listing_and_close, endpoint.server_id, tool, definition)
    raise _not_as_pinned(endpoint, tool, definition)


def _not_as_pinned(
    endpoint: upstream.Endpoint, tool: str, definition: Definition | None
) -> ToolError:
    """What the model reads of a call not made: the server lists `tool` otherwise than
    pinned (`definition`), or not at all (None)."""
    from dispatcher.tools.sources import upstream

    if definition is None:
        return ToolError(upstream.messages_missing(endpoint.name, tool))
    return ToolError(upstream.messages_changed(endpoint.name, tool))


def _note_listing_and_close(server_id: int, tool: str, definition: Definition | None) -> None:
    try:
        note_listing(server_id=server_id, tool=tool, definition=definition)
    finally:
        connections.close_all()  # (this thread's own connection, back to the pool)


def note_listing(*, server_id: int, tool: str, definition: Definition | None) -> None:
    """A worker saw the server list `tool` as `definition` (None: not at all), unlike its
    pin: held as changed, or marked missing, with its audit event."""
    with transaction.atomic():
        row = (
            McpTool.objects.select_for_update()
            .select_related("server")
            .filter(server_id=server_id, name=tool)
            .first()
        )
        if row is None or row.state != ToolState.ACTIVE:
            return
        if definition is None:
            row.state = ToolState.MISSING
            row.save(update_fields=["state"])
        elif definition.fingerprint != row.fingerprint:
            row.state = ToolState.CHANGED
            _see(row, definition, timezone.now())
        else:
            return
        server = row.server
        server.version = F("version") + 1
        server.save(update_fields=["version", "updated_at"])
        server.refresh_from_db()
        _record(
            server,
            f"tool {row.state} (seen by a worker)",
            kinds.MCP_TOOL_CHANGED,
            "worker",
            {
                "tool": row.exposed_name,
                "state": row.state,
                "seen_fingerprint": row.seen_fingerprint,
            },
        )
