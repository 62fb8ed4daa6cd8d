"""The tool registry: the tools named in settings.HARNESS_TOOLS, with compiled validators,
and the tool sets of clients that run their tools themselves (settings.HARNESS_CLIENT_TOOLS).

A session resolves names in one set only, chosen by the way it came in
(`AgentSession.client`): sessions of the agent API ("api") the HARNESS_TOOLS, a Claude
Code session Claude Code's tools. So `Bash` is no tool of an API session, and
`run_command` none of a Claude Code session.
"""

from __future__ import annotations

import difflib
import functools

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator

from dispatcher.tools.base import ClientToolset, Tool

API_CLIENT = "api"


@functools.cache
def _load(paths: tuple[str, ...]) -> tuple[Tool, ...]:
    return tuple(import_string(path) for path in paths)


def all_tools() -> tuple[Tool, ...]:
    """Every registered tool, in settings order (checks report duplicates and bad entries)."""
    return _load(tuple(settings.HARNESS_TOOLS))


@functools.cache
def _by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


@functools.cache
def _toolset(path: str) -> ClientToolset:
    return import_string(path)  # type: ignore[no-any-return]


def client_toolset(client: str) -> ClientToolset | None:
    """The tool set of `client` ("claude-code"), or None for the API and unknown clients."""
    path = settings.HARNESS_CLIENT_TOOLS.get(client)
    return _toolset(path) if path else None


def client_toolsets() -> list[ClientToolset]:
    return [_toolset(path) for path in settings.HARNESS_CLIENT_TOOLS.values()]


def get_tool(name: str, client: str = API_CLIENT) -> Tool | None:
    """The tool `name` as a session of `client` resolves it (see the module docstring)."""
    if client == API_CLIENT:
        return _by_name(all_tools()).get(name)
    toolset = client_toolset(client)
    if toolset is None:
        return None  # a client with no tool set resolves nothing: fail closed
    return _by_name(toolset.tools).get(name) or toolset.fallback(name)


def rule_tool(name: str) -> Tool | None:
    """The tool a permission rule naming `name` is checked against: a HARNESS_TOOLS tool,
    else one of a client's tool sets (rules are per user, whatever way a call comes in)."""
    tool = get_tool(name)
    for toolset in client_toolsets():
        tool = tool or _by_name(toolset.tools).get(name) or toolset.rule_fallback(name)
    return tool


def tool_names(client: str = API_CLIENT) -> list[str]:
    toolset = client_toolset(client) if client != API_CLIENT else None
    return [tool.name for tool in (toolset.tools if toolset else all_tools())]


@functools.lru_cache(maxsize=4096)  # bounded: clients' fallback tools are made per name
def validator_for(tool: Tool) -> Draft202012Validator:
    """A Draft 2020-12 validator compiled once per tool (docs/benchmarks.md says why)."""
    return Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)


def unknown_tool_message(name: str, client: str = API_CLIENT) -> str:
    names = tool_names(client)
    message = f"Tool '{name}' does not exist. Available tools: {', '.join(names)}."
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5) or difflib.get_close_matches(
        name.lower().replace("-", "_"), names, n=1, cutoff=0.5
    )
    if close:
        message += f" Did you mean '{close[0]}'?"
    return message
