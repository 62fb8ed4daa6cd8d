"""Who can reach the approvals URLs and socket: reviewers with a session, nobody else."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import ask, open_socket, run_async
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

ORIGIN = (b"origin", b"http://127.0.0.1")


def urls(approval_id: int) -> list[tuple[str, str]]:
    return [
        ("get", "/approvals/"),
        ("get", f"/approvals/{approval_id}/"),
        ("post", f"/approvals/{approval_id}/decide"),
    ]


def request(client: Client, method: str, url: str, digest: str, **kwargs: object) -> object:
    if method == "post":
        return client.post(url, {"action": "approve", "digest": digest}, **kwargs)  # type: ignore[arg-type]
    return client.get(url, **kwargs)  # type: ignore[arg-type]


def test_anonymous_users_are_sent_to_sign_in_everywhere(agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    for method, url in urls(approval.pk):
        response = request(Client(), method, url, approval.call.digest)
        assert response.status_code == 302, url  # type: ignore[attr-defined]
        assert response["Location"].startswith("/accounts/login/?next="), url  # type: ignore[index]
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_agent_bearer_token_reaches_no_approvals_url(agent: AgentFixture) -> None:
    # The token's owner is even a reviewer: the token still carries no human session.
    agent.owner.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    for method, url in urls(approval.pk):
        response = request(Client(), method, url, approval.call.digest, headers=agent.headers)
        assert response.status_code == 302, url  # type: ignore[attr-defined]
        assert response["Location"].startswith("/accounts/login/"), url  # type: ignore[index]
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL


def test_decision_without_csrf_token_is_refused(agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(unique("reviewer"), groups=("reviewer",)))
    url = f"/approvals/{approval.pk}/decide"
    response = client.post(url, {"action": "approve", "digest": approval.call.digest})
    assert response.status_code == 403
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL
    # The same POST with the token from the page goes through.
    client.get("/approvals/")
    token = client.cookies["csrftoken"].value
    response = client.post(
        url, {"action": "approve", "digest": approval.call.digest, "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert ToolCall.objects.get(pk=approval.call_id).status != Status.PENDING_APPROVAL


def test_decision_is_never_a_get(agent: AgentFixture) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    client = Client()
    client.force_login(make_user(unique("reviewer"), groups=("reviewer",)))
    assert client.get(f"/approvals/{approval.pk}/decide").status_code == 405


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([(b"origin", b"http://evil.example")], id="foreign-origin"),
        pytest.param([], id="no-origin"),
        pytest.param([ORIGIN], id="anonymous"),
        pytest.param([ORIGIN, (b"authorization", b"Bearer hx_not_a_session")], id="agent-token"),
    ],
)
def test_socket_is_refused_without_a_reviewer_session_from_our_origin(
    headers: list[tuple[bytes, bytes]],
) -> None:
    async def attempt() -> bool:
        communicator, connected = await open_socket(*headers)
        await communicator.disconnect()
        return connected

    assert run_async(attempt) is False


def test_socket_refuses_a_real_agent_token(agent: AgentFixture) -> None:
    token = (b"authorization", f"Bearer {agent.token}".encode())

    async def attempt() -> bool:
        communicator, connected = await open_socket(ORIGIN, token)
        await communicator.disconnect()
        return connected

    assert run_async(attempt) is False


# --- What a reviewer reads: invisible characters shown as escapes ------------------------

INVISIBLE = [
    "\u115f",  # Hangul choseong filler
    "\u1160",  # Hangul jungseong filler
    "\u3164",  # Hangul filler
    "\uffa0",  # halfwidth Hangul filler
    "\u034f",  # combining grapheme joiner
    *(chr(code) for code in range(0xFE00, 0xFE10)),  # variation selectors
    "\U000e0100",  # variation selector-17
    "\U000e01ef",  # variation selector-256
]


def test_fillers_joiners_and_variation_selectors_show_escaped_in_the_queue(
    agent: AgentFixture,
) -> None:
    words = [f"a{char}b" for char in INVISIBLE]
    ask(agent, {"argv": ["echo", *words], "cwd": "."}, name="run_command")
    client = Client()
    client.force_login(make_user(unique("reviewer"), groups=("reviewer",)))
    page = client.get("/approvals/").content.decode()
    for char in INVISIBLE:
        code = ord(char)
        escaped = f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
        assert f"<li><code>a{escaped}b</code></li>" in page, escaped
        assert char not in page, escaped
