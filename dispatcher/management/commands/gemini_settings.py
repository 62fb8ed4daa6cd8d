"""`manage.py gemini_settings --agent NAME [--url URL]`: Gemini CLI settings whose hooks
make Harness the permission authority (docs/coding-agents.md).

Prints one JSON object, ready to be `.gemini/settings.json` (or merged into
`~/.gemini/settings.json`, or the system settings `/etc/gemini-cli/settings.json` of an
organization). No secret: the hook reads the agent's token from HARNESS_TOKEN. Command
hooks (`harness-hook --agent gemini`), the only kind Gemini CLI has; it blocks a tool only
when the hook exits 2 or answers deny, which the hook does on any failure.

Gemini CLI's own sandbox (`tools.sandbox`) runs in docker or podman; where neither exists
Gemini CLI refuses to start with it on, so it is left off here: add
`"tools": {"sandbox": "docker"}` where docker or podman is installed (docs/coding-agents.md).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ._hook_settings import (
    MARGIN,
    REPORT_TIMEOUT,
    add_arguments,
    checked,
    credentials_note,
    hook_commands,
)

RECORDED_EVENTS = ("SessionStart", "BeforeAgent", "AfterAgent", "SessionEnd")


def hook_settings(url: str, command: str, wait: float) -> dict[str, Any]:
    """The settings object: every tool asks Harness first (no matcher: all tools); results
    and session events are reported. Gemini CLI's hook timeouts are milliseconds."""
    ask_line, report_line = hook_commands(command, "gemini", url, wait)
    ask = {
        "name": "harness",
        "type": "command",
        "command": ask_line,
        "timeout": (int(wait) + MARGIN) * 1000,
        "description": "Asks Harness whether the tool may run.",
    }
    report = {
        "name": "harness-report",
        "type": "command",
        "command": report_line,
        "timeout": REPORT_TIMEOUT * 1000,
    }
    hooks: dict[str, Any] = {
        "BeforeTool": [{"hooks": [ask]}],
        "AfterTool": [{"hooks": [report]}],
    }
    for event in RECORDED_EVENTS:
        hooks[event] = [{"hooks": [report]}]
    return {"hooks": hooks}


class Command(BaseCommand):
    help = (
        "Print Gemini CLI settings (JSON) whose hooks ask Harness before every tool call. "
        "The token is read from $HARNESS_TOKEN, never written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser, "Gemini CLI")

    def handle(
        self, *args: Any, agent: str, url: str, wait: float, command: str, **options: Any
    ) -> None:
        url, owners = checked(agent, url, wait)
        self.stdout.write(json.dumps(hook_settings(url, command, wait), indent=2))
        self.stderr.write(credentials_note("Gemini CLI", "gemini", agent, owners, url))
