"""Second red-team of the stop-53 security fixes (device authorization bounds, the audit
log, the agent entry points), diff by diff. Each test is an attack; it passes when the
attack fails.

- A NUL character in a field of the unauthenticated OAuth endpoints (`client_id` at
  /oauth/device-authorization/, `device_code` or `client_id` at /oauth/token/, also inside
  HTTP Basic credentials) reached PostgreSQL, which refuses it: a 500 for anyone.
- Served on a dual-stack socket (`daphne -b ::`), every IPv4 client's address arrives as
  an IPv4-mapped IPv6 address (::ffff:203.0.113.9), which allauth counts by its /64: every
  IPv4 client shared one count ("::"), so one machine asking for device codes (or typing
  wrong passwords) refused everyone's.
- `harness-hook login` showed only the endpoint's error_description as printable
  characters: the error code itself, the verification URI, the user code and the token
  endpoint's error reached the terminal raw, escape sequences and all (a server, or
  anyone on the way to an http:// one, could retitle the terminal, clear or rewrite what
  it shows, set the clipboard). A NaN interval crashed it with a traceback.
- The MCP gateway checked a tools/call's arguments for text no database keeps, not its
  tool name: a NUL in the name failed the call's write, answered -32603 "send the same
  request again later", which no retry could pass. A NUL or a lone surrogate in the
  client's name (initialize's clientInfo, a 2026-07-28 request's _meta) failed the
  session's write: a 503 "retry it later" or a 500.
- A call's arguments reach the log as JSON text, where a string under a key that names a
  secret is masked: every name SECRET_KEY reads as one but `secret_key` (SECRET_KEY,
  aws_secret_key, django-secret-key), stored and exported in clear.
- docs/audit.md: "Masked JSON text stays valid JSON". It did not when a string ended in
  `password=` or `token:` and another followed (`["password=", "x"]`): the `","` between
  them was read as a quoted value and masked, the comma with it.
- A timeline page showed the newest 20 reports that came for its calls once they were
  done (client.report_orphaned), counted across the page: a client that ran a call it was
  denied, then reported an allowed call again 20 times, had the note "the call it names
  was denied, not released" gone from the denied call's card.
"""

from __future__ import annotations

import base64
import http.server
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from django.test import Client
from oauth2_provider.models import DeviceGrant

from dispatcher.models import AgentSession, ToolCall
from tests.agentauth.device_counts import clear_device_code_counts
from tests.agentauth.test_device_authorization_limits import ask
from tests.redteam.test_agent_entry_attacks import MCP_HEADERS, mcp_post
from tests.redteam.test_audit_log_attacks import _api, _streamed
from tests.redteam.test_mcp_v2_attacks import modern_body, modern_headers
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack
from tests.support.oauth import harness_hook_client
from tests.support.paths import ROOT

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
# IPv4 clients as a dual-stack socket shows them (RFC 5737 addresses, these tests' own).
MAPPED_FLOODER, MAPPED_NEIGHBOUR = "::ffff:203.0.113.80", "::ffff:198.51.100.81"


@pytest.fixture
def own_counts() -> Iterator[None]:
    addresses = (MAPPED_FLOODER, MAPPED_NEIGHBOUR, "203.0.113.80", "198.51.100.81", "::")
    clear_device_code_counts(*addresses)
    yield
    clear_device_code_counts(*addresses)


def form(path: str, fields: dict[str, str], **meta: Any) -> Any:
    return Client(raise_request_exception=False).post(
        path, urlencode(fields), content_type="application/x-www-form-urlencoded", **meta
    )


@pytest.mark.django_db
def test_a_nul_in_an_oauth_field_is_a_400_not_a_500(own_counts: None) -> None:
    harness_hook_client()
    basic = base64.b64encode(b"harness\x00hook:x").decode()
    answers = [
        form("/oauth/device-authorization/", {"client_id": "harness\x00hook"}),
        form("/oauth/device-authorization/", {"client_id": "harness-hook", "scope": "a\x00"}),
        form(
            "/oauth/token/",
            {"grant_type": DEVICE_GRANT, "client_id": "harness-hook", "device_code": "a\x00b"},
        ),
        form(
            "/oauth/token/",
            {"grant_type": "refresh_token", "client_id": "harness\x00hook", "refresh_token": "r"},
        ),
        form(
            "/oauth/token/",
            {"grant_type": "refresh_token", "refresh_token": "r"},
            HTTP_AUTHORIZATION=f"Basic {basic}",
        ),
        form("/oauth/revoke/", {"token": "t", "client_id": "harness\x00hook"}),
    ]
    for answer in answers:
        assert answer.status_code == 400, answer.content
        assert answer["Content-Type"] == "application/json"
        assert answer.json()["error"] in ("invalid_request", "invalid_scope")
    assert (
        not DeviceGrant.objects.filter(client_id__contains="harness")
        .exclude(client_id="harness-hook")
        .exists()
    )


@pytest.mark.django_db
def test_ipv4_clients_on_a_dual_stack_socket_are_counted_apart(own_counts: None) -> None:
    """`daphne -b ::` shows an IPv4 client as ::ffff:a.b.c.d: one flooding IPv4 client is
    refused, another IPv4 client still gets a code (they were one count, "::")."""
    harness_hook_client()
    from django.conf import settings

    for _ in range(settings.HARNESS_DEVICE_AUTHORIZATIONS):
        assert ask(REMOTE_ADDR=MAPPED_FLOODER).status_code == 200
    assert ask(REMOTE_ADDR=MAPPED_FLOODER).status_code == 429
    # The same client over IPv4 is the same count.
    assert ask(REMOTE_ADDR="203.0.113.80").status_code == 429
    neighbour = ask(REMOTE_ADDR=MAPPED_NEIGHBOUR)
    assert neighbour.status_code == 200, neighbour.content


HOOK = ROOT / "dispatcher" / "gateways" / "hook_command.py"
# Escape sequences a hostile server sends for a terminal: retitle it (OSC 0), clear it
# (CSI 2J), write the clipboard (OSC 52), a C1 CSI, a right-to-left override.
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZWNobyBoaQ==\x07\x9b31m\u202e"


def hostile_server(answers: dict[str, tuple[int, dict[str, Any]]]) -> http.server.HTTPServer:
    """An endpoint that answers each path with its (status, JSON body)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            status, body = answers[self.path]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "answers",
    [
        pytest.param(
            {"/oauth/device-authorization/": (400, {"error": ESCAPES})}, id="refused-error"
        ),
        pytest.param(
            {
                "/oauth/device-authorization/": (
                    200,
                    {
                        "device_code": "d",
                        "user_code": "AB" + ESCAPES,
                        "verification_uri": "http://x/" + ESCAPES,
                        "interval": float("nan"),
                        "expires_in": 30,
                    },
                ),
                "/oauth/token/": (400, {"error": ESCAPES}),
            },
            id="code-then-token-error",
        ),
    ],
)
def test_harness_hook_login_shows_no_escape_sequence_a_server_sends(
    answers: dict[str, tuple[int, dict[str, Any]]], tmp_path: Any
) -> None:
    server = hostile_server(answers)
    try:
        login = subprocess.run(  # noqa: S603 - this repository's hook, as a developer runs it
            [
                sys.executable,
                "-I",
                "-S",
                str(HOOK),
                "login",
                "--url",
                f"http://127.0.0.1:{server.server_port}",
            ],
            env={"PATH": "/usr/bin:/bin", "HARNESS_CREDENTIALS": str(tmp_path / "c.json")},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
    shown = login.stdout + login.stderr
    assert login.returncode == 1, shown
    assert "Traceback" not in shown
    assert "Harness: " in login.stderr and "owned" in login.stderr
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e"), repr(shown)


@pytest.mark.slow
def test_an_mcp_tool_name_with_a_nul_is_invalid_params_not_retry_later(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    session = live_stack.mcp_session(live_agent, "rt2-name")
    payload = (
        b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": '
        b'"read\\u0000file", "arguments": {"path": "a"}}}'
    )
    answered = mcp_post(live_stack, live_agent, session, payload)
    error = json.loads(answered.text.split("data: ")[-1])["error"]
    assert error["code"] == -32602, error
    assert "NUL" in error["message"] and "again later" not in error["message"]
    assert not ToolCall.objects.filter(session__external_id=session.split("~")[0]).exists()


@pytest.mark.slow
def test_an_mcp_client_name_with_a_nul_or_a_lone_surrogate_is_kept_storable(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """Initialize's clientInfo and a 2026-07-28 request's clientInfo become the session's
    title, made storable (U+FFFD), as a hook's session events are."""
    name = unique("rt2-client")
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": name + "\u0000nul", "version": "1"},
        },
    }
    headers = {**live_agent.headers, **MCP_HEADERS}
    body = json.dumps(initialize).encode()
    started = httpx.post(live_stack.url + "/mcp/", headers=headers, content=body, timeout=30)
    assert started.status_code == 200, started.text
    titled = AgentSession.objects.get(agent=live_agent.agent, title__startswith=f"MCP: {name}")
    assert titled.title == f"MCP: {name}\ufffdnul 1"

    modern = modern_body(2, "tools/call", {"name": "read_file", "arguments": {"path": "a"}})
    modern["params"]["_meta"]["io.modelcontextprotocol/clientInfo"] = {
        "name": name + "-v2\ud800",
        "version": "2\u0000",
    }
    answered = httpx.post(
        live_stack.url + "/mcp/",
        headers={
            **modern_headers(live_agent, "tools/call", "read_file"),
            "Content-Type": "application/json",
        },
        content=json.dumps(modern).encode(),
        timeout=60,
    )
    assert answered.status_code == 200, answered.text
    run = AgentSession.objects.get(agent=live_agent.agent, title__startswith=f"MCP: {name}-v2")
    assert run.title == f"MCP: {name}-v2\ufffd 2\ufffd"


@pytest.mark.django_db
def test_arguments_under_a_secret_key_name_are_masked_in_the_export(
    client: Client, agent: AgentFixture
) -> None:
    """Every key name that masks a payload's own value masks it in a call's arguments."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    secrets = {
        "SECRET_KEY": "django-value-1x",
        "aws_secret_key": "aws-value-2x",
        "settings": {"secret-key": "nested-value-3x"},
        "key": "kept-key",  # not a secret name
    }
    calls = {"calls": [{"id": "s1", "name": "http_fetch", "arguments": secrets}]}
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rt2-aud", groups=("auditor",))
    client.login(username="rt2-aud", password="pw-rt2-aud")
    export = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl"))
    received = next(e for e in map(json.loads, export.splitlines()) if e["kind"] == "call.received")
    arguments = json.loads(received["payload"]["arguments"])
    for value in ("django-value-1x", "aws-value-2x", "nested-value-3x"):
        assert value not in export, value
    assert arguments["SECRET_KEY"].startswith("[masked:")
    assert arguments["key"] == "kept-key"


def secret_key_names() -> list[str]:
    """Every name SECRET_KEY reads as a secret (its alternation, `credentials?` as both)."""
    from audit.masking import SECRET_KEY

    words = re.search(r"\(\^\|_\)\((.*)\)\$", SECRET_KEY.pattern)
    assert words is not None
    names = []
    for word in words.group(1).split("|"):
        names += [word[:-2], word[:-1]] if word.endswith("s?") else [word]
    return names


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", secret_key_names())
def test_every_secret_key_name_masks_its_value_in_json_text(name: str) -> None:
    """JSON text (a call's arguments) is masked under every key name a payload's own keys
    are, as written, upper case, with "-" and after a prefix."""
    from audit.masking import is_secret_key, mask_text
    from dispatcher.proposals import canonical_json

    for key in (name, name.upper(), name.replace("_", "-"), "x_" + name, "X-" + name):
        assert is_secret_key(key), key
        assert "v4lue-x9" not in mask_text(canonical_json({key: "v4lue-x9"})), key


@pytest.mark.django_db
def test_reports_on_one_call_do_not_push_another_calls_report_off_its_card(
    client: Client, agent: AgentFixture
) -> None:
    from audit.timeline import ORPHANS_SHOWN
    from tests.support import claude_code_hooks as claude

    session = str(uuid.uuid4())
    denied = claude.pre_tool_use(session, "Bash", {"command": "sudo rm -rf /srv"}, "toolu_deny")
    assert claude.decision(claude.send(agent, denied))[0] == "deny"
    ran_anyway = {**denied, "hook_event_name": "PostToolUse", "tool_response": {"stdout": ""}}
    assert claude.send(agent, ran_anyway).status_code == 200
    read = claude.pre_tool_use(session, "Read", {"file_path": "/home/dev/project/a"}, "toolu_r")
    assert claude.decision(claude.send(agent, read))[0] == "allow"
    report = {**read, "hook_event_name": "PostToolUse", "tool_response": {"content": "a"}}
    for _ in range(ORPHANS_SHOWN + 2):  # the first is taken; each one after is a note
        assert claude.send(agent, report).status_code == 200

    sid = AgentSession.objects.get(external_id=session).pk
    make_user("rt2-aud3", groups=("auditor",))
    client.login(username="rt2-aud3", password="pw-rt2-aud3")
    page = client.get(f"/audit/sessions/{sid}/").content.decode()
    assert "the call it names was denied, not released" in page
    assert page.count("the call it names was reported, not released") == ORPHANS_SHOWN


@pytest.mark.django_db
def test_masked_arguments_stay_json_when_a_string_ends_in_a_secret_name(
    client: Client, agent: AgentFixture
) -> None:
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    arguments = {
        "args": ["--env", "PASSWORD=", "x"],
        "note": "api_token:",
        "next": {"k": "v"},
        "secret": "hunter2-value-7x",
    }
    calls = {"calls": [{"id": "j1", "name": "http_fetch", "arguments": arguments}]}
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rt2-aud4", groups=("auditor",))
    client.login(username="rt2-aud4", password="pw-rt2-aud4")
    export = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl"))
    received = next(e for e in map(json.loads, export.splitlines()) if e["kind"] == "call.received")
    masked = json.loads(received["payload"]["arguments"])  # still JSON
    assert masked["args"] == ["--env", "PASSWORD=", "x"] and masked["note"] == "api_token:"
    assert masked["next"] == {"k": "v"} and masked["secret"].startswith("[masked:")


@pytest.mark.django_db
def test_a_decisions_by_and_rule_on_the_timeline_show_a_right_to_left_override(
    client: Client, tmp_path: Any
) -> None:
    """A session grant names the call it was made from (grants.narrow_rule): the agent's
    command words or path. Its 'Decided by' and 'Rule' on the session page were shown
    raw, where the rest of the page goes through visible: a right-to-left override in the
    agent's word reversed what the auditor read there."""
    from dispatcher.policy.models import SessionGrant
    from tests.support.factories import make_agent

    fx = make_agent(mode="standard", workspace=str(tmp_path))
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, fx).json()["id"]
    word = "report\u202etxt.exe"
    SessionGrant.objects.create(
        session_id=sid, rule=f"run_command(echo {word})", tool="run_command"
    )
    calls = {"calls": [{"id": "g1", "name": "run_command", "arguments": {"argv": ["echo", word]}}]}
    answer = _api(client, f"/api/v1/sessions/{sid}/calls", calls, fx)
    assert answer.json()["calls"][0]["decided_by"].startswith("grant:"), answer.content
    make_user("rt2-aud6", groups=("auditor",))
    client.login(username="rt2-aud6", password="pw-rt2-aud6")
    page = client.get(f"/audit/sessions/{sid}/").content.decode()
    assert "report\\u202etxt.exe" in page
    assert "\u202e" not in page


@pytest.mark.django_db
def test_a_hook_sessions_workspace_on_the_timeline_shows_a_right_to_left_override(
    client: Client, agent: AgentFixture
) -> None:
    """The workspace of a coding agent's session is the `cwd` its client sent."""
    from tests.support import claude_code_hooks as claude

    session = str(uuid.uuid4())
    body = claude.pre_tool_use(session, "Read", {"file_path": "/home/dev/\u202ejorp/a"}, "t_w")
    body["cwd"] = "/home/dev/\u202ejorp"
    assert claude.send(agent, body).status_code == 200
    sid = AgentSession.objects.get(external_id=session).pk
    make_user("rt2-aud7", groups=("auditor",))
    client.login(username="rt2-aud7", password="pw-rt2-aud7")
    page = client.get(f"/audit/sessions/{sid}/").content.decode()
    assert "/home/dev/\\u202ejorp" in page
    assert "\u202e" not in page
