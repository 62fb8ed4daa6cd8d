"""harness-hook: the command hook a coding agent runs to ask Harness (standard library only).

Claude Code (the default), Codex CLI (`--agent codex`) and Gemini CLI (`--agent gemini`)
run it with the hook input as JSON on standard input. It POSTs that input to the agent's
endpoint (`$HARNESS_URL/api/v1/hooks/claude-code`, `/codex`, `/gemini`) with
`Authorization: Bearer $HARNESS_TOKEN` and prints Harness's answer for the agent to obey,
after checking that it is exactly a decision in that agent's format. On any failure (no
token or URL, Harness down or slower than the deadline, the token refused, an answer that
is not a decision) it writes why on standard error and exits 2, which makes all three
block the tool and show the message to the model: it fails closed. (An HTTP hook whose
server cannot be reached does not block, and each of them lets the tool run when a
command hook fails any other way: exit 1, a timeout, output it cannot parse. That is why
this is a command hook that always exits 2 itself, well before the agent's timeout.)

Without HARNESS_TOKEN, the hook uses the token `harness-hook login [--url URL]` stored for
that URL: an OAuth device sign-in (a code shown here, approved in the browser by a signed-in
person, whose agent the hook then acts as), kept in a file only the user can read
($HARNESS_CREDENTIALS, default ~/.config/harness/credentials.json) and refreshed when it
expires (under a file lock, so hooks running side by side refresh it once).

Only the pre-tool event (PreToolUse, Gemini CLI's BeforeTool) fails with exit 2. For the
other events a failure exits 1 (the agent shows it and goes on): exit 2 on Stop would keep
Claude Code from ever stopping, and on a prompt event would refuse every prompt, while the
tool calls stay blocked anyway.

Standard library only: it runs on each developer's machine, where only this file and a
Python 3 need to be.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import json
import math
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENDPOINT = "/api/v1/hooks/claude-code"
DEFAULT_WAIT = 50.0  # below Claude Code's (and Codex's, Gemini CLI's) default 60 s timeout
DECISIONS = ("allow", "deny")
# Each agent's endpoint and the event that asks before a tool runs.
AGENTS = {
    "claude-code": (ENDPOINT, "PreToolUse"),
    "codex": ("/api/v1/hooks/codex", "PreToolUse"),
    "gemini": ("/api/v1/hooks/gemini", "BeforeTool"),
}
# Every agent's pre-tool event: one reaching the hook of another agent (a hook set up
# without its --agent) blocks, as it would be answered `{}`, an event not asked about,
# which the running agent takes as no objection.
PRE_TOOL_EVENTS = frozenset(event for _, event in AGENTS.values())


class HookFailure(Exception):
    """Why Harness gave no usable answer (the message is what Claude Code shows)."""


class RateRefused(HookFailure):
    """429 with Retry-After: sent again once after that pause, when it is short."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# The longest Retry-After the hook waits out before sending its request again (once).
MAX_RATE_PAUSE = 5


def main(argv: list[str] | None = None) -> int:
    """The exit status: 0 with the answer on stdout; 2 (the pre-tool event: the client
    blocks the tool) or 1 (other events) with why on stderr. Any exception, not only a
    HookFailure, ends this way: a crash must block, never exit 1 and let the tool run."""
    if (argv if argv is not None else sys.argv[1:])[:1] == ["login"]:
        return login_main((argv if argv is not None else sys.argv[1:])[1:])
    options = _options(argv)
    asks = True  # until the input says it is another event
    try:
        raw = sys.stdin.buffer.read()
        event = _event(raw)
        asks = event in (*PRE_TOOL_EVENTS, "")
        answer = ask_harness(
            raw, event, options.url, options.wait, options.timeout, agent=options.agent
        )
        text = json.dumps(answer) if answer else ""
    except HookFailure as failure:
        return _failed(str(failure), asks)
    except Exception as error:  # noqa: BLE001 - any failure must block, with what it was
        return _failed(f"the hook failed ({type(error).__name__}: {error})", asks)
    sys.stdout.write(text)
    return 0


def _failed(why: str, asks: bool) -> int:
    outcome = "the tool was not run" if asks else "nothing was recorded"
    print(f"Harness: {why}; {outcome}.", file=sys.stderr)
    return 2 if asks else 1


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="harness-hook",
        description="A coding agent's command hook for Harness (HARNESS_URL, HARNESS_TOKEN).",
    )
    parser.add_argument(
        "--agent",
        choices=sorted(AGENTS),
        default="claude-code",
        help="which agent runs the hook, and so its endpoint and answer format "
        "(default: claude-code)",
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


def ask_harness(
    raw: bytes, event: str, url: str, wait: float, timeout: float, agent: str = "claude-code"
) -> dict[str, Any]:
    """Harness's answer to the hook input `raw` from `agent`; raises HookFailure with why
    there is none."""
    token = os.environ.get("HARNESS_TOKEN", "") or signed_in_token(url, timeout)
    if not token:
        raise HookFailure(
            "HARNESS_TOKEN is not set and this machine is not signed in to "
            f"{url or 'Harness'} (run `harness-hook login --url URL` once, or export the "
            "agent token `manage.py create_agent` printed)"
        )
    if not event:
        raise HookFailure("the hook input on standard input is not a JSON object with an event")
    if event in PRE_TOOL_EVENTS and event != AGENTS[agent][1]:
        raise HookFailure(
            f"the hook input is a {event} event, which the {agent} hook does not ask "
            f"about (its event is {AGENTS[agent][1]}); run harness-hook with the --agent "
            "of the program that runs it"
        )
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise HookFailure(
            f"HARNESS_URL is {url!r}; set it to Harness's address, e.g. https://harness.example"
        )
    query = urllib.parse.urlencode({"wait": f"{wait:g}"})
    path = f"{parsed.path.rstrip('/')}{AGENTS[agent][0]}?{query}"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        body = _post(parsed, path, raw, headers, url, timeout)
    except RateRefused as refused:  # past the agent's request rate: pause once, as told
        if refused.retry_after > min(MAX_RATE_PAUSE, timeout):
            raise HookFailure(str(refused)) from None
        time.sleep(refused.retry_after)
        body = _post(parsed, path, raw, headers, url, timeout)
    try:
        answer = json.loads(body)
    except ValueError:
        raise HookFailure("Harness's answer is not JSON") from None
    return check_answer(answer, event, agent)


def _post(
    parsed: urllib.parse.SplitResult,
    path: str,
    raw: bytes,
    headers: dict[str, str],
    url: str,
    timeout: float,
) -> bytes:
    """POST with http.client: urllib's default opener loads the system's CA store on every
    run (a large part of each hook's time) even for http:// URLs; an https:// URL loads it here, once."""
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
    if response.status == 429 and (response.getheader("Retry-After") or "").isdigit():
        retry_after = int(response.getheader("Retry-After") or "0")
        raise RateRefused(_refusal(response.status, response.reason, body), retry_after)
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


def check_answer(answer: Any, event: str, agent: str = "claude-code") -> dict[str, Any]:
    """The answer, if it is one `agent` may obey: a JSON object and, for the pre-tool event,
    exactly a decision in the agent's format that never carries changed input."""
    if not isinstance(answer, dict):
        raise HookFailure("Harness's answer is not a JSON object")
    if event != AGENTS[agent][1]:
        return answer
    if agent == "codex":
        return _codex_decision(answer)
    if agent == "gemini":
        return _gemini_decision(answer)
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


def _codex_decision(answer: dict[str, Any]) -> dict[str, Any]:
    """Codex obeys a deny decision; for an allow Harness answers only a systemMessage (Codex
    counts "allow" as a failed hook). Exactly these shapes: Codex rejects unknown fields,
    and a rejected answer lets the tool run."""
    output = answer.get("hookSpecificOutput")
    if set(answer) == {"systemMessage"} and isinstance(answer["systemMessage"], str):
        return answer
    if (
        set(answer) == {"hookSpecificOutput"}
        and isinstance(output, dict)
        and set(output) == {"hookEventName", "permissionDecision", "permissionDecisionReason"}
        and output["hookEventName"] == "PreToolUse"
        and output["permissionDecision"] == "deny"
        and isinstance(output["permissionDecisionReason"], str)
    ):
        return answer
    raise HookFailure("Harness's answer is not a deny decision or an allow for Codex")


def _gemini_decision(answer: dict[str, Any]) -> dict[str, Any]:
    """Gemini CLI's {"decision", "reason"}, nothing more (no changed tool_input)."""
    if (
        set(answer) == {"decision", "reason"}
        and answer["decision"] in DECISIONS
        and isinstance(answer["reason"], str)
    ):
        return answer
    raise HookFailure("Harness's answer is not an allow or deny decision for Gemini CLI")


# --- Sign-in: the OAuth device authorization grant (RFC 8628) ------------------------------

CLIENT_ID = "harness-hook"
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
HOOKS_RESOURCE = "/api/v1/hooks/"
EARLY = 60  # seconds before expiry that a token counts as expired


def credentials_path() -> Path:
    configured = os.environ.get("HARNESS_CREDENTIALS", "")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CONFIG_HOME", "") or str(Path.home() / ".config")
    return Path(base) / "harness" / "credentials.json"


def _base(url: str) -> str:
    return url.rstrip("/")


def _read_all() -> dict[str, Any]:
    try:
        data = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_all(data: dict[str, Any]) -> None:
    """Replace the credentials file atomically, readable by the user only (0600, in a
    0700 directory)."""
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
    os.chmod(temporary, 0o600)
    os.replace(temporary, path)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _store(url: str, answer: dict[str, Any]) -> None:
    data = _read_all()
    data[_base(url)] = {
        "access_token": answer["access_token"],
        "refresh_token": answer.get("refresh_token", ""),
        "expires_at": time.time() + float(answer.get("expires_in", 3600)),
    }
    _write_all(data)


def signed_in_token(url: str, timeout: float) -> str:
    """The access token `harness-hook login` stored for `url` ("" if none), refreshed
    first when it has expired (once, under the file lock: a refresh token is single-use,
    and Harness revokes the whole sign-in when one is used twice)."""
    if not url:
        return ""
    entry = _read_all().get(_base(url))
    if not isinstance(entry, dict):
        return ""
    if float(entry.get("expires_at", 0)) - EARLY > time.time():
        return str(entry.get("access_token", ""))
    with _locked():
        entry = _read_all().get(_base(url)) or {}
        if float(entry.get("expires_at", 0)) - EARLY > time.time():
            return str(entry.get("access_token", ""))  # another hook refreshed it
        status, answer = _form(
            url,
            "/oauth/token/",
            {
                "grant_type": "refresh_token",
                "client_id": CLIENT_ID,
                "refresh_token": str(entry.get("refresh_token", "")),
                "resource": _base(url) + HOOKS_RESOURCE,
            },
            timeout,
        )
        if status != 200 or "access_token" not in answer:
            raise HookFailure(
                f"the sign-in to {url} has ended ({_shown(answer.get('error', status))}); run "
                "`harness-hook login` again"
            )
        _store(url, answer)
        return str(answer["access_token"])


def _form(
    url: str, path: str, fields: dict[str, str], timeout: float
) -> tuple[int, dict[str, Any]]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise HookFailure(
            f"the URL is {url!r}; give Harness's address, e.g. https://harness.example"
        )
    connection: http.client.HTTPConnection = (
        http.client.HTTPSConnection(parsed.netloc, timeout=timeout)
        if parsed.scheme == "https"
        else http.client.HTTPConnection(parsed.netloc, timeout=timeout)
    )
    try:
        connection.request(
            "POST",
            parsed.path.rstrip("/") + path,
            body=urllib.parse.urlencode(fields),
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as failed:
        raise HookFailure(f"Harness at {url} cannot be reached ({failed})") from None
    finally:
        connection.close()
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    return response.status, answer if isinstance(answer, dict) else {}


def _shown(value: Any, limit: int = 300) -> str:
    """What the server sent, as it may be shown on a terminal: printable characters only
    (an escape sequence in an error, a verification URI or a user code could otherwise
    rewrite the terminal: its title, what is on screen, the clipboard), at most `limit`."""
    return "".join(c if c.isprintable() else "?" for c in str(value)[:limit])


def _seconds(value: Any, default: float, most: float) -> float:
    """A number of seconds the server sent, from 1 to `most`; `default` if it is none
    (time.sleep refuses NaN and negative numbers, and a huge one would wait for ever)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(seconds, 1.0), most) if math.isfinite(seconds) else default


def login_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="harness-hook login",
        description="Sign this machine in to Harness: a code to approve in the browser; the "
        "hooks then use the token when HARNESS_TOKEN is unset.",
    )
    parser.add_argument("--url", default=None, help="Harness's base URL (default: $HARNESS_URL)")
    options = parser.parse_args(argv)
    url = _base(options.url or os.environ.get("HARNESS_URL", ""))
    try:
        login(url)
    except HookFailure as failure:
        print(f"Harness: {failure}.", file=sys.stderr)
        return 1
    return 0


def login(url: str, timeout: float = 30) -> None:
    """The device authorization grant: show the code, wait for its approval, store the
    token (raises HookFailure saying why not)."""
    # The resource named here too: the device code is bound to it (RFC 8707).
    asked = {"client_id": CLIENT_ID, "resource": url + HOOKS_RESOURCE}
    status, device = _form(url, "/oauth/device-authorization/", asked, timeout)
    if status != 200 or "device_code" not in device:
        refusal = f"Harness refused to start a sign-in ({_shown(device.get('error', status))})"
        why = device.get("error_description")
        if isinstance(why, str) and why:
            refusal += ": " + _shown(why)
        raise HookFailure(refusal)
    where = _shown(device.get("verification_uri_complete") or device.get("verification_uri"))
    code = _shown(device.get("user_code"))
    print(f"To sign this machine in to {url}, open {where}\nand enter the code: {code}", flush=True)
    interval = _seconds(device.get("interval"), 5, 60)
    deadline = time.monotonic() + _seconds(device.get("expires_in"), 600, 3600)
    while time.monotonic() < deadline:
        time.sleep(interval)
        status, answer = _form(
            url,
            "/oauth/token/",
            {
                "grant_type": DEVICE_GRANT,
                "client_id": CLIENT_ID,
                "device_code": str(device["device_code"]),
                "resource": url + HOOKS_RESOURCE,
            },
            timeout,
        )
        error = answer.get("error", "")
        if status == 200 and "access_token" in answer:
            with _locked():
                _store(url, answer)
            print(f"Signed in. Hooks use this sign-in for {url} when HARNESS_TOKEN is unset.")
            return
        if error == "slow_down":
            interval += 5
        elif error != "authorization_pending":
            raise HookFailure(f"the sign-in was not approved ({_shown(error or status)})")
    raise HookFailure("the code expired before it was approved; run `harness-hook login` again")


if __name__ == "__main__":
    sys.exit(main())
