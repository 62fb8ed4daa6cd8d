"""What the settings commands of the coding agents share (claude_code_settings,
codex_settings, gemini_settings): the agent check and the hook's command line."""

from __future__ import annotations

import shlex

from django.core.management.base import CommandError, CommandParser

from dispatcher.models import Agent

DEFAULT_WAIT = 570  # seconds a tool call may wait for a reviewer
MARGIN = 30  # seconds between Harness's deadline and the agent's hook timeout
REPORT_TIMEOUT = 30


def add_arguments(parser: CommandParser, client: str) -> None:
    parser.add_argument("--agent", required=True, help=f"Name of the agent {client} acts as.")
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


def checked(agent: str, url: str, wait: float) -> tuple[str, str]:
    """(the URL without a trailing slash, the agent's owners); raises CommandError naming
    what is wrong (no such active agent, not an http(s) URL, a negative wait)."""
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
    return url.rstrip("/"), ", ".join(sorted({a.owner.get_username() for a in active}))


def hook_commands(command: str, agent: str, url: str, wait: float) -> tuple[str, str]:
    """(the pre-tool hook's command line, the reporting hooks'): the URL is on it, the
    token never is (HARNESS_TOKEN)."""
    base = f"{command} --agent {agent} --url {shlex.quote(url)}"
    return f"{base} --wait {wait:g}", f"{base} --wait 0"
