"""`manage.py codex_settings --agent NAME [--url URL] [--format toml|json]`: Codex CLI
hooks that make Harness the permission authority (docs/coding-agents.md).

Prints the hooks as `config.toml` tables (for `~/.codex/config.toml`, a project's
`.codex/config.toml`, or the `[hooks]` of a managed `requirements.toml`), or with
`--format json` as a `hooks.json` file. No secret: the hook reads the agent's token from
HARNESS_TOKEN. Command hooks (`harness-hook --agent codex`), because Codex has no HTTP
hook, and a command hook that exits 2 is the only failure that blocks the tool.
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

TOOL_EVENTS = ("PreToolUse", "PostToolUse")
RECORDED_EVENTS = ("SessionStart", "UserPromptSubmit", "Stop")


def hook_settings(url: str, command: str, wait: float) -> dict[str, Any]:
    """The hooks object: every tool asks Harness first; results and session events are
    reported. Codex's hook timeouts are seconds."""
    ask_line, report_line = hook_commands(command, "codex", url, wait)
    ask = {
        "type": "command",
        "command": ask_line,
        "timeout": int(wait) + MARGIN,
        "statusMessage": "Asking Harness",
    }
    report = {"type": "command", "command": report_line, "timeout": REPORT_TIMEOUT}
    hooks: dict[str, Any] = {
        "PreToolUse": [{"matcher": "*", "hooks": [ask]}],
        "PostToolUse": [{"matcher": "*", "hooks": [report]}],
    }
    for event in RECORDED_EVENTS:
        hooks[event] = [{"hooks": [report]}]
    # Codex's workspace-write sandbox: commands write only inside the project (and tmp).
    return {"sandbox_mode": "workspace-write", "hooks": hooks}


def _toml_value(value: Any) -> str:
    # JSON strings and integers are valid TOML basic strings and integers.
    return json.dumps(value)


def as_toml(settings: dict[str, Any]) -> str:
    """The hooks as config.toml arrays of tables (`[[hooks.PreToolUse]]` ...)."""
    lines = [
        "# Harness: every Codex tool call asks Harness first (docs/coding-agents.md).",
        "# Codex's own sandbox (bubblewrap or Landlock, and seccomp, on Linux) confines shell",
        "# commands' writes to the project; outside it: the hooks, MCP servers and the network",
        "# rules (docs/security.md). Keep sandbox_mode above every [table] of config.toml:",
        "# under a table it is that table's key, and Codex keeps its default sandbox.",
        f"sandbox_mode = {_toml_value(settings['sandbox_mode'])}",
    ]
    for event, groups in settings["hooks"].items():
        for group in groups:
            lines += ["", f"[[hooks.{event}]]"]
            if "matcher" in group:
                lines.append(f"matcher = {_toml_value(group['matcher'])}")
            for hook in group["hooks"]:
                lines.append(f"[[hooks.{event}.hooks]]")
                lines += [f"{key} = {_toml_value(value)}" for key, value in hook.items()]
    return "\n".join(lines) + "\n"


class Command(BaseCommand):
    help = (
        "Print Codex CLI hooks (config.toml, or hooks.json with --format json) that ask "
        "Harness before every tool call. The token is read from $HARNESS_TOKEN, never written."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_arguments(parser, "Codex")
        parser.add_argument(
            "--format",
            choices=("toml", "json"),
            default="toml",
            help="config.toml tables (default) or a hooks.json file.",
        )

    def handle(
        self, *args: Any, agent: str, url: str, wait: float, command: str, format: str, **o: Any
    ) -> None:
        url, owners = checked(agent, url, wait)
        settings = hook_settings(url, command, wait)
        hooks_only = {"hooks": settings["hooks"]}  # hooks.json holds hooks only
        text = json.dumps(hooks_only, indent=2) if format == "json" else as_toml(settings)
        self.stdout.write(text)
        self.stderr.write(
            credentials_note("Codex", "codex", agent, owners, url)
            + " Trust the hooks (/hooks in codex) or install them as managed hooks: an "
            "untrusted hook does not run."
        )
