"""harness-hook: the command hook Claude Code runs to ask Harness (standard library only).

Claude Code runs it with the hook input as JSON on standard input. It POSTs that input to
`$HARNESS_URL/api/v1/hooks/claude-code` with `Authorization: Bearer $HARNESS_TOKEN` and
prints Harness's answer for Claude Code to obey. On any failure (no token or URL, Harness
down or slower than the deadline, the token refused, an answer that is not a decision)
it writes why on standard error and exits 2, which makes Claude Code block the tool and
show the message to the model: it fails closed. (An HTTP hook whose server cannot be
reached does not block: the tool runs. That is why this is a command hook.)

Only PreToolUse fails with exit 2. For the other events a failure exits 1 (Claude Code
shows it and goes on): exit 2 on Stop would keep Claude Code from ever stopping, and on
UserPromptSubmit would refuse every prompt, while the tool calls stay blocked anyway.

Standard library only: it runs on each developer's machine, where only this file and a
Python 3 need to be.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import urllib.parse
from typing import Any

ENDPOINT = "/api/v1/hooks/claude-code"
DEFAULT_WAIT = 50.0  # below Claude Code's default 60 s hook timeout
DECISIONS = ("allow", "deny")


class HookFailure(Exception):
    """Why Harness gave no usable answer (the message is what Claude Code shows)."""


def main(argv: list[str] | None = None) -> int:
    options = _options(argv)
    raw = sys.stdin.buffer.read()
    event = _event(raw)
    try:
        answer = ask_harness(raw, event, options.url, options.wait, options.timeout)
    except HookFailure as failure:
        outcome = "the tool was not run" if event in ("PreToolUse", "") else "nothing was recorded"
        print(f"Harness: {failure}; {outcome}.", file=sys.stderr)
        return 2 if event in ("PreToolUse", "") else 1
    if answer:
        sys.stdout.write(json.dumps(answer))
    return 0


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="harness-hook",
        description="Claude Code's command hook for Harness (HARNESS_URL, HARNESS_TOKEN).",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        help="seconds Harness may hold an ask while a reviewer decides (keep it below the "
        "hook's timeout)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for Harness's answer (default: --wait plus 15)",
    )
    parser.add_argument("--url", default=None, help="Harness's base URL (default: $HARNESS_URL)")
    options = parser.parse_args(argv)
    options.url = options.url or os.environ.get("HARNESS_URL", "")
    if options.timeout is None:
        options.timeout = options.wait + 15
    return options


def _event(raw: bytes) -> str:
    """The hook's event name, or "" when the input cannot be read (treated as PreToolUse)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return ""
    event = body.get("hook_event_name") if isinstance(body, dict) else None
    return event if isinstance(event, str) else ""


def ask_harness(raw: bytes, event: str, url: str, wait: float, timeout: float) -> dict[str, Any]:
    """Harness's answer to the hook input `raw`; raises HookFailure with why there is none."""
    token = os.environ.get("HARNESS_TOKEN", "")
    if not token:
        raise HookFailure(
            "HARNESS_TOKEN is not set (export the agent token `manage.py create_agent` printed)"
        )
    if not event:
        raise HookFailure("the hook input on standard input is not a JSON object with an event")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise HookFailure(
            f"HARNESS_URL is {url!r}; set it to Harness's address, e.g. https://harness.example"
        )
    query = urllib.parse.urlencode({"wait": f"{wait:g}"})
    path = f"{parsed.path.rstrip('/')}{ENDPOINT}?{query}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = _post(parsed, path, raw, headers, url, timeout)
    try:
        answer = json.loads(body)
    except ValueError:
        raise HookFailure("Harness's answer is not JSON") from None
    return check_answer(answer, event)


def _post(
    parsed: urllib.parse.SplitResult,
    path: str,
    raw: bytes,
    headers: dict[str, str],
    url: str,
    timeout: float,
) -> bytes:
    """POST with http.client: urllib's default opener loads the system's CA store on every
    run (~30 ms of each hook) even for http:// URLs; an https:// URL loads it here, once."""
    try:
        if parsed.scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parsed.netloc, timeout=timeout
            )
        else:
            connection = http.client.HTTPConnection(parsed.netloc, timeout=timeout)
        try:
            connection.request("POST", path, body=raw, headers=headers)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
    except TimeoutError:
        raise HookFailure(f"Harness at {url} did not answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as failed:
        raise HookFailure(f"Harness at {url} cannot be reached ({failed})") from None
    if response.status >= 400:
        raise HookFailure(_refusal(response.status, response.reason, body))
    return bytes(body)


def _refusal(status: int, reason: str, body: bytes) -> str:
    try:
        detail = json.loads(body)["error"]
        code, message = detail["code"], detail["message"]
    except (ValueError, KeyError, TypeError):
        code, message = "", reason
    if status == 401:
        return f"Harness refused the agent token (401 {code}: {message} Was it revoked?)"
    return f"Harness answered {status} {code}: {message}"


def check_answer(answer: Any, event: str) -> dict[str, Any]:
    """The answer, if it is one Claude Code may obey: a JSON object and, for PreToolUse, a
    decision of allow or deny that never carries changed input."""
    if not isinstance(answer, dict):
        raise HookFailure("Harness's answer is not a JSON object")
    if event != "PreToolUse":
        return answer
    output = answer.get("hookSpecificOutput")
    if (
        not isinstance(output, dict)
        or output.get("hookEventName") != "PreToolUse"
        or output.get("permissionDecision") not in DECISIONS
        or not isinstance(output.get("permissionDecisionReason"), str)
    ):
        raise HookFailure("Harness's answer is not an allow or deny decision")
    if "updatedInput" in output:
        raise HookFailure("Harness's answer would change the tool's input, which it never does")
    return answer


if __name__ == "__main__":
    sys.exit(main())
