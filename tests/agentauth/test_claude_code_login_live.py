"""The real Claude Code CLI signs in to a live Harness's MCP endpoint, headless.

`claude mcp add --transport http --client-id ... --callback-port ...` names the server and
the client; `claude mcp login --no-browser` prints the authorization URL and asks for the
redirect to be pasted back; a signed-in person consents over HTTP (as a browser would) and
the address the browser is sent to is typed at that prompt, as over SSH. Then `claude mcp
list` shows the server connected, and `claude -p` (against the fake Messages API) calls a
Harness tool with the token Claude Code keeps. Without `--client-id` Claude Code names
itself by https://claude.ai/oauth/claude-code-client-metadata, which Harness cannot fetch
here (no internet), so an admin's public client with Claude Code's loopback redirect is
registered beforehand.

Marked slow as well as live, so it runs in `make test-all` and not in `make test`: it
drives a third-party CLI's interactive sign-in on a terminal, whose prompts and wording
are Claude Code's to change, and it costs some seconds of a loaded machine.

The CLI is the pinned `@anthropic-ai/claude-code` under var/claude-code (`make
claude-code`). Without it the test skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from oauth2_provider.models import AccessToken

from agentauth.models import AgentClient
from tests.support import processes
from tests.support.factories import unique
from tests.support.fake_anthropic import FakeAnthropic, say, tool_use
from tests.support.live import free_port
from tests.support.oauth_live import OAuthStack, Person, team_member
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.slow]

CLI = Path(
    os.environ.get("HARNESS_CLAUDE_CLI") or ROOT / "var/claude-code/node_modules/.bin/claude"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\r")


def needs_claude_code() -> Path:
    if CLI.exists():
        return CLI
    message = (
        f"The Claude Code sign-in test needs the pinned CLI at {CLI}: run `make claude-code` "
        "(node and npm), or set HARNESS_CLAUDE_CLI."
    )
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


class Terminal:
    """A CLI on a pseudo-terminal (Claude Code's prompts want one), its output collected."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self._primary, secondary = pty.openpty()
        self.process = processes.start(
            argv, cwd=cwd, env=env, stdin=secondary, stdout=secondary, stderr=secondary
        )
        os.close(secondary)
        self._raw = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._primary, 4096)
            except OSError:  # the CLI is gone (EIO on Linux)
                return
            if not chunk:
                return
            self._raw += chunk

    @property
    def text(self) -> str:
        return _ANSI.sub("", self._raw.decode(errors="replace"))

    def wait_for(self, pattern: str, seconds: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.text):
                return found
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} from Claude Code; it printed:\n{self.text[-3000:]}")

    def type(self, line: str) -> None:
        os.write(self._primary, line.encode() + b"\r")

    def finish(self, seconds: float = 60) -> int:
        try:
            processes.finish(self.process, seconds)
        finally:
            self._reader.join(timeout=5)
            os.close(self._primary)
        return int(self.process.returncode)


def registered_client(redirect_uri: str) -> str:
    """A public client with Claude Code's loopback redirect, as an admin registers it."""
    from oauth2_provider.models import get_application_model

    client_id = unique("claude-code")
    get_application_model().objects.create(
        client_id=client_id,
        name="Claude Code (test)",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris=redirect_uri,
        client_secret="",
        hash_client_secret=False,
    )
    return client_id


def run_claude(
    cli: Path, project: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    done = processes.run(
        [str(cli), *args], timeout=120, cwd=project, env=env, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def connected(listed: str) -> bool:
    """Whether `claude mcp list` says the harness server is connected."""
    return re.search(r"^harness: \S+/mcp/ \(HTTP\) - \S+ Connected$", listed, re.M) is not None


def test_claude_code_signs_in_through_consent_and_connects(
    oauth_stack: OAuthStack, live_db: None, tmp_path: Path
) -> None:
    cli = needs_claude_code()
    owner = team_member()
    person = Person(oauth_stack.url, owner.username, "pw-" + owner.username)
    port = free_port()
    client_id = registered_client(f"http://localhost:{port}/callback")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "TERM": "xterm-256color",
        "BROWSER": "false",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    mcp_url = oauth_stack.url + "/mcp/"
    run_claude(cli, project, env, "mcp", "add", "--transport", "http",
               "--callback-port", str(port), "--client-id", client_id, "harness", mcp_url)  # fmt: skip
    before = run_claude(cli, project, env, "mcp", "list").stdout
    assert not connected(before), before

    login = Terminal([str(cli), "mcp", "login", "--no-browser", "harness"], project, env)
    try:
        url = login.wait_for(r"(http://127\.0\.0\.1:\d+/oauth/authorize/\?\S+)").group(1)
        login.wait_for(r"paste the redirect URL here")
        # The person's browser is elsewhere (SSH): it lands on a page that does not load, and
        # they paste its address back, as `--no-browser` asks.
        login.type(person.consent(url))
        login.wait_for(r'Authenticated with "harness"')
    finally:
        code = login.finish(60)
    assert code == 0, login.text[-3000:]

    listed = run_claude(cli, project, env, "mcp", "list").stdout
    assert connected(listed), listed

    link = AgentClient.objects.select_related("agent", "application").get(owner=owner)
    assert link.application.client_id == client_id and link.registered_via == "manual"
    tokens = AccessToken.objects.filter(harness__agent=link.agent)
    assert [t.resource for t in tokens] == [[mcp_url]]

    # One call through Claude Code with the token it keeps: it lands on the consented agent.
    steps = [tool_use("mcp__harness__list_directory", path="."), say("done")]
    with FakeAnthropic(steps) as fake:
        model = {"ANTHROPIC_BASE_URL": fake.url, "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key"}
        run_claude(cli, project, {**env, **model}, "-p", "List the workspace.",
                   "--output-format", "json", "--allowedTools", "mcp__harness__list_directory")  # fmt: skip
        results = fake.tool_results()
    assert [r.get("is_error", False) for r in results] == [False], results
    calls = [c.name for s in link.agent.sessions.all() for c in s.calls.all()]
    assert calls == ["list_directory"]
