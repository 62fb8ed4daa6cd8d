"""Stages 2 to 5 of a call, as pure functions that write nothing: resolve, validate,
pre-execute (the waterfall), guards. Admission runs them on a new call, the worker runs
the guards again before it claims, and the simulator and the backtest run them on calls
that are never stored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError
from referencing.exceptions import Unresolvable

from dispatcher.policy import layers
from dispatcher.policy.context import CallContext, Decision
from dispatcher.policy.guards import prompted_paths
from dispatcher.policy.waterfall import run_guards, run_waterfall
from dispatcher.tools import messages
from dispatcher.tools.base import Tool
from dispatcher.tools.registry import (
    API_CLIENT,
    get_tool,
    unknown_tool_message,
    validator_for,
)


class Rejection(Exception):
    """Stage 2 or 3 ended the call: `Rejection(stage, message)`, where `message` is what
    the model reads.

    No `__init__` of its own: the exception keeps its two values in `args`, set by
    BaseException's constructor in C. A Python-level constructor (a frame, a call to
    super, an instance dictionary) was a measurable part of S2's invalid path
    (docs/benchmarks.md has the figures).
    """

    args: tuple[str, str]

    @property
    def stage(self) -> str:
        return self.args[0]

    @property
    def message(self) -> str:
        return self.args[1]

    def __str__(self) -> str:
        return self.args[1]


def resolve(name: str, client: str = API_CLIENT, team_id: int | None = None) -> Tool:
    """The tool `name` in the tool set of the session's `client`, as an agent of
    `team_id` sees it (another team's MCP server is no tool of it; see the registry)."""
    tool = get_tool(name, client, team_id)
    if tool is None:
        raise Rejection("resolve", unknown_tool_message(name, client, team_id))
    return tool


def validate(tool: Tool, arguments: dict[str, Any]) -> None:
    try:
        errors: list[ValidationError] = list(validator_for(tool).iter_errors(arguments))
    except (Unresolvable, RecursionError) as failed:
        # A schema that is valid JSON Schema but cannot be applied (an upstream tool's
        # `$ref` that leads nowhere, or into a loop): the arguments cannot be checked, so
        # the call is refused, saying why (never a 500 the agent would retry for ever).
        why = "a $ref that cannot be resolved" if isinstance(failed, Unresolvable) else None
        raise Rejection(
            "validate",
            f"The input schema of tool '{tool.name}' cannot be applied "
            f"({why or 'a loop of $refs'}), so its arguments cannot be checked and the "
            "call was not run. Use another tool, or ask the user to have an admin look at "
            "the tool's definition.",
        ) from None
    if errors:
        raise Rejection("validate", messages.invalid_arguments(tool.name, errors))


def pre_execute(call: CallContext) -> Decision:
    """The waterfall's decision, with what the layers' log-only rules would have done
    (recorded on it, deciding nothing); an allow of paths Harness cannot confine asks
    (`unconfined_paths`)."""
    decision = unconfined_paths(call, run_waterfall(call))
    if layers.has_trials(call):
        found = layers.trials(call, decision)
        if found:
            return dataclasses.replace(decision, log_only=found)
    return decision


def unconfined_paths(call: CallContext, decision: Decision) -> Decision:
    """`decision`, or an ask in place of its allow when the call names paths on the
    client's disk that Harness has nothing to confine to: a client's tool asked about
    through the permission prompt (`guards.prompted_paths`: Claude Code's `Edit`), of an
    agent with no configured workspace. The prompt is not told the client's project
    directory, as the hook is, so a person decides where no guard can (fail closed)."""
    if decision.action != "allow" or call.agent_workspace:
        return decision
    asked = prompted_paths(call)
    if not asked:
        return decision
    return Decision(
        "ask",
        "policy:unconfined-paths",
        f"'{asked[0].name}' names paths on the client's disk, and Harness cannot confine them: "
        f"the agent '{call.agent_name}' has no configured workspace, so the permission "
        "prompt's project directory is unknown. Asked instead of allowed "
        f"({decision.by}: {decision.reason}). Give the agent a workspace (its project "
        "directory) to have these paths confined to it.",
    )


def guards(call: CallContext) -> GuardDenial | None:
    """Stage 5: every guard runs; the denial when any gave a reason, else None."""
    denials = run_guards(call)
    return GuardDenial(tuple(denials)) if denials else None


@dataclass(frozen=True)
class GuardDenial:
    """What the guards said, as one decision: built here only (admission, the worker's
    re-check and the simulator all read it from this)."""

    denials: tuple[tuple[str, str], ...]  # (guard name, reason), in the guards' order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.denials)

    @property
    def reasons(self) -> list[str]:
        return [reason for _, reason in self.denials]

    @property
    def decision(self) -> Decision:
        return Decision("deny", "guard:" + ",".join(self.names), " ".join(self.reasons))

    @property
    def message(self) -> str:
        """What the model reads."""
        return messages.guard_denied(self.reasons)
