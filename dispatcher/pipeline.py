"""The ten stages of a call (DESIGN section 2), in order, under their names.

    1 receive           services.receive          web process (admission)
    2 resolve           pipeline.resolve
    3 validate          pipeline.validate
    4 pre_execute       pipeline.pre_execute      settings.HARNESS_PRE_EXECUTE
    5 guards            pipeline.guards           settings.HARNESS_GUARDS
    - wait              approvals                 a human, an expiry or a cancel
    6 execute           pipeline.execute          Celery worker (execution)
    7 project_content   pipeline.project_content
    8 post_execute      pipeline.post_execute     settings.HARNESS_POST_EXECUTE
    9 finalize_content  pipeline.finalize_content
   10 result            execution.result

Stages 2 to 9 are here and write nothing; receive and result are state changes and live
with the other services. services.submit_calls and execution.execute_call run them in order.

At admission, stages 1 to 5 run in memory, and the message's calls are then written in
their decided state with their call.received and decision events, in one transaction:
the log shows each call received before it was decided, and nothing is decided without
its record. So pre_execute listeners and guards see a call only through its CallContext:
at admission its row is not in the database yet (neither are the earlier calls of the
same message). Guards run again in the worker, where the row exists.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string
from jsonschema.exceptions import ValidationError

from . import messages
from .context import CallContext, Decision
from .policy import run_guards, run_waterfall
from .registry import get_tool, unknown_tool_message, validator_for
from .tools.base import ExecutionContext, Tool, ToolError

logger = logging.getLogger(__name__)

STAGES = (
    "receive",
    "resolve",
    "validate",
    "pre_execute",
    "guards",
    "execute",
    "project_content",
    "post_execute",
    "finalize_content",
    "result",
)


class Rejection(Exception):
    """Stage 2 or 3 ended the call: `message` is what the model reads."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


def resolve(name: str) -> Tool:
    tool = get_tool(name)
    if tool is None:
        raise Rejection("resolve", unknown_tool_message(name))
    return tool


def validate(tool: Tool, arguments: dict[str, Any]) -> None:
    errors: list[ValidationError] = list(validator_for(tool).iter_errors(arguments))
    if errors:
        raise Rejection("validate", messages.invalid_arguments(tool.name, errors))


def pre_execute(call: CallContext) -> Decision:
    return run_waterfall(call)


def guards(call: CallContext) -> list[tuple[str, str]]:
    return run_guards(call)


def default_execute_wrapper(tool: Tool, ctx: ExecutionContext, arguments: dict[str, Any]) -> Any:
    """The place a deployment adds budgets, retries or metrics (none by default: principle 10)."""
    return tool.execute(ctx, arguments)


class Outcome:
    """What stage 6 produced: a value, a tool error, a crash, or a timeout."""

    def __init__(
        self, value: Any = None, error: BaseException | None = None, timed_out: bool = False
    ) -> None:
        self.value, self.error, self.timed_out = value, error, timed_out


def execute(tool: Tool, ctx: ExecutionContext, arguments: dict[str, Any]) -> Outcome:
    """Run the tool inside the execute wrapper with its host-only timeout.

    The tool's own timeout (e.g. run_command killing its process group) fires first; the
    thread join is the backstop for a body that ignores it.
    """
    wrapper = import_string(settings.HARNESS_EXECUTE_WRAPPER)
    outcome = Outcome()

    def target() -> None:
        try:
            outcome.value = wrapper(tool, ctx, arguments)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            outcome.error = exc

    thread = threading.Thread(target=target, name=f"tool-{ctx.call_id}", daemon=True)
    thread.start()
    thread.join(tool.timeout + 1.0)
    outcome.timed_out = thread.is_alive() or isinstance(outcome.error, TimeoutError)
    return outcome


def project_content(tool: Tool, outcome: Outcome) -> tuple[str, bool]:
    """Turn the outcome into model-facing content and is_error."""
    if isinstance(outcome.error, ToolError):
        return str(outcome.error), True
    if outcome.error is not None:
        logger.error("tool %s raised", tool.name, exc_info=outcome.error)
        return messages.tool_crashed(tool.name, outcome.error), True
    return tool.project_content(outcome.value), False


def post_execute(call: CallContext, content: str) -> str:
    for path in settings.HARNESS_POST_EXECUTE:
        content = import_string(path)(call, content)
    return content


def finalize_content(tool: Tool, content: str, *, repeat_count: int, raw_arguments: str) -> str:
    return tool.finalize_content(content) + messages.repeat_reminder(
        repeat_count, tool.name, raw_arguments
    )
