"""The tool registry: the tools named in settings.HARNESS_TOOLS, then the tools of the
upstream MCP servers an admin registered (`SERVER__tool`, dispatcher.tools.sources), with
compiled validators."""

from __future__ import annotations

import difflib
import functools

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator

from dispatcher.tools.base import Tool
from dispatcher.tools.sources import catalog


@functools.cache
def _load(paths: tuple[str, ...]) -> tuple[Tool, ...]:
    return tuple(import_string(path) for path in paths)


def builtin_tools() -> tuple[Tool, ...]:
    """The tools of settings.HARNESS_TOOLS, in settings order (no database read: start-up
    checks use these; checks report duplicates and bad entries)."""
    return _load(tuple(settings.HARNESS_TOOLS))


def all_tools() -> tuple[Tool, ...]:
    """Every registered tool: the built-in ones, then the offered upstream tools (a
    tool held for review or gone upstream is not among them)."""
    return builtin_tools() + catalog.upstream_tools()


@functools.cache
def _by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


def get_tool(name: str) -> Tool | None:
    """The tool called `name`: built-in first; an upstream name (`SERVER__tool`) is looked
    up in the sources, cached until they change."""
    return _by_name(builtin_tools()).get(name) or catalog.upstream_tool(name)


@functools.cache
def validator_for(tool: Tool) -> Draft202012Validator:
    """A Draft 2020-12 validator compiled once per tool (one-shot validate() is ~45x slower)."""
    return Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)


def unknown_tool_message(name: str) -> str:
    held = catalog.held_message(name)
    if held is not None:
        return held
    names = [tool.name for tool in all_tools()]
    message = f"Tool '{name}' does not exist. Available tools: {', '.join(names)}."
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5) or difflib.get_close_matches(
        name.lower().replace("-", "_"), names, n=1, cutoff=0.5
    )
    if close:
        message += f" Did you mean '{close[0]}'?"
    return message
