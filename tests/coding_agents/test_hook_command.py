"""harness-hook --agent codex|gemini: it speaks each CLI's protocol, passes on only an
answer that is exactly a decision in that CLI's format, and fails closed (exit 2, the
reason on stderr) whenever Harness gives none. Run with `python -I -S`: standard library
only. And the settings codex_settings and gemini_settings print."""

from __future__ import annotations

import json
import shlex
import threading
import tomllib
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.coding_agents.test_claude_code_hook_command import FakeHarness, run_hook
from tests.support.coding_agent_hooks import codex_input, codex_tool, gemini_input, gemini_tool
from tests.support.factories import AgentFixture

CODEX_PRE = json.dumps(codex_tool("s1", "Bash", "make")).encode()
GEMINI_PRE = json.dumps(gemini_tool("s1", "run_shell_command", {"command": "make"})).encode()
CODEX_ALLOW = {"systemMessage": "Harness: Allowed by Harness (mode:standard): reads run."}
CODEX_DENY = {
    "hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "Denied by alice: not now.",
    }
}
GEMINI_DENY = {"decision": "deny", "reason": "Denied by alice: not now."}
Harness = tuple[FakeHarness, str]


@pytest.fixture
def harness() -> Iterator[Harness]:
    """A fake Harness on loopback (tests/coding_agents/test_claude_code_hook_command.py's FakeHarness)."""
    fake = FakeHarness()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    server.daemon_threads = True
    # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "agent, stdin, answer, path",
    [
        ("codex", CODEX_PRE, CODEX_ALLOW, "/api/v1/hooks/codex?wait=30"),
        ("codex", CODEX_PRE, CODEX_DENY, "/api/v1/hooks/codex?wait=30"),
        (
            "gemini",
            GEMINI_PRE,
            {"decision": "allow", "reason": "ok"},
            "/api/v1/hooks/gemini?wait=30",
        ),
        ("gemini", GEMINI_PRE, GEMINI_DENY, "/api/v1/hooks/gemini?wait=30"),
    ],
)
def test_it_posts_to_the_agents_endpoint_and_prints_its_decision(
    harness: Harness, agent: str, stdin: bytes, answer: dict[str, Any], path: str
) -> None:
    fake, url = harness
    fake.body = json.dumps(answer).encode()
    done = run_hook(stdin, url, "--agent", agent, "--wait", "30")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == answer
    [request] = fake.requests
    assert request["path"] == path and request["body"] == stdin
    assert request["headers"]["Authorization"] == "Bearer hrn_test_token"


@pytest.mark.parametrize(
    "agent, stdin", [("codex", CODEX_PRE), ("gemini", GEMINI_PRE)], ids=["codex", "gemini"]
)
def test_when_harness_is_down_or_the_token_is_missing_the_tool_is_blocked(
    agent: str, stdin: bytes, down_url: str
) -> None:
    down = run_hook(stdin, down_url, "--agent", agent)
    assert down.returncode == 2 and down.stdout == ""
    assert "cannot be reached" in down.stderr and "the tool was not run" in down.stderr
    no_token = run_hook(stdin, down_url, "--agent", agent, token="")
    assert no_token.returncode == 2 and "HARNESS_TOKEN is not set" in no_token.stderr


@pytest.mark.parametrize("agent, stdin", [("codex", CODEX_PRE), ("gemini", GEMINI_PRE)])
def test_an_answer_slower_than_the_timeout_blocks_the_tool(
    harness: Harness, agent: str, stdin: bytes
) -> None:
    fake, url = harness
    fake.delay = 3
    done = run_hook(stdin, url, "--agent", agent, "--wait", "0", "--timeout", "1")
    assert done.returncode == 2 and "did not answer within 1 s" in done.stderr


@pytest.mark.parametrize(
    "body",
    [
        {},  # Codex reads no decision in it: the tool would run
        {"systemMessage": 1},
        {"systemMessage": "ok", "continue": True},  # Codex rejects unknown fields: the tool runs
        {"hookSpecificOutput": {**CODEX_DENY["hookSpecificOutput"], "permissionDecision": "allow"}},
        {"hookSpecificOutput": {**CODEX_DENY["hookSpecificOutput"], "updatedInput": {"a": 1}}},
        {"decision": "deny", "reason": "x"},  # Gemini CLI's form, not Codex's
        {**CODEX_DENY, "systemMessage": "x"},
    ],
)
def test_an_answer_that_is_not_exactly_a_codex_decision_blocks_the_tool(
    harness: Harness, body: dict[str, Any]
) -> None:
    fake, url = harness
    fake.body = json.dumps(body).encode()
    done = run_hook(CODEX_PRE, url, "--agent", "codex")
    assert done.returncode == 2 and done.stdout == ""
    assert "not a deny decision or an allow for Codex" in done.stderr


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"decision": "ask", "reason": "x"},
        {"decision": "allow"},
        {"decision": "allow", "reason": "x", "hookSpecificOutput": {"tool_input": {"a": 1}}},
        CODEX_DENY,
    ],
)
def test_an_answer_that_is_not_exactly_a_gemini_decision_blocks_the_tool(
    harness: Harness, body: dict[str, Any]
) -> None:
    fake, url = harness
    fake.body = json.dumps(body).encode()
    done = run_hook(GEMINI_PRE, url, "--agent", "gemini")
    assert done.returncode == 2 and done.stdout == ""
    assert "not an allow or deny decision for Gemini CLI" in done.stderr


def test_unreadable_input_blocks_and_other_events_fail_without_blocking(down_url: str) -> None:
    down = down_url
    assert run_hook(b"not json", down, "--agent", "gemini").returncode == 2
    for agent, body in (
        ("codex", codex_input("Stop", "s")),
        ("gemini", gemini_input("AfterAgent", "s")),
        ("gemini", gemini_input("BeforeAgent", "s", prompt="hi")),  # exit 2 would drop it
    ):
        done = run_hook(json.dumps(body).encode(), down, "--agent", agent)
        assert done.returncode == 1 and "nothing was recorded" in done.stderr


def test_an_unknown_agent_is_a_usage_error() -> None:
    done = run_hook(CODEX_PRE, "http://127.0.0.1:1", "--agent", "cursor")
    assert done.returncode == 2 and "invalid choice: 'cursor'" in done.stderr


# --- manage.py codex_settings / gemini_settings ----------------------------------------------


def printed(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def hook_lines(hooks: dict[str, Any]) -> list[dict[str, Any]]:
    return [hook for groups in hooks.values() for group in groups for hook in group["hooks"]]


@pytest.mark.django_db
def test_codex_settings_are_config_toml_command_hooks_with_no_secret(agent: AgentFixture) -> None:
    text = printed("codex_settings", "--agent", agent.agent.name, "--url", "https://h.example")
    assert agent.token not in text and agent.agent.token_prefix not in text
    hooks = tomllib.loads(text)["hooks"]
    assert set(hooks) == {"PreToolUse", "PostToolUse", "SessionStart", "UserPromptSubmit", "Stop"}
    [pre] = hooks["PreToolUse"]
    assert pre["matcher"] == "*"
    [ask] = pre["hooks"]
    sh, dash_c, script = shlex.split(ask["command"])  # wrapped to fail closed
    assert (sh, dash_c) == ("/bin/sh", "-c")
    assert script.startswith(
        "out=$(harness-hook --agent codex --url https://h.example --wait 570);"
    )
    assert ask["timeout"] == 600  # seconds, above the hook's own deadline (570 + 15)
    assert all(h["type"] == "command" for h in hook_lines(hooks))
    as_json = json.loads(
        printed(
            "codex_settings",
            "--agent",
            agent.agent.name,
            "--url",
            "https://h.example",
            "--format",
            "json",
        )
    )
    assert as_json["hooks"] == hooks  # hooks.json says the same


@pytest.mark.django_db
def test_gemini_settings_are_command_hooks_on_every_tool_with_no_secret(
    agent: AgentFixture,
) -> None:
    text = printed("gemini_settings", "--agent", agent.agent.name, "--wait", "60")
    assert agent.token not in text
    hooks = json.loads(text)["hooks"]
    assert {"BeforeTool", "AfterTool", "BeforeAgent", "AfterAgent"} <= set(hooks)
    [group] = hooks["BeforeTool"]
    assert "matcher" not in group  # no matcher: every tool
    [ask] = group["hooks"]
    script = shlex.split(ask["command"])[2]  # /bin/sh -c SCRIPT: wrapped to fail closed
    assert script.startswith("out=$(harness-hook --agent gemini --url http://127.0.0.1:8000 ")
    assert "--wait 60);" in script and ask["timeout"] == 90_000  # milliseconds
    assert all(h["type"] == "command" for h in hook_lines(hooks))


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["codex_settings", "gemini_settings"])
def test_settings_for_an_unknown_agent_or_a_bad_url_say_what_to_do(
    agent: AgentFixture, command: str
) -> None:
    with pytest.raises(CommandError, match="create_agent"):
        printed(command, "--agent", "nobody")
    with pytest.raises(CommandError, match="http"):
        printed(command, "--agent", agent.agent.name, "--url", "harness.example")
