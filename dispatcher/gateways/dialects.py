"""Stage 1's parsing: the three submission dialects in, and results out in the same dialect.

Bodies are accepted exactly as the OpenAI and Anthropic Python SDKs dump their response
objects: fields the contract does not name are ignored, never an error.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dispatcher.models import Dialect
from dispatcher.proposals import ProposedCall, canonical_json


class DialectError(ValueError):
    """The body is JSON but matches no dialect; the message says what was expected."""


MAX_ID_LENGTH = 200


class UnstorableJSON(ValueError):
    """Valid JSON that no database can keep as it is; the message says what to change."""


def _reject_constant(name: str) -> Any:
    raise UnstorableJSON(f"{name} is not a JSON number; send a finite number or a string.")


def loads(text: str | bytes, *, checked: bool = True) -> Any:
    """Strict JSON: no NaN/Infinity, and nothing PostgreSQL or SQLite would refuse or alter
    (NUL characters, lone UTF-16 surrogates, a number too large for a float), unless
    `checked` is False (the caller checks or cleans it: `check_storable`,
    `storable_copy`). Raises ValueError (JSONDecodeError or UnstorableJSON) or
    RecursionError for nesting Python cannot follow."""
    value = json.loads(text, parse_constant=_reject_constant)
    if checked:
        check_storable(value)
    return value


# How deep a stored value may nest: what reads a call's arguments after the JSON readers
# (the audit copy's masking, the policy's matchers) recurses a frame or more per level, and
# a request thread starts some fifty frames deep; 200 levels is past any tool's schema.
MAX_DEPTH = 200


def check_storable(value: Any) -> None:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list) and depth >= MAX_DEPTH:
            raise UnstorableJSON(
                f"A value is nested more than {MAX_DEPTH} levels deep; send a flatter one."
            )
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, float) and not math.isfinite(item):
            # (1e400 is valid JSON that Python reads as infinity, which jsonb refuses)
            raise UnstorableJSON(
                "A number is too large to store (such as 1e400); send a smaller number or a string."
            )


def storable_copy(value: Any) -> Any:
    """`value` with its text made storable: a NUL character or a lone UTF-16 surrogate
    becomes U+FFFD. For what a client reports (a tool's output, a prompt): it is kept
    as near as it can be, where refusing it would lose it."""
    if isinstance(value, str):
        return (
            value.replace("\x00", "\ufffd")
            .encode("utf-16", "surrogatepass")
            .decode("utf-16", "replace")
        )
    if isinstance(value, dict):
        return {storable_copy(key): storable_copy(child) for key, child in value.items()}
    if isinstance(value, list):
        return [storable_copy(child) for child in value]
    return value


def _check_text(text: str) -> None:
    if "\x00" in text:
        raise UnstorableJSON("A string contains a NUL character (\\u0000); remove it.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnstorableJSON(
            "A string contains a lone UTF-16 surrogate (such as \\ud800); send valid Unicode."
        ) from None


def _require_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise DialectError(f"{where} must be a non-empty string.")
    if len(value) > MAX_ID_LENGTH:
        raise DialectError(f"{where} is longer than {MAX_ID_LENGTH} characters.")
    return value


def _from_object(tool_use_id: str, name: str, arguments: Any, where: str) -> ProposedCall:
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ProposedCall(
            tool_use_id, name, canonical_json(arguments), None, f"{where} must be a JSON object."
        )
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def _openai(body: dict[str, Any]) -> list[ProposedCall]:
    calls = []
    for i, item in enumerate(body["tool_calls"] or []):
        where = f"tool_calls[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
            raise DialectError(f"{where} must be an object with a 'function' object.")
        tool_use_id = _require_str(item.get("id"), f"{where}.id")
        function = item["function"]
        name = _require_str(function.get("name"), f"{where}.function.name")
        raw = function.get("arguments", "")
        if not isinstance(raw, str):
            raise DialectError(
                f"{where}.function.arguments must be a JSON text (a string), as OpenAI sends it."
            )
        try:
            parsed = loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError) as exc:
            calls.append(
                ProposedCall(
                    tool_use_id, name, raw, None, f"The arguments are not valid JSON: {exc}."
                )
            )
            continue
        if not isinstance(parsed, dict):
            calls.append(
                ProposedCall(tool_use_id, name, raw, None, "The arguments must be a JSON object.")
            )
            continue
        calls.append(ProposedCall(tool_use_id, name, raw, parsed))
    return calls


def _anthropic(body: dict[str, Any]) -> list[ProposedCall]:
    calls = []
    for i, block in enumerate(body["content"]):
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue  # text, thinking and other blocks are not calls
        where = f"content[{i}]"
        tool_use_id = _require_str(block.get("id"), f"{where}.id")
        name = _require_str(block.get("name"), f"{where}.name")
        calls.append(_from_object(tool_use_id, name, block.get("input"), f"{where}.input"))
    return calls


def _native(body: dict[str, Any]) -> list[ProposedCall]:
    if not isinstance(body["calls"], list):
        raise DialectError("'calls' must be a list of {id, name, arguments}.")
    calls = []
    for i, item in enumerate(body["calls"]):
        where = f"calls[{i}]"
        if not isinstance(item, dict):
            raise DialectError(f"{where} must be an object with id, name and arguments.")
        tool_use_id = _require_str(item.get("id"), f"{where}.id")
        name = _require_str(item.get("name"), f"{where}.name")
        calls.append(_from_object(tool_use_id, name, item.get("arguments"), f"{where}.arguments"))
    return calls


def parse_submission(body: Any) -> tuple[str, list[ProposedCall]]:
    """Detect the dialect from the body's shape and return (dialect, calls).

    Raises DialectError naming the three accepted shapes when nothing matches.
    """
    if isinstance(body, dict):
        dialect: str
        if "tool_calls" in body and isinstance(body.get("tool_calls"), list | None):
            calls = _openai(body)
            dialect = Dialect.OPENAI
        elif isinstance(body.get("content"), list) and body.get("role", "assistant") == "assistant":
            calls, dialect = _anthropic(body), Dialect.ANTHROPIC
        elif "calls" in body:
            calls, dialect = _native(body), Dialect.NATIVE
        else:
            calls, dialect = [], ""
        if dialect:
            if not calls:
                raise DialectError("The message contains no tool calls.")
            ids = [c.tool_use_id for c in calls]
            if len(set(ids)) != len(ids):
                raise DialectError(
                    "Two calls in one message share an id; every tool call id must be unique."
                )
            return dialect, calls
    raise DialectError(
        "The body matches no accepted shape. Send an OpenAI assistant message "
        '({"role": "assistant", "tool_calls": [...]}), an Anthropic assistant message '
        '({"role": "assistant", "content": [{"type": "tool_use", ...}]}) or '
        '{"calls": [{"id", "name", "arguments"}]}.'
    )


def format_results(dialect: str, results: list[tuple[str, str, bool]]) -> Any:
    """Terminal calls' results as `(tool_use_id, content, is_error)`, in the request's dialect."""
    if dialect == Dialect.OPENAI:
        return [
            {"role": "tool", "tool_call_id": tid, "content": content} for tid, content, _ in results
        ]
    if dialect == Dialect.ANTHROPIC:
        return {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tid,
                    "content": content,
                    "is_error": is_error,
                }
                for tid, content, is_error in results
            ],
        }
    return [
        {"id": tid, "content": content, "is_error": is_error} for tid, content, is_error in results
    ]
