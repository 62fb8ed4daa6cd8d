"""Red team (rtvoid), left open: a client-run call (a PreToolUse hook, decide-only)
allowed at once, from a request verified with the agent's old token whose admission
commits after the token's rotation, is released to that client: no worker re-checks it
(agents.token_refusal), and the admission reads the token only when the request
authenticates. The window is one admission's length (the hook's stages 1 to 5 and its
commit). The fix belongs in dispatcher/admission.py `_write`: read the agent's token
again under its row's lock (as `_token_still_current` does for the inline lane) when the
message releases a call, and refuse the message (nothing recorded; the client told to
resend with the new token) when it is no longer the agent's; it costs one statement on
the auto-allowed hook's path, which tests/dispatcher/test_statement_budget.py pins at
four, so it is the lead's call."""

from __future__ import annotations

import pytest

from dispatcher import agents
from dispatcher.gateways import claude_code
from dispatcher.gateways.client_calls import admit_client_call
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_user, unique


@pytest.mark.django_db
@pytest.mark.xfail(
    strict=True,
    reason="admission releases an auto-allowed client-run call without reading the token "
    "again: fix in dispatcher/admission.py _write (a statement on a pinned path)",
)
def test_an_auto_allowed_hook_call_verified_before_a_rotation_is_not_released() -> None:
    owner = make_user(unique("olga"), groups=("admin",), mode="trusted")
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t")
    client = claude_code.CLIENT
    agents.client_session(
        agent=agent, client=client, external_id="cc-1", project_dir="/home/dev/project"
    )
    verified = agents.loaded_client_session(token, client, "cc-1")  # the old token's read
    assert verified is not None
    agents.rotate_token(agent=agent, actor="user:root")  # commits meanwhile
    call = admit_client_call(
        session=verified,
        profile_preloaded=True,
        tool_name="Bash",
        tool_input={"command": "rm -rf build"},
        tool_use_id="toolu_race",
    )
    assert isinstance(call, ToolCall)
    assert call.status != Status.RELEASED, "released to the old token's client"
