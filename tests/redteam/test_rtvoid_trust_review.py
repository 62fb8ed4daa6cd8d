"""Red team (rtvoid) of rtteam's fix "a team admin does not trust a server's annotations":
the same trust through another form. An organization admin registered a server for a
team with its annotations trusted; the server (its team's own) later says a tool is
read-only. The refresh holds the changed definition for review, and a team admin could
accept it: its new `readOnlyHint`, trusted, ran the tool under the organization's
read_only ceiling, exactly what the fix keeps team admins from deciding. Now a team admin
may accept a held definition of a server whose annotations are trusted only when its
annotations are unchanged; the organization's admins accept the rest."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest

from dispatcher.models import Status
from dispatcher.policy import managed
from dispatcher.tools.sources import services
from dispatcher.tools.sources.models import McpTool, ToolState
from tests.support.factories import submit_one
from tests.teams.world import make_team, org_client

UPSTREAM = Path(__file__).resolve().parent.parent / "support" / "mcp_upstream.py"


@pytest.mark.django_db
def test_a_team_admin_cannot_accept_a_changed_hint_of_a_trusted_server(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # (servers run as another user)
    variant = tmp_path / "variant.json"
    variant.write_text(json.dumps({"echo_annotations": {"readOnlyHint": False}}))
    pay = make_team("pay")
    managed.set_layer(team=None, document={"max_mode": "read_only"}, actor="cli", reason="freeze")
    name = "s" + uuid.uuid4().hex[:8]
    services.add_server(
        name=name,
        actor="user:root",  # the organization's admin trusts it
        command=[sys.executable, str(UPSTREAM), "stdio"],
        env={"UPSTREAM_VARIANT_FILE": str(variant)},
        paths=[f"{tmp_path}:ro"],
        trust_annotations=True,
        team=pay.team,
    )
    echo = f"{name}__echo"
    assert submit_one(pay.session, echo, {"text": "a"}, tool_use_id="t1").status == Status.DENIED
    # The server now says echo is read-only; the team's admin refreshes and accepts it.
    variant.write_text(json.dumps({"echo_annotations": {"readOnlyHint": True}}))
    admin = pay.client("admin")
    admin.post(f"/tools/servers/{name}/refresh")
    assert McpTool.objects.get(exposed_name=echo).state == ToolState.CHANGED
    page = admin.get(f"/tools/review/{echo}/").content.decode()
    fingerprint = re.search(r'name="fingerprint" value="([^"]+)"', page)
    assert fingerprint is not None, page
    refused = admin.post(
        f"/tools/review/{echo}/", {"fingerprint": fingerprint[1]}, follow=True
    ).content.decode()
    call = submit_one(pay.session, echo, {"text": "b"}, tool_use_id="t2")
    assert call.status != Status.QUEUED, "the team admin's accepted hint ran it past the ceiling"
    assert McpTool.objects.get(exposed_name=echo).state == ToolState.CHANGED
    assert "Only an organization admin accepts" in refused
    # The organization's admin may accept it (their trust, their call).
    org_client("admin").post(f"/tools/review/{echo}/", {"fingerprint": fingerprint[1]})
    assert McpTool.objects.get(exposed_name=echo).state == ToolState.ACTIVE
