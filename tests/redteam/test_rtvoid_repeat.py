"""Red team (rtvoid): a message sent again after a rotation with the same tool_use_ids
(a client retrying with the new token) finds the old token's calls as they are: the one
the rotation denied stays denied and is not run again, nor admitted anew. Held."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher import agents, execution
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_user, submit_one, unique

ROTATED = "The agent token this call was sent with was rotated"


@pytest.mark.django_db
def test_a_resent_message_after_a_rotation_does_not_run_the_old_tokens_call() -> None:
    owner = make_user(unique("olga"), groups=("admin",), mode="trusted")
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t")
    session = agents.session_for_token(token, agents.start_session(agent=agent).pk)
    assert session is not None
    call = submit_one(session, "write_file", {"path": "r.txt", "content": "x"}, "toolu_1")
    assert call.status == Status.QUEUED
    new = agents.rotate_token(agent=agent, actor="user:root")
    again = agents.session_for_token(new, session.pk)
    assert again is not None
    repeat = submit_one(again, "write_file", {"path": "r.txt", "content": "x"}, "toolu_1")
    assert repeat.pk == call.pk and repeat.status == Status.DENIED and ROTATED in repeat.content
    execution.execute_call(str(call.pk))  # a late message of the old call: nothing runs
    assert ToolCall.objects.filter(session=session).count() == 1
    assert not Path(session.workspace, "r.txt").exists()
    # a new id with the new token runs
    fresh = submit_one(again, "write_file", {"path": "n.txt", "content": "y"}, "toolu_2")
    execution.execute_call(str(fresh.pk))
    assert Path(session.workspace, "n.txt").read_text() == "y"
