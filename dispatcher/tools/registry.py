"""The tool registry: the tools named in settings.HARNESS_TOOLS, with compiled validators."""

from __future__ import annotations

import difflib
import functools

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema import Draft202012Validator

from dispatcher.tools.base import Tool


@functools.cache
def _load(paths: tuple[str, ...]) -> tuple[Tool, ...]:
    return tuple(import_string(path) for path in paths)


def all_tools() -> tuple[Tool, ...]:
    """Every registered tool, in settings order (checks report duplicates and bad entries)."""
    return _load(tuple(settings.HARNESS_TOOLS))


@functools.cache
def _by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {tool.name: tool for tool in tools}


def get_tool(name: str) -> Tool | None:
    return _by_name(all_tools()).get(name)


@functools.cache
def validator_for(tool: Tool) -> Draft202012Validator:
    """A Draft 2020-12 validator compiled once per tool (docs/benchmarks.md says why)."""
    return Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)


def unknown_tool_message(name: str) -> str:
    names = [tool.name for tool in all_tools()]
    message = f"Tool '{name}' does not exist. Available tools: {', '.join(names)}."
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5) or difflib.get_close_matches(
        name.lower().replace("-", "_"), names, n=1, cutoff=0.5
    )
    if close:
        message += f" Did you mean '{close[0]}'?"
    return message
