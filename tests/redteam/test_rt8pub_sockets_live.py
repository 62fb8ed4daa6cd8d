"""rt8pub: the decision pipeline (approvals.live._Publisher: the queues' PUBLISHes sent with
the agent's wake-up in one round trip from the deciding thread) seen from real reviewer
sockets on a live daphne, whose channel layer subscribes as channels_redis does. Held: a
team's ask and its decision reach that team's reviewers and the organization's, never
another team's (not even the removal); an agent's markup in the ask arrives escaped; the
other team's socket is alive (its own ask arrives). (A socket whose reach changed with
its close message lost: tests/approvals/test_socket_reach_fresh.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from django.test import Client
from websockets.sync.client import ClientConnection, connect

from approvals import services as approvals
from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import Status
from teams.models import Team
from teams.services import add_member, create_team
from tests.approvals.conftest import session_cookie
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

MARKUP = "<img src=x onerror=alert(1)>"


@contextmanager
def queue_socket(stack: LiveStack, person: Any) -> Iterator[ClientConnection]:
    browser = Client()
    browser.force_login(person)
    with connect(
        stack.url.replace("http://", "ws://") + "/ws/approvals/",
        additional_headers={"Cookie": session_cookie(browser).decode(), "Origin": stack.url},
        open_timeout=60,
    ) as socket:
        socket.recv(timeout=60)  # the whole queue, sent on connect
        yield socket


def asker(team: Team) -> Any:
    owner = make_user(unique("owner"), mode="standard")
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="test", team=team)
    return agents.start_session(agent=agent)


def ask(session: Any) -> tuple[Any, str]:
    marker = unique("rt8pub")
    content = f"{marker} {MARKUP}"
    call = submit_one(session, "write_file", {"path": f"{marker}.txt", "content": content}, marker)
    assert call.status == Status.PENDING_APPROVAL
    return call, marker


def until(socket: ClientConnection, needle: str) -> list[str]:
    got: list[str] = []
    while not got or needle not in got[-1]:
        got.append(str(socket.recv(timeout=30)))
    return got


def nothing(socket: ClientConnection) -> None:
    with pytest.raises(TimeoutError):
        text = socket.recv(timeout=1)
        pytest.fail(f"pushed to a socket that must not see it: {text!r}"[:500])


def test_a_decision_pushed_by_the_pipeline_reaches_only_its_teams_sockets(
    live_stack: LiveStack, live_db: None
) -> None:
    home, other = (create_team(name=unique(n), actor="test") for n in ("home", "other"))
    org = make_user(unique("org-reviewer"), groups=("reviewer",))
    people = {}
    for name, team in (("home", home), ("other", other)):
        people[name] = make_user(unique(f"{name}-reviewer"))
        add_member(team=team, user=people[name], role="reviewer", actor="test")
    home_session, other_session = asker(home), asker(other)
    with ExitStack() as stack:
        sockets = {
            "org": stack.enter_context(queue_socket(live_stack, org)),
            "home": stack.enter_context(queue_socket(live_stack, people["home"])),
            "other": stack.enter_context(queue_socket(live_stack, people["other"])),
        }

        call, marker = ask(home_session)
        for name in ("org", "home"):
            pushed = until(sockets[name], marker)[-1]
            assert MARKUP not in pushed and "&lt;img src=x onerror=alert(1)&gt;" in pushed
        nothing(sockets["other"])

        approval = ApprovalRequest.objects.get(call=call)
        decided = approvals.decide(
            approval_id=approval.pk, user=org, approve=False, digest=call.digest
        )
        assert decided.decision == "denied"
        removal = f'<div id="call-{call.pk}" hx-swap-oob="delete"></div>'
        for name in ("org", "home"):
            assert removal in until(sockets[name], str(call.pk))[-1]
        nothing(sockets["other"])

        # the other team's socket was open all along: its own team's ask arrives, alone
        _, their_marker = ask(other_session)
        assert their_marker in until(sockets["other"], their_marker)[-1]
        assert their_marker in until(sockets["org"], their_marker)[-1]
        nothing(sockets["home"])
