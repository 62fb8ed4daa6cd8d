"""Sockets are scoped as pages are: a reviewer's queue socket joins its teams' groups only,
so it never carries another team's ask, vote or removal; an auditor of another team
cannot open a session's timeline socket. The organization's roles hear both teams."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from approvals import services as approvals
from tests.approvals.conftest import closing_connections, open_socket, run_async, session_cookie
from tests.audit.test_live_timeline import open_timeline
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack
from tests.teams.world import TeamWorld, make_team

pytestmark = pytest.mark.live

ORIGIN = (b"origin", b"http://127.0.0.1")


def cookie(user: object) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return (b"cookie", session_cookie(client))


async def heard(socket: WebsocketCommunicator, seconds: float = 1.5) -> list[str]:
    """Everything the socket got within `seconds` of quiet."""
    got = []
    while not await socket.receive_nothing(timeout=seconds):
        got.append(await socket.receive_from(timeout=1))
    return got


async def queues_of(
    cookies: dict[str, tuple[bytes, bytes]],
) -> tuple[dict[str, WebsocketCommunicator], dict[str, list[str]]]:
    """A queue socket per signed-in reviewer, each with the queue it was sent first."""
    sockets = {}
    for name, value in cookies.items():
        socket, connected = await open_socket(ORIGIN, value)
        assert connected, name
        sockets[name] = socket
    return sockets, {name: [await s.receive_from(timeout=5)] for name, s in sockets.items()}


def test_queue_sockets_carry_only_their_teams_asks(live_stack: LiveStack, live_db: None) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    cookies = {
        "pay": cookie(pay.members["reviewer"]),
        "infra": cookie(infra.members["reviewer"]),
        "org": cookie(make_user(unique("org-reviewer"), groups=("reviewer",))),
    }
    later = f"pay-later-{uuid.uuid4().hex[:8]}.txt"

    def ask_again() -> object:
        return submit_one(pay.session, "write_file", {"path": later, "content": "y"}, "again")

    def decide_first() -> object:
        return approvals.decide(
            approval_id=pay.approval.pk,
            user=pay.members["reviewer"],
            approve=False,
            digest=pay.approval.digest,
        )

    async def scenario() -> dict[str, list[str]]:
        sockets, got = await queues_of(cookies)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, closing_connections(ask_again))
        await loop.run_in_executor(None, closing_connections(decide_first))
        for name, socket in sockets.items():
            got[name] += await heard(socket)
            await socket.disconnect()
        return got

    got = run_async(scenario)
    first = {name: messages[0] for name, messages in got.items()}
    assert pay.secret in first["pay"] and infra.secret not in first["pay"]
    assert infra.secret in first["infra"] and pay.secret not in first["infra"]
    assert pay.secret in first["org"] and infra.secret in first["org"]
    pushed = {name: "".join(messages[1:]) for name, messages in got.items()}
    removal = f"call-{pay.approval.call_id}"
    for name in ("pay", "org"):
        assert later in pushed[name] and removal in pushed[name], name
    # The other team's reviewer heard nothing at all: not the ask, not its removal.
    assert got["infra"][1:] == []
    assert not any(marker in "".join(got["infra"]) for marker in pay.markers)


def test_an_auditor_of_another_team_cannot_open_a_sessions_timeline(
    live_stack: LiveStack, live_db: None
) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    org = make_user(unique("org-auditor"), groups=("auditor",))

    cookies = {
        "own": cookie(pay.members["auditor"]),
        "other": cookie(infra.members["auditor"]),
        "reviewer": cookie(pay.members["reviewer"]),
        "org": cookie(org),
    }

    async def connects(world: TeamWorld, who: str) -> bool:
        socket, connected = await open_timeline(str(world.session.pk), ORIGIN, cookies[who])
        if connected:
            summary = await socket.receive_from(timeout=5)
            assert 'id="audit-summary"' in summary
        await socket.disconnect()
        return connected

    async def scenario() -> dict[str, bool]:
        return {
            "own": await connects(pay, "own"),
            "other": await connects(pay, "other"),
            "reviewer": await connects(pay, "reviewer"),
            "org": await connects(pay, "org"),
            "org other": await connects(infra, "org"),
        }

    assert run_async(scenario) == {
        "own": True,
        "other": False,
        "reviewer": False,
        "org": True,
        "org other": True,
    }


def test_the_tier_an_ask_escalated_to_is_offered_no_session_grant(
    live_stack: LiveStack, live_db: None
) -> None:
    """The next tier decides an escalated ask but may not allow it for the agent's session
    (the server refuses: approvals.services._escalated_only); their queue offered the
    button anyway, on the page, on the socket's queue and in the escalation's push. The
    agent's own team and the organization still get it."""
    from datetime import timedelta

    from approvals import live
    from approvals.models import ApprovalRequest
    from teams.services import set_escalation

    pay, sec = make_team("pay"), make_team("sec")
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    created = ApprovalRequest.objects.get(pk=pay.approval.pk).created_at
    approvals.escalate_due(created + timedelta(seconds=31))
    grant = 'value="approve_session"'
    item = f'id="call-{pay.approval.call_id}"'

    def item_of(html: str) -> str:
        assert item in html, html[:2000]
        return html.split(item, 1)[1].split("</article>", 1)[0]

    pages = {
        name: client.get("/approvals/").content.decode()
        for name, client in (("pay", pay.client("reviewer")), ("sec", sec.client("reviewer")))
    }
    assert grant in item_of(pages["pay"]) and grant not in item_of(pages["sec"])
    cookies = {
        "pay": cookie(pay.members["reviewer"]),
        "sec": cookie(sec.members["reviewer"]),
        "org": cookie(make_user(unique("org-reviewer"), groups=("reviewer",))),
    }

    async def scenario() -> dict[str, list[str]]:
        sockets, got = await queues_of(cookies)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, closing_connections(lambda: live.push_escalation(pay.approval.pk))
        )
        for name, socket in sockets.items():
            got[name] += await heard(socket)
            await socket.disconnect()
        return got

    got = run_async(scenario)
    for name, (queue, *pushed) in got.items():
        # (the organization's socket also hears other tests' asks, run alongside)
        offered = grant in item_of(queue), [grant in item_of(h) for h in pushed if item in h]
        assert offered == ((name != "sec"), [name != "sec"]), (name, offered)
