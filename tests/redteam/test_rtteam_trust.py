"""rtteam: a team admin's MCP server and the organization's mode ceiling."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dispatcher.models import Status
from dispatcher.policy import managed
from dispatcher.tools.sources.models import McpServer
from tests.mcp.conftest import http_upstream  # noqa: F401  (a fixture)
from tests.support.factories import submit_one
from tests.teams.world import make_team, org_client

db = pytest.mark.django_db


@db
def test_a_team_admin_does_not_trust_a_servers_annotations(http_upstream: str) -> None:  # noqa: F811
    """A server's annotations are its own word about its tools: trusted, a tool that says
    `readOnlyHint` is read-only to Harness, so it runs under the organization's
    `max_mode: read_only` (the ceiling guard lets read-only tools through) and without
    asking in standard mode. A team admin registered their own server (whose hints they
    write) with --trust-annotations, and their team's agents ran its tools past the
    organization's ceiling. Trusting a server's annotations is the organization's to
    decide, as its sandbox paths are."""
    pay = make_team("pay")
    managed.set_layer(team=None, document={"max_mode": "read_only"}, actor="cli", reason="freeze")
    name = "s" + uuid.uuid4().hex[:8]
    form: dict[str, Any] = {
        "name": name,
        "transport": "http",
        "url": http_upstream,
        "team": pay.team.name,
        "trust_annotations": "on",
    }
    response = pay.client("admin").post("/tools/servers/add", form)
    page = response.content.decode()
    registered = McpServer.objects.filter(name=name).first()
    if registered is not None:  # (what it allowed, before the fix)
        call = submit_one(pay.session, f"{name}__echo", {"text": "hi"}, tool_use_id="t1")
        assert call.status == Status.DENIED, (call.status, call.reason)
    assert registered is None, "a team admin registered a server with trusted annotations"
    assert "Only an organization admin trusts a server&#x27;s annotations" in page
    # Without trust, their server is registered, and its tool is held to the ceiling.
    form["trust_annotations"] = ""
    pay.client("admin").post("/tools/servers/add", form)
    assert McpServer.objects.filter(name=name, team=pay.team, trust_annotations=False).exists()
    call = submit_one(pay.session, f"{name}__echo", {"text": "hi"}, tool_use_id="t2")
    assert call.status == Status.DENIED
    # An organization admin may trust a server's annotations.
    other = "s" + uuid.uuid4().hex[:8]
    org_client("admin").post(
        "/tools/servers/add", {**form, "name": other, "trust_annotations": "on"}
    )
    assert McpServer.objects.filter(name=other, trust_annotations=True).exists()
