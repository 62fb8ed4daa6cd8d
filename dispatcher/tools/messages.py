"""What the model reads when a call does not simply succeed (docs/api.md, "Call states").

Each text says what happened and what to do next; none carries a traceback.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any

from django.conf import settings
from jsonschema.exceptions import ValidationError


def invalid_arguments(tool_name: str, errors: list[ValidationError]) -> str:
    """The model-facing text for a call whose arguments failed validation: one line per
    error, by path. (Paid on every rejected call: kept cheap; see bench S2.)"""
    if len(errors) > 1:
        errors = _by_path(errors)
    lines = "".join([f"\n- {_json_path(error)}: {_describe(error)}" for error in errors])
    return (
        f"Invalid arguments for '{tool_name}':{lines}\nFix these arguments and call the tool again."
    )


def _by_path(errors: list[ValidationError]) -> list[ValidationError]:
    try:
        if len(errors) == 2:  # the common case of several: no sort call (deques compare in C)
            return [errors[1], errors[0]] if errors[1].path < errors[0].path else errors
        return sorted(errors, key=attrgetter("path"))
    except TypeError:  # an index and a key at the same depth
        return sorted(errors, key=lambda e: [str(p) for p in e.path])


def _json_path(error: ValidationError) -> str:
    """error.json_path for the errors iter_errors yields (top level: path is absolute)."""
    path = "$"
    for part in error.path:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isascii() and part.isidentifier() and part[0].isalpha():  # jsonschema's rule
            path += "." + part
        else:
            path += "['" + part.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return path


def _describe(error: ValidationError) -> str:
    if error.validator == "type":
        return f"expected {error.validator_value}, got {type(error.instance).__name__} {_short(error.instance)}"
    if error.validator == "required":
        return str(error.message).replace("is a required property", "is required but missing")
    if error.validator == "additionalProperties":
        return f"{error.message}; remove it"
    return str(error.message)


def _short(value: Any, limit: int = 60) -> str:
    if type(value) is int:
        return str(value)
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def policy_denied(reason: str) -> str:
    return f"The call was denied by policy: {reason} Do not repeat it; choose another approach or ask the user."


def guard_denied(reasons: list[str]) -> str:
    return "The call was blocked by a safety guard: " + " ".join(reasons)


def definition_changed_since_admission(tool_name: str) -> str:
    return (
        f"Tool '{tool_name}' was not run: the tool's definition changed after this call was "
        "admitted (an admin accepted another definition of it, or registered its MCP server "
        "again), and the call was decided under the old one. Nothing was sent to the "
        "server; resend it to have it decided under the definition in force now."
    )


def credential_gone(agent_name: str) -> str:
    """Why a call is not started (run or released to its client) once a write that would
    start it found the credential that sent it dead (transitions.live_credential_sql)."""
    return (
        f"The credential this call was sent with no longer acts for the agent '{agent_name}' "
        "(it was signed out, revoked, rotated or voided, or the agent moved to another team) "
        "before the call ran, so it was not run. Sign in again (or use the agent's current "
        "token), then send it again."
    )


def reviewer_denied(reviewer: str, feedback: str) -> str:
    if feedback:
        return f"A reviewer ({reviewer}) denied this call. Their feedback: {feedback}"
    return f"A reviewer ({reviewer}) denied this call without feedback. Do not repeat it unchanged."


def cancelled(actor: str, reason: str) -> str:
    return f"The call was cancelled by {actor} before it ran." + (
        f" Reason: {reason}" if reason else ""
    )


def expired(minutes: float) -> str:
    return (
        f"Nobody approved this call within {minutes:g} minutes, so it was not run. "
        "Ask the user whether to try again later, or continue without it."
    )


def timed_out(tool_name: str, seconds: float) -> str:
    return (
        f"'{tool_name}' did not finish within its {seconds:g} s limit and was stopped. "
        "Any partial effects may remain; try a smaller or faster step."
    )


def tool_crashed(tool_name: str, exc: BaseException) -> str:
    """What the model reads of a body that crashed: the exception's type, never its text,
    which may hold what the host keeps from it (an upstream server's headers in a
    configuration's repr, a path, a credential). The text is in the host's log."""
    return (
        f"'{tool_name}' failed with an internal error ({type(exc).__name__}). "
        "Try again with other arguments."
    )


def outcome_unknown() -> str:
    return (
        "The worker running this call stopped before reporting a result, so it is not known "
        "whether the call took effect. It will not be re-run automatically; check the state "
        "(for example read the file or list the directory) before trying again."
    )


def repeat_reminder(count: int, tool_name: str, raw_arguments: str) -> str:
    """The note appended at the repeat thresholds: short at the first, detailed after."""
    thresholds = settings.HARNESS_REPEAT_THRESHOLDS
    if count not in thresholds:
        return ""
    if count == thresholds[0]:
        return (
            f"\n\n[Reminder: this is call #{count} of '{tool_name}' with exactly these arguments in "
            "this session. If it is not working, try something different.]"
        )
    preview = raw_arguments[: settings.HARNESS_REPEAT_PREVIEW_CHARS]
    if len(raw_arguments) > len(preview):
        preview += "…"
    return (
        f"\n\n[Repeated call: '{tool_name}' has now been called {count} times in this session with "
        f"identical arguments: {preview}. Repeating an identical call gives the same outcome; change "
        "the arguments or the approach, or ask the user for help.]"
    )


def edited(reviewer: str, tool_name: str, tool_use_id: str, arguments_json: str) -> str:
    """The note the model reads when a reviewer changed its call's arguments: what ran
    instead. The replacement's own result follows it in the same tool result."""
    return (
        f"[A reviewer ({reviewer}) changed the arguments of this call before it ran. It was "
        f"run as call '{tool_use_id}' of '{tool_name}' with these arguments instead: "
        f"{arguments_json}. What follows is that call's result.]"
    )


def repreviewed(tool_name: str, tool_use_id: str, reason: str, *, diff: bool = False) -> str:
    """The note the model reads when an approved preview could not be applied because the
    workspace changed: nothing ran; the same call was previewed again and asks again.
    `diff`: an approved ask whose presentation no longer holds (a file tool's diff whose
    file changed; an upstream tool whose definition changed): nothing ran."""
    if diff:
        return (
            f"[A reviewer approved this '{tool_name}' call as it was shown, but {reason}, so "
            f"it did not run and nothing was written. Harness showed it again as call "
            f"'{tool_use_id}', which a reviewer must approve again. What follows is that "
            "call's result.]"
        )
    return (
        f"[A reviewer approved the previewed effect of this '{tool_name}' call, but {reason}, "
        "so nothing was applied and the command did not run. Harness previewed it again as "
        f"call '{tool_use_id}', which a reviewer must approve again. What follows is that "
        "call's result.]"
    )


def ran_not_applied(tool_name: str, why: str) -> str:
    """Appended to the result of an approved call whose previewed effect could not be
    applied, so the command ran for real after the approval (`why`:
    Effect.not_appliable's fixed words, never a path): the model is told what ran."""
    return (
        f"\n\n[Note: the approved preview of this '{tool_name}' call could not be applied "
        f"({why}), so the command ran for real after the approval; the result above is that "
        "run's.]"
    )


def apply_failed(tool_name: str, error: str) -> str:
    """Applying an approved previewed effect failed partway: the workspace changed under
    it from outside Harness. What the model reads: the workspace may hold part of it."""
    return (
        f"Applying the approved effect of this '{tool_name}' call failed partway ({error}): "
        "something outside Harness changed the workspace meanwhile, so it may hold part of "
        "the effect. Look at the files involved before calling again."
    )
