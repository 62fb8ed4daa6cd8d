"""Red team (2a52e74): the session summary lists only tools whose name resolved, but a
coding agent's client resolves every name of the right shape (a tool of its own that
Harness does not know, an MCP tool mcp__server__tool): a client making names up still
grew the list without bound, each new name a rewrite of the session's head row. The list
now stops at TOOLS_LISTED names and ends in MORE_TOOLS; such a session is left out of no
tool filter, so a real tool called after the made-up ones is still found."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from dispatcher.models import AgentSession
from tests.support import claude_code_hooks as claude
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db
TOOLS_LISTED, MORE_TOOLS = 100, "\u2026"  # audit.services'


def test_a_clients_made_up_tool_names_stop_growing_the_list(settings: Any, tmp_path: Any) -> None:
    settings.HARNESS_AGENT_REQUEST_BURST = 1000  # the names as fast as the test sends them
    fx = make_agent(mode="standard", workspace=str(tmp_path))
    session = str(uuid.uuid4())
    names = [f"Made{n}" for n in range(TOOLS_LISTED + 20)] + ["Read"]
    for n, name in enumerate(names):
        body = claude.pre_tool_use(session, name, {"file_path": f"{tmp_path}/a"}, f"t{n}")
        answer = claude.send(fx, body)
        assert answer.status_code == 200, (n, answer.content)
    sid = AgentSession.objects.get(external_id=session).pk

    auditor = Client()
    auditor.force_login(make_user(unique("rt3b-aud"), groups=("auditor",)))
    page = auditor.get(f"/audit/sessions/{sid}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'value="Made0"' in html and f'value="Made{TOOLS_LISTED - 1}"' in html
    assert f'value="Made{TOOLS_LISTED}"' not in html  # the list stopped at the cap
    assert "called more tools than are listed" in html
    listed = auditor.get("/audit/sessions/", {"tool": "Read"}).content.decode()
    assert str(sid) in listed  # the real tool, called past the cap, still finds it
    filtered = auditor.get(f"/audit/sessions/{sid}/", {"tool": "Read"})
    assert filtered.status_code == 200
    assert f'<option value="{MORE_TOOLS}"' not in html
