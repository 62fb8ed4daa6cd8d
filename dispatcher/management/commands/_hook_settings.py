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
    parser.add_argument(
        "--agent",
        default="",
        help=f"Name of the agent {client} acts as with HARNESS_TOKEN (leave it out when "
        "developers sign in with `harness-hook login`: their approved agent).",
    )
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
    if not agent:
        return _checked_url(url, wait), ""
    found = Agent.objects.filter(name=agent).select_related("owner").order_by("-created_at")
    active = [a for a in found if a.is_active]
    if not active:
        raise CommandError(
            f"No active agent named '{agent}'. Create one with "
            f"`manage.py create_agent {agent} --owner USER` and keep its token."
        )
    return _checked_url(url, wait), ", ".join(sorted({a.owner.get_username() for a in active}))


def _checked_url(url: str, wait: float) -> str:
    if not url.startswith(("http://", "https://")):
        raise CommandError(f"--url must be an http(s) URL, not {url!r}.")
    if wait < 0:
        raise CommandError("--wait must be zero or more seconds.")
    return url.rstrip("/")


def credentials_note(client: str, program: str, agent: str, owners: str, url: str) -> str:
    """What the settings commands say on stderr: where the hook's token comes from."""
    login = (
        f"`harness-hook login --url {shlex.quote(url)}` (once per machine: a code approved "
        "in the browser; the hooks use that sign-in whenever HARNESS_TOKEN is unset)"
    )
    if not agent:
        return f"{client} acts as the agent each developer approves with {login}."
    return (
        f"{client} acts as agent '{agent}' (owner {owners}): export HARNESS_TOKEN with that "
        f"agent's token before starting {program}, or leave it unset and sign in with {login}."
    )


def hook_commands(command: str, agent: str, url: str, wait: float) -> tuple[str, str]:
    """(the pre-tool hook's command line, wrapped by `fail_closed`; the reporting hooks',
    wrapped by `reporting`):
    the URL is on it, the token never is (HARNESS_TOKEN)."""
    base = f"{command} --agent {agent} --url {shlex.quote(url)}"
    return fail_closed(f"{base} --wait {wait:g}"), reporting(f"{base} --wait 0")


# Why a wrapper: each client runs a hook's command in a shell and blocks the tool only on
# exit 2 (Claude Code, Codex: exit 2 with a reason on stderr; Gemini CLI: any status but
# 0 and 1 with a message). A hook that is not on the PATH the client sees exits 127, a
# broken interpreter 126 or 127, a crash 1, a killed one 128+N: each of those lets the
# tool run. The wrapper passes on the hook's answer only when it exited 0 and printed one,
# and turns every other ending into exit 2 with the fix on stderr. It is POSIX sh run by
# /bin/sh itself, so it reads the same whatever shell the client uses ($SHELL for Codex,
# bash for the others); its text holds no backslash, backquote or dollar-quote that
# another shell (fish, zsh) would read differently inside the single quotes.
NO_DECISION = (
    "Harness: the hook command did not run or gave no decision (exit status $status), "
    "so the tool was not run. Fix: install harness-hook where the agent runs (pip install "
    "Harness's package, or copy dispatcher/gateways/hook_command.py and run it with python3), print "
    "these settings again with --command naming it by its absolute path, and export "
    "HARNESS_TOKEN or run harness-hook login."
)
NOT_RECORDED = NO_DECISION.replace("did not run or gave no decision", "did not run").replace(
    "so the tool was not run", "so nothing was recorded"
)


def fail_closed(line: str) -> str:
    """`line` (the pre-tool hook's command) wrapped so that the client blocks the tool
    however it ends: its answer when it exited 0 with one, else exit 2 with the fix."""
    script = (
        f"out=$({line}); status=$?; "
        'if [ "$status" -eq 0 ] && [ -n "$out" ]; then printf "%s" "$out"; exit 0; fi; '
        f'if [ "$status" -ne 2 ]; then echo "{NO_DECISION}" >&2; fi; exit 2'
    )
    return f"/bin/sh -c {shlex.quote(script)}"


def reporting(line: str) -> str:
    """`line` (a reporting hook's command) wrapped so that any failure exits 1 with the
    fix: a report blocks nothing (exit 2 on Stop would keep Claude Code from stopping), and
    Gemini CLI reads a 127 with text on stderr as a deny that stops the whole prompt
    without naming the fix; the tools stay blocked by the pre-tool hook."""
    script = (
        f"out=$({line}); status=$?; "
        'if [ "$status" -eq 0 ]; then printf "%s" "$out"; exit 0; fi; '
        f'if [ "$status" -ne 1 ]; then echo "{NOT_RECORDED}" >&2; fi; exit 1'
    )
    return f"/bin/sh -c {shlex.quote(script)}"
