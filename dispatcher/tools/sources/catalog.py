"""The upstream tools the registry offers: built from the pinned rows, cached per process
until the generation changes (every change of servers or tools bumps it in its own
transaction, so a stale list is never used once the change is committed).

A server registered for a team serves that team's agents only; a server of no team
serves every agent. Lookups for a session name its agent's team (`team_id`): another
team's tool is then not offered, not resolved, and not even named as held, exactly as a
name nobody registered. `team_id=None` (no session: rules, the worker after admission)
sees every tool.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from dispatcher.tools.base import Tool, default_present_call
from dispatcher.tools.sources import services
from dispatcher.tools.sources.definitions import risk_flags
from dispatcher.tools.sources.models import SEPARATOR, Generation, McpServer, McpTool, ToolState
from floor.compiled import Compiled

if TYPE_CHECKING:
    # (Imported where first used, as in `services`: it imports the MCP SDK.)
    from dispatcher.tools.sources import upstream

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_cache: dict[str, Any] = {"generation": None, "tools": (), "by_name": {}, "teams": {}}
# The configurations builds offered tools of, by server, until the server is seen
# removed (under `_lock`): a call looked up in one may reach the pool after the removal.
_offered: dict[int, set[upstream.Endpoint]] = {}


# Read by every lookup of an upstream tool, several times per call (floor.compiled).
_GENERATION = Compiled(lambda pk: Generation.objects.filter(pk=pk).values_list("value")[:1])


def generation() -> int | None:
    """The current generation (None when the tables cannot be read: no upstream tools);
    inside `one_generation`, the one read at its first lookup."""
    pinned: list[int | None] | None = getattr(_pinned, "value", None)
    if pinned:
        return pinned[0]
    try:
        rows = _GENERATION.tuples(1)
        current = rows[0][0] if rows else 0
    except DatabaseError:
        logger.warning("upstream tools unavailable: cannot read the sources tables", exc_info=True)
        return None
    if pinned is not None:
        pinned.append(current)
    return current


# The generation one_generation() read, per thread: [] until its first lookup.
_pinned = threading.local()


@contextlib.contextmanager
def one_generation() -> Iterator[None]:
    """Inside, the generation is read once, at the first lookup of an upstream tool, and
    kept: one message's admission (and the inline run of its call) looks its tools up
    several times, and sees one list, as of that read. A change committed meanwhile
    applies from the next message on, as if it had been committed just after the read."""
    outer = getattr(_pinned, "value", None)
    outer_tables = getattr(_pinned, "tables", None)
    _pinned.value = outer if outer is not None else []
    _pinned.tables = outer_tables if outer is not None else []
    try:
        yield
    finally:
        _pinned.value, _pinned.tables = outer, outer_tables


def pin(value: int | None) -> None:
    """Inside `one_generation`, before its first lookup: the generation as a statement the
    caller sends anyway read it (admission's repeat count, `generation_sql`), so the
    lookups read none (a round trip fewer per message). The first value pinned is kept."""
    pinned: list[int | None] | None = getattr(_pinned, "value", None)
    if pinned is not None and not pinned:
        pinned.append(value if value is not None else 0)  # (no row yet: generation 0)


def generation_sql(quote: Callable[[str], str]) -> str:
    """A scalar subquery of the current generation, for `pin` (NULL when no change was
    ever made: generation 0)."""
    table, column = Generation._meta.db_table, str(Generation._meta.get_field("value").column)
    return f"(SELECT {quote(column)} FROM {quote(table)} WHERE {quote('id')} = 1)"  # noqa: S608


def serves(server_team: int | None, team_id: int | None) -> bool:
    """Does a server of `server_team` (None: the organization's) serve an agent of
    `team_id` (None: no agent named, every server)?"""
    return server_team is None or team_id is None or server_team == team_id


def upstream_tools(team_id: int | None = None) -> tuple[Tool, ...]:
    """Every offered upstream tool that serves `team_id`'s agents, by server and name."""
    current = generation()
    if current is None:
        return ()
    tools, _, teams = _tables(current)
    return tuple(t for t in tools if serves(teams.get(t.name), team_id))


_Tables = tuple[tuple[Tool, ...], dict[str, Tool], dict[str, int | None]]


def _tables(current: int) -> _Tables:
    """The cache's tools, by name and their teams, for `current`. Inside `one_generation`,
    the ones its first lookup saw, for every later lookup: the cache is one per process,
    and another thread that refreshed it meanwhile (a definition accepted) had the next
    lookup here rebuild it from the rows committed since, under the generation pinned
    here, so one message's lookups returned tools of two definitions (admission resolved
    one and decided on the other)."""
    held: list[_Tables] | None = getattr(_pinned, "tables", None)
    if held:
        return held[0]
    with _lock:
        if _cache["generation"] != current:
            tools, teams = _build()
            _cache.update(
                generation=current, tools=tools, by_name={t.name: t for t in tools}, teams=teams
            )
        tables = (_cache["tools"], _cache["by_name"], _cache["teams"])
    if held is not None:
        held.append(tables)
    return tables


def upstream_tool(name: str, team_id: int | None = None) -> Tool | None:
    if SEPARATOR not in name:
        return None
    current = generation()
    if current is None:  # (the tables cannot be read: no upstream tools, as upstream_tools)
        return None
    _, by_name, teams = _tables(current)
    if not serves(teams.get(name), team_id):
        return None
    return by_name.get(name)


def _build() -> tuple[tuple[Tool, ...], dict[str, int | None]]:
    from dispatcher.tools.sources import upstream

    rows = McpTool.objects.offered().select_related("server").order_by("server__name", "name")
    endpoints: dict[int, upstream.Endpoint] = {}
    tools = []
    teams: dict[str, int | None] = {}
    for row in rows:
        server = row.server
        teams[row.exposed_name] = server.team_id
        endpoint = endpoints.setdefault(server.pk, upstream.endpoint_of(server))
        flags = risk_flags(row.annotations, server.trust_annotations)
        tools.append(
            Tool(
                name=row.exposed_name,
                description=row.description,
                parameters=row.input_schema,
                execute=functools.partial(services.run_tool, endpoint, row.name, row.fingerprint),
                timeout=server.timeout,
                # A request to an HTTP server (stdio servers are processes: the worker's).
                inline=server.transport != "stdio",
                execute_async=(
                    functools.partial(services.run_tool_async, endpoint, row.name, row.fingerprint)
                    if server.transport != "stdio"
                    else None
                ),
                read_only=flags["read_only"],
                destructive=flags["destructive"],
                open_world=flags["open_world"],
                present_call=functools.partial(present_call, server.pk, row.fingerprint),
                binding=binding_of(server.pk, row.fingerprint),
                changed_since=functools.partial(
                    changed_since, server.name, row.name, server.pk, row.fingerprint
                ),
            )
        )
    # (the sessions of servers no longer offered as they were, closed: removed, changed;
    # a server offered before, or held a session of, and no longer offered is looked up:
    # removed, or not; a removed one is refused on every loop, held a session or not)
    held = upstream.POOL.held()
    gone = ({e.server_id for e in held} | _offered.keys()) - endpoints.keys()
    if gone:
        gone -= set(McpServer.objects.filter(pk__in=gone).values_list("pk", flat=True))
    removed = {e for e in held if e.server_id in gone}
    for server_id in gone:
        removed |= _offered.pop(server_id, set())
    for server_id, endpoint in endpoints.items():
        _offered.setdefault(server_id, set()).add(endpoint)
    upstream.POOL.keep_only(endpoints.values(), removed=removed)
    return tuple(tools), teams


def binding_of(server_id: int, fingerprint: str) -> dict[str, Any]:
    """The server registration and pinned definition (its fingerprint) a call of an
    upstream tool is admitted under (`Tool.binding`), and a reviewer is shown it under."""
    return {"server_id": server_id, "definition": fingerprint}


def present_call(
    server_id: int, fingerprint: str, arguments: dict[str, Any], workspace: Path
) -> dict[str, Any]:
    """What a reviewer is shown of an upstream tool's call: its arguments, and the server
    registration and pinned definition they are shown under (`binding_of`), which the
    approval binds (`changed_since`)."""
    shown = default_present_call(arguments, workspace)
    return {**shown, **binding_of(server_id, fingerprint)}


def changed_since(
    server: str,
    tool: str,
    server_id: int,
    fingerprint: str,
    arguments: dict[str, Any],
    workspace: Path,
    presentation: dict[str, Any],
) -> str | None:
    """Why an approved call must not run under the tool's server registration and
    definition now (`server_id`, `fingerprint`): the server was registered again (removed
    and added under its name: another program or URL), or an admin accepted another
    definition of the tool (description, schema or annotations), after the reviewer was
    shown the call, so what the reviewer approved was a call of another tool. None when
    it is the one shown (or the ask recorded none)."""
    if "server_id" in presentation and presentation["server_id"] != server_id:
        return (
            f"the MCP server '{server}' has been registered again since the reviewer was "
            "shown the call (its tools may now be another program's)"
        )
    shown = presentation.get("definition")
    if shown is None or shown == fingerprint:
        return None
    return (
        f"the MCP server '{server}' has had another definition of its tool '{tool}' "
        "accepted since the reviewer was shown the call"
    )


def held_message(name: str, team_id: int | None = None) -> str | None:
    """What the model reads when it calls an upstream tool that is not offered now
    (held for review, gone upstream, or unusable), or None for a name nobody registered
    (or a server that does not serve `team_id`'s agents)."""
    if SEPARATOR not in name:
        return None
    try:
        row = McpTool.objects.select_related("server").filter(exposed_name=name).first()
    except DatabaseError:
        return None
    if row is None or not serves(row.server.team_id, team_id):
        return None
    server = row.server.name
    if row.state in (ToolState.CHANGED, ToolState.NEW):
        what = "changed its definition" if row.state == ToolState.CHANGED else "added it"
        return (
            f"Tool '{name}' is held: the MCP server '{server}' {what} since an admin last "
            "approved its tools, and an admin must review it before it can be called. Do not "
            "retry it now; use another tool or ask the user."
        )
    if row.state == ToolState.MISSING:
        from dispatcher.tools.sources import upstream

        return upstream.messages_missing(server, row.name)
    return f"Tool '{name}' cannot be offered: {row.problem} Use another tool."
