"""harness-hook, the command hook: it fails closed (exit 2, the reason on stderr) whenever
Harness gives no usable decision, and runs with the standard library alone."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import AgentFixture
from tests.support.paths import ROOT

SCRIPT = ROOT / "dispatcher" / "gateways" / "hook_command.py"
ALLOW = {
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "allow",
        "permissionDecisionReason": "Allowed by Harness (mode:standard): reads run.",
    }
}


@dataclass
class FakeHarness:
    """Answers every POST with `status` and `body` after `delay` seconds; records requests."""

    status: int = 200
    body: bytes = json.dumps(ALLOW).encode()
    delay: float = 0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": data}
                )
                time.sleep(fake.delay)
                # A delayed answer may find the hook gone (its timeout is what such a test
                # checks): nothing to answer then, and no traceback in the test output.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(fake.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(fake.body)))
                    self.end_headers()
                    self.wfile.write(fake.body)

        return Handler


@pytest.fixture
def harness() -> Iterator[tuple[FakeHarness, str]]:
    fake = FakeHarness()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    server.daemon_threads = True
    # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run_hook(
    stdin: bytes,
    url: str,
    *args: str,
    token: str = "hrn_test_token",  # noqa: S107
) -> subprocess.CompletedProcess[str]:
    """Run the hook file as a developer's machine would: `python -I -S` (no site-packages,
    so nothing but the standard library can be imported)."""
    env = {"PATH": "/usr/bin:/bin", "HARNESS_URL": url}
    if token:
        env["HARNESS_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), *args],
        input=stdin.decode(),
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


PRE = json.dumps(pre_tool_use("s1", "Bash", {"command": "make"})).encode()


def test_it_posts_the_hook_input_with_the_token_and_prints_the_decision(
    harness: tuple[FakeHarness, str],
) -> None:
    fake, url = harness
    done = run_hook(PRE, url, "--wait", "120")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ALLOW
    [request] = fake.requests
    assert request["path"] == "/api/v1/hooks/claude-code?wait=120"
    assert request["headers"]["Authorization"] == "Bearer hrn_test_token"
    assert request["body"] == PRE  # the hook input, byte for byte


def test_without_a_token_the_tool_is_blocked(harness: tuple[FakeHarness, str]) -> None:
    done = run_hook(PRE, harness[1], token="")
    assert done.returncode == 2
    assert "HARNESS_TOKEN is not set" in done.stderr and "the tool was not run" in done.stderr


def test_when_harness_is_down_the_tool_is_blocked(down_url: str) -> None:
    done = run_hook(PRE, down_url)
    assert done.returncode == 2
    assert "cannot be reached" in done.stderr and "the tool was not run" in done.stderr


def test_a_revoked_token_blocks_the_tool_and_says_so(harness: tuple[FakeHarness, str]) -> None:
    fake, url = harness
    fake.status = 401
    fake.body = json.dumps({"error": {"code": "invalid_token", "message": "Revoked."}}).encode()
    done = run_hook(PRE, url)
    assert done.returncode == 2
    assert "refused the agent token (401 invalid_token" in done.stderr


def test_an_answer_slower_than_the_timeout_blocks_the_tool(
    harness: tuple[FakeHarness, str],
) -> None:
    fake, url = harness
    fake.delay = 3
    done = run_hook(PRE, url, "--wait", "0", "--timeout", "1")
    assert done.returncode == 2 and "did not answer within 1 s" in done.stderr


@pytest.mark.parametrize(
    "body",
    [
        b"<html>proxy error</html>",
        b"[]",
        json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse"}}).encode(),
        json.dumps(
            {"hookSpecificOutput": {**ALLOW["hookSpecificOutput"], "permissionDecision": "ask"}}
        ).encode(),
        json.dumps(
            {
                "hookSpecificOutput": {
                    **ALLOW["hookSpecificOutput"],
                    "updatedInput": {"command": "x"},
                }
            }
        ).encode(),
    ],
)
def test_a_malformed_answer_blocks_the_tool(harness: tuple[FakeHarness, str], body: bytes) -> None:
    fake, url = harness
    fake.body = body
    done = run_hook(PRE, url)
    assert done.returncode == 2 and done.stdout == ""
    assert "Harness's answer" in done.stderr


def test_unreadable_hook_input_blocks_the_tool(harness: tuple[FakeHarness, str]) -> None:
    done = run_hook(b"not json", harness[1])
    assert done.returncode == 2 and not harness[0].requests


def test_other_events_fail_without_blocking_claude_code(down_url: str) -> None:
    """Exit 2 on Stop would keep Claude Code from stopping: a failure there exits 1."""
    stop = json.dumps({"hook_event_name": "Stop", "session_id": "s", "cwd": "/p"}).encode()
    done = run_hook(stop, down_url)
    assert done.returncode == 1 and "nothing was recorded" in done.stderr


def test_an_empty_answer_prints_nothing(harness: tuple[FakeHarness, str]) -> None:
    fake, url = harness
    fake.body = b"{}"
    post = json.dumps({"hook_event_name": "PostToolUse", "session_id": "s", "cwd": "/p"}).encode()
    done = run_hook(post, url)
    assert (done.returncode, done.stdout) == (0, "")


def test_the_console_script_is_declared() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["harness-hook"].partition(":")
    assert (module, function) == ("dispatcher.gateways.hook_command", "main")
    from dispatcher.gateways import hook_command

    assert callable(hook_command.main)


# --- manage.py claude_code_settings ---------------------------------------------------------


def settings_for(*args: str) -> dict[str, Any]:
    from io import StringIO

    out, err = StringIO(), StringIO()
    call_command("claude_code_settings", *args, stdout=out, stderr=err)
    return dict(json.loads(out.getvalue()))


@pytest.mark.django_db
def test_the_printed_settings_use_command_hooks_and_hold_no_secret(agent: AgentFixture) -> None:
    printed = settings_for("--agent", agent.agent.name, "--url", "https://harness.example")
    text = json.dumps(printed)
    assert agent.token not in text and agent.agent.token_prefix not in text
    hooks = printed["hooks"]
    assert set(hooks) >= {"PreToolUse", "PostToolUse", "PostToolUseFailure", "Stop"}
    [pre] = hooks["PreToolUse"]
    assert pre["matcher"] == "*"
    [ask] = pre["hooks"]
    assert ask["type"] == "command"  # an http hook would let the tool run when Harness is down
    sh, dash_c, script = shlex.split(ask["command"])  # wrapped to fail closed (tested below)
    assert (sh, dash_c) == ("/bin/sh", "-c")
    assert script.startswith("out=$(harness-hook --url https://harness.example --wait 570);")
    assert ask["timeout"] > 570
    assert "async" not in ask  # the decision blocks the tool; only reports go on in the background
    for event in ("PostToolUse", "PostToolUseFailure"):
        [(report)] = [h for g in hooks[event] for h in g["hooks"]]
        assert report["async"] is True and "--wait 0);" in report["command"]
    assert all(
        h["type"] == "command" for group in hooks.values() for g in group for h in g["hooks"]
    )


@pytest.mark.django_db
def test_settings_for_an_unknown_agent_say_how_to_make_one() -> None:
    with pytest.raises(CommandError, match="create_agent"):
        settings_for("--agent", "nobody")


# --- The printed command fails closed however the hook ends -----------------------------------


def test_a_hook_that_crashes_blocks_the_tool() -> None:
    """An URL that urllib cannot even split raised ValueError past every handler: exit 1."""
    done = run_hook(PRE, "http://[::1")
    assert done.returncode == 2 and "the tool was not run" in done.stderr
    assert "ValueError" in done.stderr


def run_printed(line: str, path: str, stdin: bytes = PRE) -> subprocess.CompletedProcess[str]:
    """The pre-tool hook's command as printed for `line`, run by bash as Claude Code runs it,
    with PATH=`path` (the PATH the client sees)."""
    from dispatcher.management.commands._hook_settings import fail_closed

    return subprocess.run(
        ["/bin/bash", "-c", fail_closed(line)],
        input=stdin.decode(),
        env={"PATH": path, "HARNESS_TOKEN": "hrn_test_token"},
        capture_output=True,
        text=True,
        timeout=30,
    )


def executable(path: Any, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path.parent)


@pytest.mark.parametrize(
    "script, status",
    [
        (None, 127),  # not on the PATH the client sees
        ("#!/nonexistent/python3\n", 127),  # a broken interpreter (dash: not found)
        (f"#!{sys.executable}\nraise SystemExit(1)\n", 1),  # a crash
        (f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 137),
        ("#!/bin/sh\nexit 0\n", 0),  # exit 0 with no decision
    ],
)
def test_the_printed_command_blocks_when_the_hook_cannot_answer(
    tmp_path: Any, script: str | None, status: int
) -> None:
    directory = str(tmp_path)
    if script is not None:
        directory = executable(tmp_path / "harness-hook", script)
    done = run_printed(
        "harness-hook --url http://127.0.0.1:1 --wait 1", f"{directory}:/usr/bin:/bin"
    )
    assert done.returncode == 2 and done.stdout == ""
    assert f"(exit status {status})" in done.stderr and "--command" in done.stderr


def test_the_printed_command_passes_on_the_hooks_answer_and_its_own_block(
    harness: tuple[FakeHarness, str], tmp_path: Any
) -> None:
    fake, url = harness
    hook = f"{sys.executable} -I -S {SCRIPT}"
    done = run_printed(f"{hook} --url {url} --wait 1", "/usr/bin:/bin")
    assert done.returncode == 0 and json.loads(done.stdout) == ALLOW
    fake.status, fake.body = 401, b'{"error": {"code": "bad_token", "message": "No."}}'
    done = run_printed(f"{hook} --url {url} --wait 1", "/usr/bin:/bin")
    assert done.returncode == 2 and "refused the agent token" in done.stderr
    assert "did not run or gave no decision" not in done.stderr  # the hook's own reason only


@pytest.mark.parametrize("script", [None, "#!/bin/sh\nexit 2\n", "#!/bin/sh\nexit 0\n"])
def test_a_reporting_hook_that_cannot_run_fails_without_blocking(
    tmp_path: Any, script: str | None
) -> None:
    from dispatcher.management.commands._hook_settings import reporting

    if script is not None:
        executable(tmp_path / "harness-hook", script)
    done = subprocess.run(
        ["/bin/bash", "-c", reporting("harness-hook --url http://127.0.0.1:1 --wait 0")],
        input='{"hook_event_name": "Stop"}',
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == (0 if script and "exit 0" in script else 1)
    assert (done.returncode == 1) == ("nothing was recorded" in done.stderr)
