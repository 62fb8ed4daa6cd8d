"""Secret-looking values are masked in the audit copy; the live records keep exact bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from audit.masking import MASK, mask_secrets, mask_text
from audit.models import AuditEvent
from audit.services import record_event
from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-Value-9f8e7d6c"


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "password",
        "secret",
        "api_key",
        "API-Key",
        "Authorization",
        "github_token",
        "client_secret",
        "db_password",
        "credentials",
        "private_key",
    ],
)
def test_values_under_secret_keys_are_masked(key: str) -> None:
    assert mask_secrets({"outer": {key: SECRET}}) == {"outer": {key: MASK}}


@pytest.mark.parametrize("key", ["token_prefix", "max_tokens", "tool", "path", "digest"])
def test_ordinary_keys_are_kept(key: str) -> None:
    assert mask_secrets({key: "abc12345"}) == {key: "abc12345"}


@pytest.mark.parametrize(
    "text",
    [
        f"curl -H 'Authorization: Bearer {SECRET}' https://example.com",
        f"export API_KEY={SECRET} && make",
        f"mysql --password={SECRET} db",
        f'{{"password": "{SECRET}", "user": "bob"}}',
        "key sk-proj-" + SECRET + "abcdef",
        "-----BEGIN RSA PRIVATE KEY-----\n" + SECRET + "\n-----END RSA PRIVATE KEY-----",
        "ghp_" + "a1B2" * 9,
        "AKIA" + "ABCDEFGHIJKLMNOP",
    ],
    ids=["bearer", "env", "flag", "json", "sk", "pem", "github", "aws"],
)
def test_secret_looking_values_in_text_are_masked(text: str) -> None:
    masked = mask_text(text)
    assert MASK in masked
    assert SECRET not in masked
    assert "a1B2a1B2a1B2" not in masked
    assert "ABCDEFGHIJKLMNOP" not in masked


def test_text_without_secrets_is_unchanged() -> None:
    text = '{"command": "npm test -- --token-count 3", "path": "src/tokenizer.py"}'
    assert mask_text(text) == text


def test_record_event_stores_and_hashes_the_masked_payload() -> None:
    with transaction.atomic():
        event = record_event(
            kind="test.secret",
            actor="test",
            payload={"headers": {"Authorization": f"Bearer {SECRET}"}, "note": "hello"},
        )
    stored = AuditEvent.objects.get(pk=event.pk)
    assert SECRET not in json.dumps(stored.payload)
    assert stored.payload["note"] == "hello"
    assert stored.payload["masked"] is True
    assert stored.hash == event.hash


def test_a_call_keeps_exact_arguments_while_its_audit_copy_is_masked(
    client: Client, agent: AgentFixture
) -> None:
    session = client.post(
        "/api/v1/sessions", data="{}", content_type="application/json", headers=agent.headers
    ).json()
    command = f"curl -H 'Authorization: Bearer {SECRET}' https://example.com/api"
    body = {"calls": [{"id": "c1", "name": "run_command", "arguments": {"command": command}}]}
    response = client.post(
        f"/api/v1/sessions/{session['id']}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=agent.headers,
    )
    assert response.status_code in (200, 202), response.content
    call = ToolCall.objects.get(session_id=session["id"], tool_use_id="c1")
    assert SECRET in call.raw_arguments  # the live record and the digest keep exact bytes
    received = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.received")
    assert received.payload["digest"] == call.digest
    assert SECRET not in received.payload["arguments"]
    assert "Bearer [masked]" in received.payload["arguments"]
    everything = AuditEvent.objects.filter(chain=session["id"]).values_list("payload", flat=True)
    assert all(SECRET not in json.dumps(p) for p in everything)


@pytest.mark.parametrize(
    "text, masked",
    [
        (f"mysql --password {SECRET} db", "mysql --password [masked] db"),
        (f"mysql --password={SECRET} db", "mysql --password=[masked] db"),
        (f"mysql -uroot -p{SECRET} db", "mysql -uroot -p[masked] db"),
        (f"/usr/bin/mysqldump -p{SECRET} db", "/usr/bin/mysqldump -p[masked] db"),
        (f"curl -u bob:{SECRET} https://x", "curl -u bob:[masked] https://x"),
        (f"curl -ubob:{SECRET} https://x", "curl -ubob:[masked] https://x"),
        (f"curl --user=bob:{SECRET} https://x", "curl --user=bob:[masked] https://x"),
        (f"docker login --password {SECRET} ghcr.io", "docker login --password [masked] ghcr.io"),
        (f"tool --api-key {SECRET}", "tool --api-key [masked]"),
        (f"sshpass -p {SECRET} ssh host", "sshpass -p [masked] ssh host"),
        (f"zip -P {SECRET} a.zip f", "zip -P [masked] a.zip f"),
        (f"PGPASSWORD={SECRET} psql", "PGPASSWORD=[masked] psql"),
        (f'DB_PASSWORD="{SECRET} two words"', 'DB_PASSWORD="[masked]"'),
        (f"postgres://app:{SECRET}@db:5432/x", "postgres://app:[masked]@db:5432/x"),
        (f"redis://:{SECRET}@cache:6379", "redis://:[masked]@cache:6379"),
    ],
)
def test_passwords_given_as_arguments_are_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize(
    "arguments",
    [
        {"command": f"mysql -uroot -p{SECRET} db"},
        {"argv": ["mysql", "-uroot", f"-p{SECRET}", "db"]},
        {"argv": ["curl", "-u", f"bob:{SECRET}", "https://x"]},
        {"argv": ["docker", "login", "--password", SECRET]},
        {"command": f'export PASSWORD="{SECRET}"'},
    ],
    ids=["command", "mysql-argv", "curl-argv", "option-argv", "quoted-in-json"],
)
def test_argument_lists_and_json_text_are_masked_and_stay_json(arguments: dict[str, Any]) -> None:
    masked_copy = mask_secrets(arguments)
    assert SECRET not in json.dumps(masked_copy)
    text = mask_text(json.dumps(arguments))  # the call's raw arguments, as logged
    assert SECRET not in text
    assert json.loads(text).keys() == arguments.keys()  # still JSON, same shape


@pytest.mark.parametrize(
    "text",
    [
        "find . -name '*.py' -print",
        "ssh -p22 host",
        "docker run -p8080:80 -u 1000:1000 image",
        "mysql -p db",  # asks for the password: nothing to mask
        "Basic authentication is required",
        "the token generation step",
        "max_tokens: 1000",
        "tokenizer=bpe",
        "npm test -- --token-count 3",
        "curl --user-agent 'Mozilla/5.0 (X11; Linux)' https://x",
        "git log --pretty=format:%H",
        "the passage about bypass=1",
        "http://localhost:8080/path@v2",
    ],
)
def test_ordinary_commands_and_words_are_not_masked(text: str) -> None:
    assert mask_text(text) == text


def test_masking_twice_changes_nothing() -> None:
    text = f"curl -u bob:{SECRET} -H 'Authorization: Bearer {SECRET}' --password {SECRET}"
    once = mask_text(text)
    assert SECRET not in once
    assert mask_text(once) == once
