"""The tool registry: the tools named in settings.HARNESS_TOOLS, then the tools of the
upstream MCP servers an admin registered (`SERVER__tool`, dispatcher.tools.sources), with
compiled validators; and the tool sets of clients that run their tools themselves
(settings.HARNESS_CLIENT_TOOLS).

A session resolves names in one set only, chosen by the way it came in
(`AgentSession.client`): a client with a tool set of its own (a Claude Code session)
resolves that set; every other session (the agent API, the MCP gateway) the
HARNESS_TOOLS and the upstream tools. So `Bash` is no tool of an API session, and
`run_command` none of a Claude Code session.

A session also names its agent's team (`team_id`): an upstream server registered for
another team is no tool of it (catalog.serves). `team_id=None` is no session's view: every
tool (rules, the simulator without a session, the worker once a call was admitted).
"""

from __future__ import annotations

import difflib
import functools

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator

from dispatcher.tools.base import ClientToolset, Tool
from dispatcher.tools.sources import catalog

API_CLIENT = "api"


@functools.cache
def _load(paths: tuple[str, ...]) -> tuple[Tool, ...]:
    return tuple(import_string(path) for path in paths)


def builtin_tools() -> tuple[Tool, ...]:
    """The tools of settings.HARNESS_TOOLS, in settings order (no database read: start-up
    checks use these; checks report duplicates and bad entries)."""
    return _load(tuple(settings.HARNESS_TOOLS))


def all_tools(team_id: int | None = None) -> tuple[Tool, ...]:
    """Every tool a session of the agent API (of an agent of `team_id`) may call: the
    built-in ones, then the offered upstream tools that serve the team (a tool held for
    review or gone upstream is not among them)."""
    return builtin_tools() + catalog.upstream_tools(team_id)


@functools.cache
def _by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


@functools.cache
def _toolset(path: str) -> ClientToolset:
    return import_string(path)  # type: ignore[no-any-return]


def client_toolset(client: str) -> ClientToolset | None:
    """The tool set of `client` ("claude-code"), or None for clients without their own."""
    path = settings.HARNESS_CLIENT_TOOLS.get(client)
    return _toolset(path) if path else None


def client_toolsets() -> list[ClientToolset]:
    return [_toolset(path) for path in settings.HARNESS_CLIENT_TOOLS.values()]


# Inside, upstream tools are looked up in one list (catalog.one_generation): one message's
# admission and its inline run.
one_generation = catalog.one_generation


def get_tool(name: str, client: str = API_CLIENT, team_id: int | None = None) -> Tool | None:
    """The tool `name` as a session of `client`, of an agent of `team_id`, resolves it
    (see the module docstring)."""
    toolset = client_toolset(client) if client != API_CLIENT else None
    if toolset is not None:
        return _by_name(toolset.tools).get(name) or toolset.fallback(name)
    return _by_name(builtin_tools()).get(name) or catalog.upstream_tool(name, team_id)


def rule_tool(name: str) -> Tool | None:
    """The tool a permission rule naming `name` is checked against: a HARNESS_TOOLS or
    upstream tool, else one of a client's tool sets (rules are per user, whatever way a
    call comes in)."""
    tool = get_tool(name)
    for toolset in client_toolsets():
        tool = tool or _by_name(toolset.tools).get(name) or toolset.rule_fallback(name)
    return tool


def client_rule_tool(name: str) -> Tool | None:
    """The tool of a client's tool sets a rule naming `name` is checked against (rule_tool
    without the registry: for rules checked against a given list of registered tools,
    those of a team admin's teams)."""
    for toolset in client_toolsets():
        tool = _by_name(toolset.tools).get(name) or toolset.rule_fallback(name)
        if tool is not None:
            return tool
    return None


def tool_names(client: str = API_CLIENT, team_id: int | None = None) -> list[str]:
    toolset = client_toolset(client) if client != API_CLIENT else None
    return [tool.name for tool in (toolset.tools if toolset else all_tools(team_id))]


@functools.lru_cache(maxsize=4096)  # bounded: clients' fallback tools are made per name
def validator_for(tool: Tool) -> Draft202012Validator:
    """A Draft 2020-12 validator compiled once per tool (docs/benchmarks.md says why)."""
    return Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)


def unknown_tool_message(name: str, client: str = API_CLIENT, team_id: int | None = None) -> str:
    if client_toolset(client) is None:
        held = catalog.held_message(name, team_id)
        if held is not None:
            return held
    names = tool_names(client, team_id)
    message = f"Tool '{name}' does not exist. Available tools: {', '.join(names)}."
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5) or difflib.get_close_matches(
        name.lower().replace("-", "_"), names, n=1, cutoff=0.5
    )
    if close:
        message += f" Did you mean '{close[0]}'?"
    return message
