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

from django.core.management.base import BaseCommand, CommandParser

from ._hook_settings import (
    MARGIN,
    REPORT_TIMEOUT,
    add_arguments,
    checked,
    credentials_note,
    fail_closed,
    reporting,
)

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
    # Claude Code's own sandbox (bubblewrap + seccomp on Linux) confines the Bash tool's
    # commands; failIfUnavailable makes claude refuse to start rather than run them
    # unconfined, and allowUnsandboxedCommands=false ignores the model's
    # dangerouslyDisableSandbox. Outside it: the hooks (harness-hook), MCP servers, and the
    # file tools (Read/Edit/Write), which Harness's hook still gates (docs/security.md).
    sandbox = {"enabled": True, "failIfUnavailable": True, "allowUnsandboxedCommands": False}
    return {"hooks": hooks, "sandbox": sandbox}


class Command(BaseCommand):
    help = (
        "Print Claude Code settings (JSON) whose hooks ask Harness before every tool call. "
        "The token is read from $HARNESS_TOKEN, never written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser, "Claude Code")

    def handle(
        self, *args: Any, agent: str, url: str, wait: float, command: str, **options: Any
    ) -> None:
        url, owners = checked(agent, url, wait)
        self.stdout.write(json.dumps(hook_settings(url, command, wait), indent=2))
        self.stderr.write(credentials_note("Claude Code", "claude", agent, owners, url))
