"""What a tool is: a model-facing face and a host-only face (DESIGN section 1, principle 2)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ToolError(Exception):
    """Raised by a tool body for a failure the model should read (becomes is_error=True)."""


@dataclass(frozen=True)
class ExecutionContext:
    """What a tool body gets besides its arguments. It knows nothing of policy or audit."""

    workspace: Path
    call_id: str
    timeout: float
    output_limit: int
    # The call's arguments exactly as logged (an upstream MCP tool sends these bytes).
    raw_arguments: str = ""

    def resolve(self, relative: str) -> Path:
        """The workspace path for `relative`. Guards have already confined it."""
        return (self.workspace / relative).resolve()


def default_project_content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def default_finalize_content(content: str) -> str:
    return content


def default_present_call(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    return {"kind": "arguments", "text": json.dumps(arguments, indent=2, ensure_ascii=False)}


def default_present_result(content: str) -> dict[str, Any]:
    return {"kind": "text", "text": content}


@dataclass(frozen=True, eq=False)  # identity hashing: a tool is one registry entry
class Tool:
    # --- model-facing: the only fields `model_facing_schema` may read -----------------
    name: str
    description: str
    parameters: dict[str, Any]
    defer_loading: bool = False
    # --- host-only: never shown to a model ----------------------------------------------
    execute: Callable[[ExecutionContext, dict[str, Any]], Any] = field(
        default=lambda ctx, args: None
    )
    output_schema: dict[str, Any] | None = None
    project_content: Callable[[Any], str] = default_project_content
    finalize_content: Callable[[str], str] = default_finalize_content
    timeout: float = 30.0
    is_concurrency_safe: bool = False
    present_call: Callable[[dict[str, Any], Path], dict[str, Any]] = default_present_call
    present_result: Callable[[str], dict[str, Any]] = default_present_result
    # Risk annotations: modes are built on these, never on tool names.
    read_only: bool = False
    destructive: bool = False
    open_world: bool = False
    # Names of arguments that are paths inside the workspace (the confinement guard
    # checks them; path rules match them).
    path_arguments: tuple[str, ...] = ()
    # Name of the argument holding an argv list (the command guard checks it).
    command_argument: str | None = None
    # Decide-only: the client runs the tool (Claude Code's own tools, an MCP client's);
    # Harness decides, never executes, and records what the client reports.
    client_executed: bool = False


def model_facing_schema(tool: Tool, format: str = "native") -> dict[str, Any]:
    """The model-facing definition of `tool` in one SDK's format.

    Names the allowed fields one by one (name, description, parameters, defer_loading;
    for MCP, its annotations read from the risk flags): it never copies the definition
    and filters, so a new host-only field cannot leak.
    """
    if format == "openai":
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
    if format == "anthropic":
        schema: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.parameters,
        }
        if tool.defer_loading:
            schema["defer_loading"] = True
        return schema
    if format == "native":
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "defer_loading": tool.defer_loading,
        }
    if format == "mcp":
        return {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": tool.parameters,
            # Harness's own reading of the tool (for an upstream tool: its hints as far as
            # they are trusted), so a client shows what Harness will treat it as.
            "annotations": {
                "readOnlyHint": tool.read_only,
                "destructiveHint": tool.destructive,
                "openWorldHint": tool.open_world,
            },
        }
    raise ValueError(f"Unknown format {format!r}; use native, openai, anthropic or mcp.")
