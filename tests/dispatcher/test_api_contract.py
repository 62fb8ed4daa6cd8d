"""The agent API contract (docs/api.md): dialects, errors, idempotency, auth."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from audit.verify import verify_database
from dispatcher import agents, transitions
from dispatcher.models import Status, ToolCall
from tests.support.factories import AgentFixture, make_agent

pytestmark = pytest.mark.django_db


def post(client: Client, url: str, body: Any, fx: AgentFixture, **extra: Any) -> Any:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", headers=fx.headers, **extra)


@pytest.fixture
def session(client: Client, agent: AgentFixture) -> dict[str, Any]:
    response = post(client, "/api/v1/sessions", {"title": "contract"}, agent)
    assert response.status_code == 201, response.content
    return response.json()


def calls_url(session: dict[str, Any]) -> str:
    return f"/api/v1/sessions/{session['id']}/calls"


def test_session_shows_a_fresh_workspace_the_agent_did_not_choose(
    client: Client, agent: AgentFixture, settings: Any
) -> None:
    response = post(client, "/api/v1/sessions", {"title": "t", "workspace": "/etc"}, agent)
    body = response.json()
    assert response.status_code == 201
    assert body["workspace"].startswith(str(settings.HARNESS_WORKSPACE_ROOT.resolve()))
    assert body["workspace"].endswith(body["id"])
    assert body["mode"] == "standard"


def test_session_mode_can_only_narrow_the_owners(client: Client, agent: AgentFixture) -> None:
    assert post(client, "/api/v1/sessions", {"mode": "trusted"}, agent).json()["mode"] == "standard"
    assert (
        post(client, "/api/v1/sessions", {"mode": "read_only"}, agent).json()["mode"] == "read_only"
    )


def test_agent_workspace_is_used_for_every_session(client: Client, db: None, tmp_path: Any) -> None:
    fx = make_agent(workspace=str(tmp_path / "fixed"))
    body = post(client, "/api/v1/sessions", {}, fx).json()
    assert body["workspace"] == str((tmp_path / "fixed").resolve())


@pytest.mark.parametrize(
    "dialect_body, expected_results",
    [
        (
            {"calls": [{"id": "n1", "name": "read_file", "arguments": {"path": "a.txt"}}]},
            lambda r: r[0]["id"] == "n1" and "hello" in r[0]["content"],
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "o1",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                    }
                ],
            },
            lambda r: r[0]["role"] == "tool" and r[0]["tool_call_id"] == "o1",
        ),
        (
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 1, "output_tokens": 2},
                "content": [
                    {"type": "text", "text": "Let me read it."},
                    {
                        "type": "tool_use",
                        "id": "a1",
                        "name": "read_file",
                        "input": {"path": "a.txt"},
                    },
                ],
            },
            lambda r: r["role"] == "user" and r["content"][0]["tool_use_id"] == "a1",
        ),
    ],
    ids=["native", "openai", "anthropic"],
)
def test_three_dialects_are_received_and_logged(
    client: Client,
    agent: AgentFixture,
    session: dict[str, Any],
    dialect_body: Any,
    expected_results: Any,
) -> None:
    response = post(client, calls_url(session), dialect_body, agent)
    assert response.status_code == 202  # queued for the worker; nothing ran in the web process
    call = response.json()["calls"][0]
    assert call["status"] == "queued"
    assert call["decided_by"] == "mode:standard"
    stored = ToolCall.objects.get(pk=call["id"])
    assert AuditEvent.objects.filter(subject=f"call:{stored.pk}", kind="call.received").exists()
    allowed = AuditEvent.objects.get(subject=f"call:{stored.pk}", kind="call.allowed")
    assert allowed.payload["mode"] == "standard"
    assert allowed.payload["profile_version"] >= 1
    assert allowed.payload["by"] == "mode:standard"


def test_openai_arguments_are_stored_byte_for_byte(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    raw = '{ "path" :  "a.txt" }'
    body = {
        "role": "assistant",
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "read_file", "arguments": raw}}
        ],
    }
    call_id = post(client, calls_url(session), body, agent).json()["calls"][0]["id"]
    stored = ToolCall.objects.get(pk=call_id)
    assert stored.raw_arguments == raw
    event = AuditEvent.objects.get(subject=f"call:{call_id}", kind="call.received")
    assert event.payload["arguments"] == raw
    assert event.payload["digest"] == stored.digest


def test_digest_ignores_key_order(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    a = post(
        client,
        calls_url(session),
        {"calls": [{"id": "1", "name": "read_file", "arguments": {"path": "x", "limit": 2}}]},
        agent,
    )
    b = post(
        client,
        calls_url(session),
        {"calls": [{"id": "2", "name": "read_file", "arguments": {"limit": 2, "path": "x"}}]},
        agent,
    )
    assert a.json()["calls"][0]["digest"] == b.json()["calls"][0]["digest"]


def test_same_tool_use_id_returns_the_existing_call(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "calls": [{"id": "same", "name": "write_file", "arguments": {"path": "f", "content": "x"}}]
    }
    first = post(client, calls_url(session), body, agent).json()
    second = post(client, calls_url(session), body, agent).json()
    assert first["calls"][0]["id"] == second["calls"][0]["id"]
    assert ToolCall.objects.filter(session_id=session["id"], tool_use_id="same").count() == 1


def test_a_message_resent_with_one_more_call_keeps_the_first_and_admits_the_new_one(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    # Admission does not look for known ids first (the unique constraint catches them):
    # the failed attempt must leave nothing behind, and the retry must keep both.
    first_call = {"id": "k1", "name": "write_file", "arguments": {"path": "f", "content": "x"}}
    first = post(client, calls_url(session), {"calls": [first_call]}, agent).json()
    new_call = {"id": "k2", "name": "write_file", "arguments": {"path": "g", "content": "y"}}
    again = post(client, calls_url(session), {"calls": [first_call, new_call]}, agent).json()
    assert again["calls"][0]["id"] == first["calls"][0]["id"]
    assert again["calls"][1]["status"] == "pending_approval"
    assert ToolCall.objects.filter(session_id=session["id"]).count() == 2
    received = AuditEvent.objects.filter(chain=session["id"], kind="call.received")
    assert sorted(e.payload["tool_use_id"] for e in received) == ["k1", "k2"]
    assert verify_database(session["id"]).ok


def test_unknown_tool_is_rejected_with_the_available_tools_and_a_suggestion(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    response = post(
        client,
        calls_url(session),
        {"calls": [{"id": "u", "name": "readFile", "arguments": {"path": "a"}}]},
        agent,
    )
    assert response.status_code == 200
    call = response.json()["calls"][0]
    assert call["status"] == "rejected" and call["is_error"] is True
    assert "Tool 'readFile' does not exist" in call["content"]
    assert "read_file, write_file" in call["content"]
    assert "Did you mean 'read_file'?" in call["content"]
    assert response.json()["results"] == [{"id": "u", "content": call["content"], "is_error": True}]


def test_invalid_arguments_name_every_error_with_its_path(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "calls": [
            {"id": "v", "name": "read_file", "arguments": {"path": 5, "limit": "ten", "bogus": 1}}
        ]
    }
    call = post(client, calls_url(session), body, agent).json()["calls"][0]
    assert call["status"] == "rejected"
    assert "$.path: expected string, got int 5" in call["content"]
    assert "$.limit: expected integer" in call["content"]
    assert "'bogus'" in call["content"]


def test_malformed_openai_arguments_are_rejected_not_an_http_error(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "m",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": '},
            }
        ],
    }
    response = post(client, calls_url(session), body, agent)
    call = response.json()["calls"][0]
    assert response.status_code == 200 and call["status"] == "rejected"
    assert "not valid JSON" in call["content"]
    assert ToolCall.objects.get(pk=call["id"]).raw_arguments == '{"path": '


def test_path_escape_is_denied_by_the_guard(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {"calls": [{"id": "p", "name": "read_file", "arguments": {"path": "../../etc/passwd"}}]}
    call = post(client, calls_url(session), body, agent).json()["calls"][0]
    assert call["status"] == "denied"
    assert call["decided_by"] == "guard:workspace_confinement"
    assert "outside the session workspace" in call["content"]


def test_standard_mode_asks_for_writes_and_denies_destructive_tools(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "calls": [
            {"id": "w", "name": "write_file", "arguments": {"path": "f.txt", "content": "hi"}},
            {"id": "d", "name": "delete_file", "arguments": {"path": "f.txt"}},
        ]
    }
    write, delete = post(client, calls_url(session), body, agent).json()["calls"]
    assert write["status"] == "pending_approval" and write["decided_by"] == "mode:standard"
    assert delete["status"] == "denied" and "destructive" in delete["reason"]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("read_only", ["queued", "denied"]),
        ("trusted", ["queued", "queued"]),
        ("locked", ["denied", "denied"]),
    ],
)
def test_modes_decide_on_annotations(
    client: Client, db: None, mode: str, expected: list[str]
) -> None:
    fx = make_agent(mode=mode)
    session = post(client, "/api/v1/sessions", {}, fx).json()
    body = {
        "calls": [
            {"id": "r", "name": "list_directory", "arguments": {"path": "."}},
            {"id": "w", "name": "write_file", "arguments": {"path": "f.txt", "content": "hi"}},
        ]
    }
    calls = post(client, calls_url(session), body, fx).json()["calls"]
    assert [c["status"] for c in calls] == expected
    assert all(c["decided_by"] == f"mode:{mode}" for c in calls)


def test_command_guard_blocks_sudo_even_in_trusted_mode(client: Client, db: None) -> None:
    fx = make_agent(mode="trusted")
    session = post(client, "/api/v1/sessions", {}, fx).json()
    body = {"calls": [{"id": "s", "name": "run_command", "arguments": {"argv": ["sudo", "ls"]}}]}
    call = post(client, calls_url(session), body, fx).json()["calls"][0]
    assert call["status"] == "denied" and call["decided_by"] == "guard:command_blocklist"


def test_pending_call_is_decided_by_the_service_and_audited(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "calls": [
            {"id": "w", "name": "write_file", "arguments": {"path": "f.txt", "content": "hi"}}
        ]
    }
    call_id = post(client, calls_url(session), body, agent).json()["calls"][0]["id"]
    assert transitions.deny_call(
        call_id=call_id, actor="user:rita", reviewer="rita", feedback="Use notes.txt instead."
    )
    assert not transitions.approve_call(call_id=call_id, actor="user:sam")  # decided once
    response = client.get(f"/api/v1/calls/{call_id}", headers=agent.headers).json()
    assert response["status"] == "denied"
    assert (
        response["content"]
        == "A reviewer (rita) denied this call. Their feedback: Use notes.txt instead."
    )
    event = AuditEvent.objects.get(subject=f"call:{call_id}", kind="call.denied")
    assert event.actor == "user:rita"


def test_repeat_reminder_at_thresholds(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    contents = []
    for i in range(1, 6):
        body = {"calls": [{"id": f"r{i}", "name": "nope", "arguments": {"x": 1}}]}
        contents.append(post(client, calls_url(session), body, agent).json()["calls"][0]["content"])
    assert "Reminder" not in contents[1]
    assert "[Reminder: this is call #3 of 'nope'" in contents[2]
    assert "Reminder" not in contents[3]
    assert 'called 5 times in this session with identical arguments: {"x":1}' in contents[4]


def test_repeat_counts_span_the_session_and_the_calls_of_one_message(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    """One read per message counts each (tool, arguments) the session sent before, and the
    message counts its own calls on top, in order; the audit's call.received says the same."""
    first = {"calls": [{"id": "p1", "name": "nope", "arguments": {"x": 1}}]}
    post(client, calls_url(session), first, agent)
    second = {
        "calls": [
            {"id": "p2", "name": "nope", "arguments": {"x": 1}},
            {"id": "p3", "name": "nope", "arguments": {"x": 2}},
            {"id": "p4", "name": "nope", "arguments": {"x": 1}},
        ]
    }
    post(client, calls_url(session), second, agent)
    counts = dict(
        ToolCall.objects.filter(session_id=session["id"]).values_list("tool_use_id", "repeat_count")
    )
    assert counts == {"p1": 1, "p2": 2, "p3": 1, "p4": 3}
    received = {
        event.payload["tool_use_id"]: event.payload["repeat_count"]
        for event in AuditEvent.objects.filter(chain=session["id"], kind="call.received")
    }
    assert received == counts


@pytest.mark.parametrize(
    "body, status, code",
    [
        ("{not json", 400, "malformed_json"),
        ({"hello": "world"}, 422, "unrecognized_body"),
        ({"calls": []}, 422, "unrecognized_body"),
        ({"calls": [{"id": "a", "name": "x"}, {"id": "a", "name": "y"}]}, 422, "unrecognized_body"),
        ([1, 2], 422, "unrecognized_body"),
    ],
)
def test_bad_bodies_get_a_clear_error_and_store_nothing(
    client: Client, agent: AgentFixture, session: dict[str, Any], body: Any, status: int, code: str
) -> None:
    response = post(client, calls_url(session), body, agent)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert ToolCall.objects.filter(session_id=session["id"]).count() == 0


def test_oversized_body_is_refused_with_413(
    client: Client, agent: AgentFixture, session: dict[str, Any], settings: Any
) -> None:
    settings.HARNESS_MAX_BODY_BYTES = 1000
    body = {
        "calls": [
            {"id": "big", "name": "write_file", "arguments": {"path": "f", "content": "x" * 5000}}
        ]
    }
    response = post(client, calls_url(session), body, agent)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("header", [None, "Bearer nope", "Bearer hrn_0000_x", "Basic abc"])
def test_bad_tokens_are_refused(client: Client, db: None, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = client.get("/api/v1/tools", headers=headers)
    assert response.status_code == 401
    assert "agent token" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body", [b"{not json", b'{"calls": "x"}', b"[" * 100_000, b"x" * 2_000_000]
)
def test_a_bad_token_is_refused_before_its_body_is_read(
    client: Client, agent: AgentFixture, session: dict[str, Any], body: bytes
) -> None:
    """The submit path checks the token in the same read as the session: a forged token
    is still 401 whatever it sends (never 400/413/422, never parsed)."""
    prefix = agent.token.split("_")[1]
    for token in ("hrn_0000_x", f"hrn_{prefix}_forged", agent.token + "x"):
        response = client.post(
            calls_url(session),
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 401, (token, response.content[:200])
        assert response.json()["error"]["code"] == "invalid_token"


def test_revoked_token_is_refused(client: Client, agent: AgentFixture) -> None:
    agents.revoke_agent(agent=agent.agent, actor="test")
    assert client.get("/api/v1/tools", headers=agent.headers).status_code == 401


def test_token_is_stored_hashed(agent: AgentFixture) -> None:
    agent.agent.refresh_from_db()
    assert agent.token not in agent.agent.token_hash
    assert agent.token.split("_")[1] == agent.agent.token_prefix


def test_another_agents_session_is_not_found(
    client: Client, agent: AgentFixture, session: dict[str, Any], db: None
) -> None:
    other = make_agent()
    response = post(
        client,
        calls_url(session),
        {"calls": [{"id": "x", "name": "read_file", "arguments": {"path": "a"}}]},
        other,
    )
    assert response.status_code == 404


def test_openapi_document_is_served(client: Client, db: None) -> None:
    doc = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/sessions/{session_id}/calls" in doc["paths"]
    assert doc["components"]["securitySchemes"]


def test_agent_can_cancel_its_pending_call(
    client: Client, agent: AgentFixture, session: dict[str, Any]
) -> None:
    body = {
        "calls": [
            {"id": "w", "name": "write_file", "arguments": {"path": "f.txt", "content": "hi"}}
        ]
    }
    call_id = post(client, calls_url(session), body, agent).json()["calls"][0]["id"]
    response = client.post(f"/api/v1/calls/{call_id}/cancel", headers=agent.headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert client.post(f"/api/v1/calls/{call_id}/cancel", headers=agent.headers).status_code == 409
    assert ToolCall.objects.get(pk=call_id).status == Status.CANCELLED


def test_default_rules_from_settings_apply_to_new_users(client: Client, settings: Any) -> None:
    settings.HARNESS_DEFAULT_RULES = {
        "deny": ["read_file(**/.env)"],
        "allow": ["write_file(notes/**)"],
    }
    fx = make_agent(mode="standard")
    session = post(client, "/api/v1/sessions", {}, fx).json()
    body = {
        "calls": [
            {"id": "e", "name": "read_file", "arguments": {"path": "app/.env"}},
            {"id": "n", "name": "write_file", "arguments": {"path": "notes/a.md", "content": "x"}},
        ]
    }
    env_read, note_write = post(client, calls_url(session), body, fx).json()["calls"]
    assert (
        env_read["status"] == "denied" and env_read["decided_by"] == "rule:deny:read_file(**/.env)"
    )
    assert (
        note_write["status"] == "queued"
        and note_write["decided_by"] == "rule:allow:write_file(notes/**)"
    )
