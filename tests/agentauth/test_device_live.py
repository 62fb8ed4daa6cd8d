"""`harness-hook login` end to end against a live Harness: the device authorization
grant (a code in the terminal, approved in the browser by a signed-in person), the token
stored for the user only, a hook call with it (no HARNESS_TOKEN), and its refresh."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentauth.models import AgentClient
from dispatcher.models import AgentSession
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import unique
from tests.support.oauth import harness_hook_client
from tests.support.oauth_live import OAuthStack, Person, team_member
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]
HOOK = [sys.executable, str(ROOT / "dispatcher" / "gateways" / "hook_command.py")]


def hook_env(credentials: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HARNESS_TOKEN", "HARNESS_URL")}
    env["HARNESS_CREDENTIALS"] = str(credentials)
    return env


def run_hook(
    url: str, credentials: Path, body: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HOOK, "--url", url, "--wait", "5"],
        input=json.dumps(body),
        env=hook_env(credentials),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_login_with_a_device_code_then_a_hook_call_with_its_token(
    oauth_stack: OAuthStack, live_db: None, tmp_path: Path
) -> None:
    harness_hook_client()  # a live test's database was flushed by the tests before it
    owner = team_member()
    person = Person(oauth_stack.url, owner.username, "pw-" + owner.username)
    credentials = tmp_path / "config" / "harness" / "credentials.json"
    login = subprocess.Popen(
        [*HOOK, "login", "--url", oauth_stack.url],
        env=hook_env(credentials),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert login.stdout is not None
    shown = login.stdout.readline() + login.stdout.readline()
    assert f"{oauth_stack.url}/oauth/device/" in shown
    code = re.search(r"enter the code: (\S+)", shown)
    assert code is not None, shown
    page = person.approve_device(code.group(1), mode="standard")
    assert "Approved" in page
    out, err = login.communicate(timeout=60)
    assert login.returncode == 0, err
    assert "Signed in" in out

    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE(credentials.parent.stat().st_mode) == 0o700
    stored = json.loads(credentials.read_text())[oauth_stack.url]
    assert stored["access_token"].startswith("hro_")
    link = AgentClient.objects.select_related("agent").get(owner=owner)
    assert link.registered_via == "device" and link.application.client_id == "harness-hook"

    session_id = unique("cc")
    body = pre_tool_use(session_id, "Read", {"file_path": "/home/dev/project/README.md"})
    done = run_hook(oauth_stack.url, credentials, body)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)["hookSpecificOutput"]
    assert answer["permissionDecision"] == "allow"
    session = AgentSession.objects.get(external_id=session_id)
    assert session.agent_id == link.agent_id

    # Expired: the next hook refreshes the token first (and stores the new pair).
    everything = json.loads(credentials.read_text())
    everything[oauth_stack.url]["expires_at"] = time.time() - 1
    credentials.write_text(json.dumps(everything))
    again = run_hook(
        oauth_stack.url,
        credentials,
        pre_tool_use(session_id, "Read", {"file_path": "/home/dev/project/a.txt"}),
    )
    assert again.returncode == 0, again.stderr
    refreshed = json.loads(credentials.read_text())[oauth_stack.url]
    assert refreshed["access_token"] != stored["access_token"]
    assert refreshed["refresh_token"] != stored["refresh_token"]
    assert session.calls.count() == 2

    # A token for the hooks API does not open /mcp/ (another audience).
    import httpx

    refused = httpx.post(
        oauth_stack.url + "/mcp/",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {refreshed['access_token']}",
        },
    )
    assert refused.status_code == 401


def test_login_refused_at_the_pending_cap_says_why_and_when(
    oauth_stack: OAuthStack, live_db: None, tmp_path: Path
) -> None:
    """At HARNESS_DEVICE_PENDING_MAX waiting codes the endpoint answers 429 with its
    reason; `harness-hook login` printed only the error code (too_many_requests)."""
    from datetime import timedelta
    from uuid import uuid4

    from django.conf import settings
    from django.utils import timezone
    from oauth2_provider.models import DeviceGrant

    harness_hook_client()
    expires = timezone.now() + timedelta(minutes=30)
    waiting = [
        DeviceGrant(
            client_id="harness-hook",
            device_code=uuid4().hex,
            user_code=uuid4().hex[:8],
            expires=expires,
            status=DeviceGrant.AUTHORIZATION_PENDING,
        )
        for _ in range(settings.HARNESS_DEVICE_PENDING_MAX)
    ]
    DeviceGrant.objects.bulk_create(waiting)
    try:
        login = subprocess.run(
            [*HOOK, "login", "--url", oauth_stack.url],
            env=hook_env(tmp_path / "credentials.json"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        DeviceGrant.objects.filter(device_code__in=[g.device_code for g in waiting]).delete()
    assert login.returncode == 1 and login.stdout == ""
    assert "refused to start a sign-in (too_many_requests): Too many device codes" in login.stderr
    assert "Try again in" in login.stderr, login.stderr
