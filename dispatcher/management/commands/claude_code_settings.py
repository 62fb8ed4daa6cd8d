"""`manage.py claude_code_settings --agent NAME [--url URL]`: Claude Code settings that make
Harness the permission authority (docs/claude-code.md).

Prints one JSON object, ready to be `.claude/settings.json` (or merged into an
organization's managed settings). It holds no secret: the hook reads the agent's token
from the environment variable HARNESS_TOKEN. The hooks are command hooks (the
`harness-hook` console script), because a command hook that exits 2 blocks the tool when
Harness cannot answer, while an HTTP hook whose server is unreachable lets it run.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.models import Agent

from ._hook_settings import fail_closed, reporting

# PreToolUse may wait this long for a reviewer; Claude Code's hook timeout is set above it.
DEFAULT_WAIT = 570
MARGIN = 30  # seconds between Harness's deadline and Claude Code's hook timeout
REPORT_TIMEOUT = 30
RECORDED_EVENTS = ("SessionStart", "UserPromptSubmit", "Stop", "SessionEnd")


def hook_settings(url: str, command: str, wait: float) -> dict[str, Any]:
    """The settings object: every tool asks Harness first; results and session events are
    reported. The URL is on the hook's command line; the token never is (HARNESS_TOKEN)."""
    base = f"{command} --url {shlex.quote(url)}"
    ask_line = fail_closed(f"{base} --wait {wait:g}")
    ask = {"type": "command", "command": ask_line, "timeout": int(wait) + MARGIN}
    report_line = reporting(f"{base} --wait 0")
    report = {"type": "command", "command": report_line, "timeout": REPORT_TIMEOUT}
    # A tool's result is reported in the background ("async": Claude Code goes on without
    # waiting): it decides nothing, and waiting for it cost every tool call a second hook
    # round trip (docs/benchmarks.md, S13). A report that never arrives leaves the call
    # `unreported` when its lease ends, never `completed`.
    result = {**report, "async": True}
    hooks: dict[str, Any] = {
        "PreToolUse": [{"matcher": "*", "hooks": [ask]}],
        "PostToolUse": [{"matcher": "*", "hooks": [result]}],
        "PostToolUseFailure": [{"matcher": "*", "hooks": [result]}],
    }
    for event in RECORDED_EVENTS:
        hooks[event] = [{"hooks": [report]}]
    return {"hooks": hooks}


class Command(BaseCommand):
    help = (
        "Print Claude Code settings (JSON) whose hooks ask Harness before every tool call. "
        "The token is read from $HARNESS_TOKEN, never written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--agent", required=True, help="Name of the agent Claude Code acts as.")
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="Harness's base URL, as clients see it."
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=DEFAULT_WAIT,
            help="Seconds a tool call may wait for a reviewer before it is denied.",
        )
        parser.add_argument(
            "--command",
            default="harness-hook",
            help="How the developer's machine runs the hook (default: the harness-hook script).",
        )

    def handle(
        self, *args: Any, agent: str, url: str, wait: float, command: str, **options: Any
    ) -> None:
        found = Agent.objects.filter(name=agent).select_related("owner").order_by("-created_at")
        active = [a for a in found if a.is_active]
        if not active:
            raise CommandError(
                f"No active agent named '{agent}'. Create one with "
                f"`manage.py create_agent {agent} --owner USER` and keep its token."
            )
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"--url must be an http(s) URL, not {url!r}.")
        if wait < 0:
            raise CommandError("--wait must be zero or more seconds.")
        self.stdout.write(json.dumps(hook_settings(url.rstrip("/"), command, wait), indent=2))
        owners = ", ".join(sorted({a.owner.get_username() for a in active}))
        self.stderr.write(
            f"Claude Code acts as agent '{agent}' (owner {owners}): export HARNESS_TOKEN with "
            "that agent's token before starting claude."
        )
