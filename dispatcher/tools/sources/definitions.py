"""An upstream tool's definition: its fingerprint, its name in Harness, its risk flags.

The fingerprint is the SHA-256 of the canonical JSON of name, description, input schema
and annotations: what a model reads and what Harness decides on. A change of any of them
is a changed definition, held until an admin accepts it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from dispatcher.tools.base import storable_text
from dispatcher.tools.sources.models import SEPARATOR

# A name every model SDK accepts (OpenAI: ^[a-zA-Z0-9_-]{1,64}$; Anthropic likewise).
EXPOSED_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*$")
HINTS = ("readOnlyHint", "destructiveHint", "openWorldHint", "idempotentHint", "title")


@dataclass(frozen=True)
class Definition:
    """One tool as an upstream server lists it (only the fields Harness pins)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]

    problem: str = ""  # set when the server sent what no database can store

    @classmethod
    def from_mcp(cls, tool: Any) -> Definition:
        """From an `mcp.types.Tool` (extra fields the server sent are not pinned). Text no
        database can keep (a NUL character, a lone surrogate) is written out, and such a
        tool gets a `problem`: it is registered as unusable, never offered."""
        annotations = (
            tool.annotations.model_dump(by_alias=True, exclude_none=True)
            if tool.annotations
            else {}
        )
        annotations = {k: v for k, v in annotations.items() if k in HINTS}
        name, description = storable_text(tool.name), storable_text(tool.description or "")
        schema = dict(tool.input_schema)
        problem = ""
        if name != tool.name or description != (tool.description or ""):
            problem = "Its name or description holds a NUL character or invalid Unicode."
        if not _storable(schema) or not _storable(annotations):
            problem = "Its input schema or annotations hold a NUL character or invalid Unicode."
            schema, annotations = {}, {}
        return cls(name, description, schema, annotations, problem)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        }

    @functools.cached_property
    def fingerprint(self) -> str:
        """The definition's digest (its pin). Kept once computed: an upstream call checks
        its session's definition against the pin on every call (`upstream.Pool._call_on`),
        and a frozen definition's fields are not changed after it is built."""
        text = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _storable(value: Any) -> bool:
    text = json.dumps(value, ensure_ascii=False)
    return "\\u0000" not in text and storable_text(text) == text


def exposed_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def server_name_problem(name: str) -> str | None:
    if len(name) > 32 or not SERVER_NAME.match(name) or SEPARATOR in name:
        return (
            f"Server name {name!r} must start with a letter and hold only letters, digits and "
            "single '-' or '_' between them (at most 32 characters): its tools are named "
            f"NAME{SEPARATOR}tool."
        )
    return None


def unusable(server: str, definition: Definition) -> str | None:
    """Why the tool cannot be offered (its name or schema), or None."""
    if definition.problem:
        return definition.problem
    name = exposed_name(server, definition.name)
    if not EXPOSED_NAME.match(name):
        return (
            f"'{name}' is not a name every model SDK accepts (letters, digits, '_' and '-', "
            "at most 64 characters)."
        )
    try:
        Draft202012Validator.check_schema(definition.input_schema)
    except SchemaError as exc:
        return f"Its input schema is not valid JSON Schema: {exc.message}."
    if definition.input_schema.get("type") != "object":
        return "Its input schema is not of type 'object'."
    outside = _reference_outside(definition.input_schema)
    if outside is not None:
        return (
            f"Its input schema refers to {outside[:200]!r}, outside itself; Harness never "
            "fetches a schema, so calls could not be checked."
        )
    return None


def _reference_outside(schema: Any) -> str | None:
    """The first `$ref` (or `$dynamicRef`) of `schema` that is not to a part of itself
    ("#..."), or None."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                    if not value.startswith("#"):
                        return value
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return None


def risk_flags(annotations: dict[str, Any], trusted: bool) -> dict[str, bool]:
    """The Tool's risk flags from MCP annotations. Untrusted hints relax nothing: such a
    tool is never read-only and may reach the outside world; a hint that restricts
    (destructiveHint true) is honoured either way, and wins over a trusted readOnlyHint:
    hints that contradict each other never relax anything."""
    destructive = annotations.get("destructiveHint") is True
    if not trusted:
        return {"read_only": False, "destructive": destructive, "open_world": True}
    read_only = annotations.get("readOnlyHint") is True and not destructive
    return {
        "read_only": read_only,
        "destructive": destructive,
        "open_world": annotations.get("openWorldHint") is not False,
    }
