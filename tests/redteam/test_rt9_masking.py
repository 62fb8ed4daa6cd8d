"""Red team rt9: secrets the audit copy still showed after the white-space fix (bddc675).

- A JSON file an agent writes (`write_file` of a config.json) reaches the log as JSON text
  inside the call's raw arguments, itself JSON text: `{\\"password\\": \\"hunter2\\"}`. The
  JSON-key rule wanted unescaped quotes, so the password was in the export in clear.
- A Cookie header (`sessionid=...; csrftoken=...`) holds `;` and white space, so under a
  `Cookie` key or after `Cookie:` it was kept whole: every cookie's value was shown.
- A payload's own camelCase keys (`accessToken`, `clientSecret`, `dbPass`, `privateKey`)
  and `pass`/`pass_word` were not read as secret names, although the same keys in JSON text
  were (a value masked in the arguments text was shown in a payload dict).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from dispatcher.models import ToolCall
from tests.redteam.test_audit_log_attacks import _api, _streamed
from tests.support.factories import AgentFixture, make_user


@pytest.mark.django_db
def test_a_json_file_written_by_an_agent_has_its_password_masked_in_the_export(
    client: Client, agent: AgentFixture
) -> None:
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    config = json.dumps(
        {"db": {"password": "rt9 horse staple"}, "accessToken": "rt9tok-4f1", "port": 5432},
        indent=2,
    )
    arguments = {"path": "config.json", "content": config}
    fetch = {"url": "https://x.example", "headers": {"Cookie": "sessionid=rt9sess77; csrf=rt9c"}}
    calls = {
        "calls": [
            {"id": "w1", "name": "write_file", "arguments": arguments},
            {"id": "f1", "name": "http_fetch", "arguments": fetch},
        ]
    }
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rt9-aud", groups=("auditor",))
    client.login(username="rt9-aud", password="pw-rt9-aud")
    export = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl"))
    assert "rt9 horse staple" not in export
    assert "rt9tok-4f1" not in export
    assert "rt9sess77" not in export and "rt9c" not in export  # a Cookie header's cookies
    assert "sessionid=[masked:cookie#" in export
    received = next(
        e
        for e in map(json.loads, export.splitlines())
        if e["kind"] == "call.received" and "config.json" in e["payload"]["arguments"]
    )
    logged = json.loads(received["payload"]["arguments"])  # still JSON, twice
    written = json.loads(logged["content"])
    assert written["db"]["password"].startswith("[masked:password#")
    assert written["accessToken"].startswith("[masked:token#")
    assert written["port"] == 5432
    # the call itself (what the reviewer is shown and what runs) keeps the exact bytes
    call = ToolCall.objects.get(session_id=sid, name="write_file")
    assert json.loads(call.raw_arguments)["content"] == config


@pytest.mark.backend_independent
def test_nested_json_masking_keeps_what_a_shell_would_run_and_hashes_as_a_key_does() -> None:
    from audit.masking import mask_secrets, mask_text

    def raw(inner: dict[str, object]) -> str:
        return json.dumps({"content": json.dumps(inner)})

    masked = mask_text(raw({"password": "hunter 2"}))
    assert "hunter" not in masked
    # the marker is the one the same value gets under a payload's own key
    assert mask_secrets({"password": "hunter 2"})["password"] in masked
    # a value a shell or interpreter reads as more than a word stays visible, as elsewhere
    assert "$(rm -rf ~)" in mask_text(raw({"password": "$(rm -rf ~)"}))
    # an escaped quote or backslash in the value never ends it early
    kept = mask_text(raw({"password": 'a"b', "other": "x"}))
    assert json.loads(json.loads(kept)["content"]) == {"password": 'a"b', "other": "x"}


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("accessToken", "access-token"),
        ("refreshToken", "refresh-token"),
        ("sessionToken", "token"),
        ("clientSecret", "client-secret"),
        ("apiToken", "token"),
        ("privateKey", "private-key"),
        ("sshPrivateKey", "private-key"),
        ("secretAccessKey", "secret-access-key"),
        ("aws_secret_access_key", "secret-access-key"),
        ("dbPass", "password"),
        ("db_pass", "password"),
        ("pass", "password"),
        ("pass_word", "password"),
        ("passWord", "password"),
    ],
)
def test_secret_key_names_mask_a_payload_value_as_they_do_in_json_text(key: str, kind: str) -> None:
    from audit.masking import mask_secrets, mask_text

    assert mask_secrets({key: "v4lue x9"})[key].startswith(f"[masked:{kind}#")
    assert "v4lue" not in mask_text(json.dumps({key: "v4lue x9"}))


@pytest.mark.backend_independent
@pytest.mark.parametrize("key", ["tokenizer", "max_tokens", "bypass", "passes", "compass"])
def test_names_that_only_hold_a_secret_word_stay_visible(key: str) -> None:
    from audit.masking import mask_secrets

    assert mask_secrets({key: "v4lue"})[key] == "v4lue"


@pytest.mark.backend_independent
def test_each_cookie_of_a_cookie_header_is_masked_and_a_command_in_one_kept() -> None:
    from audit.masking import mask_secrets, mask_text

    header = "sessionid=s3ss10n; csrftoken=Zx81; Path=/"
    assert mask_secrets({"Cookie": header})["Cookie"].startswith("sessionid=[masked:cookie#")
    for masked in (
        str(mask_secrets({"headers": {"Set-Cookie": header}})),
        mask_text(json.dumps({"headers": {"Cookie": header}})),
        mask_text(f'curl -H "Cookie: {header}" https://x.example'),
    ):
        assert "s3ss10n" not in masked and "Zx81" not in masked, masked
        assert "Path=/" in masked
    shell = mask_text('curl -H "Cookie: a=$(rm -rf ~); b=s3ss10n" https://x.example')
    assert "a=$(rm -rf ~)" in shell and "s3ss10n" not in shell


def test_an_env_file_written_by_an_agent_has_its_password_masked_in_the_export(
    client: Client, agent: AgentFixture
) -> None:
    """In the raw arguments' JSON text the file's line breaks are escapes (`\\n`), so the
    text rules read `\\nDB_PASSWORD=...` as one word and kept the password; the decoded
    arguments are masked now (audit.masking.premask_arguments)."""
    sid = _api(client, "/api/v1/sessions", {"title": "t"}, agent).json()["id"]
    content = "DB_USER=app\nDB_PASSWORD=rt9-env-horse-77\nexport API_TOKEN=rt9tok-env-88\n"
    calls = {
        "calls": [
            {"id": "e1", "name": "write_file", "arguments": {"path": ".env", "content": content}}
        ]
    }
    assert _api(client, f"/api/v1/sessions/{sid}/calls", calls, agent).status_code in (200, 202)
    make_user("rt9-aud-env", groups=("auditor",))
    client.login(username="rt9-aud-env", password="pw-rt9-aud-env")
    export = _streamed(client.get(f"/audit/sessions/{sid}/export.jsonl"))
    assert "rt9-env-horse-77" not in export and "rt9tok-env-88" not in export
    received = next(e for e in map(json.loads, export.splitlines()) if e["kind"] == "call.received")
    assert received["payload"]["masked"] is True
    logged = json.loads(received["payload"]["arguments"])
    assert logged["path"] == ".env"
    assert logged["content"].startswith("DB_USER=app\nDB_PASSWORD=[masked:password#")
    call = ToolCall.objects.get(session_id=sid, name="write_file")
    assert json.loads(call.raw_arguments)["content"] == content  # what runs: exact
