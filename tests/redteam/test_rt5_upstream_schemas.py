"""rt5: an upstream tool whose input schema is valid JSON Schema but cannot be applied
(a `$ref` to a URL, which Harness never fetches; a loop of `$ref`s) is no 500 for the
agent: the `$ref` to a URL is refused at registration (the tool is unusable, saying why),
and a schema that cannot be applied at admission rejects the call, recorded, saying why.

Real: the hand-written hostile HTTP upstream of tests/support, registered with
manage.py add_mcp_server; calls through POST /api/v1/sessions/{id}/calls."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from dispatcher.models import ToolCall
from dispatcher.tools.sources.models import McpTool
from tests.redteam.test_inline_loop_attacks import Hostile, hostile  # noqa: F401
from tests.support.factories import make_agent, unique

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(client: Client, headers: dict[str, str], name: str, arguments: Any) -> Any:
    session = client.post("/api/v1/sessions", {}, content_type="application/json", headers=headers)
    assert session.status_code == 201, session.content
    body = {"calls": [{"id": unique("c"), "name": name, "arguments": arguments}]}
    return client.post(
        f"/api/v1/sessions/{session.json()['id']}/calls",
        body,
        content_type="application/json",
        headers=headers,
    )


def test_schemas_that_cannot_be_applied_are_refused_not_a_500(
    hostile: Hostile,  # noqa: F811
) -> None:
    Path(str(hostile.calls_file) + ".bad-schemas").write_text("")
    name = "h" + unique("x").replace("-", "")[:10]
    out = StringIO()
    call_command("add_mcp_server", name, "--url", hostile.url, "--trust-annotations", stdout=out)
    remote = McpTool.objects.get(exposed_name=f"{name}__remote_ref")
    assert remote.state == "unusable" and "https://schemas.example/text.json" in remote.problem
    fx = make_agent(mode="trusted")
    client = Client(raise_request_exception=False)
    for tool in ("remote_ref", "ref_loop"):
        answer = _submit(client, fx.headers, f"{name}__{tool}", {"text": "a"})
        assert answer.status_code == 200, (tool, answer.status_code, answer.content[:300])
        [call] = answer.json()["calls"]
        assert call["status"] == "rejected", call
        assert not hostile.calls()  # nothing reached the server
    loop = ToolCall.objects.get(name=f"{name}__ref_loop")
    assert "input schema" in loop.content and "cannot be applied" in loop.content
