"""test_inline_async_attacks.py's leaked-secret attack on a real daphne (the live stack),
through its HTTP server.

Its own module, unmarked: a live test in a module marked django_db(transaction=True) goes
out among the transactional tests (pytest-django's order), and the live stack's worker,
once started, runs calls that the tests after it on that xdist worker mean to stay queued
(tests/conftest.py refuses such a test at collection)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db.models import F

from dispatcher.tools.sources import services
from dispatcher.tools.sources.models import McpServer
from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_daphne_attacks as daphne_attacks
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_async_attacks import SlowCloser, text
from tests.redteam.test_inline_loop_attacks import Hostile
from tests.support.factories import make_agent
from tests.support.live import LiveStack

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)


@pytest.mark.live
def test_live_calls_awaiting_a_session_that_fails_to_start_leak_no_secret(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """test_two_calls_awaiting_a_session_that_fails_to_start_leak_no_secret on a real
    daphne, through its HTTP server: four calls of two agents at once, each client reads
    its answer; none may read the server's credential header."""
    secret = "s3cr3t-upstream-token-" + uuid.uuid4().hex[:8]
    name = daphne_attacks.register(hostile.url, 2.0)
    McpServer.objects.filter(name=name).update(headers={"X-Api-Key": secret})
    closer = SlowCloser()
    try:
        McpServer.objects.filter(name=name).update(
            url=f"http://127.0.0.1:{closer.port}/mcp", version=F("version") + 1
        )
        services._bump_generation()
        agents = [make_agent(mode="trusted") for _ in range(2)]
        sessions = [daphne_attacks.open_session(live_stack, fx) for fx in agents]
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(
                    daphne_attacks.post,
                    live_stack,
                    fx,
                    call(i, f"{name}__echo", {"text": "x"}),
                    s,
                )
                for fx, s in zip(agents, sessions, strict=True)
                for i in (1, 2)
            ]
            answers = [daphne_attacks.result_of(f.result(30)) for f in futures]
    finally:
        closer.close()
    leaked = [text(a) for a in answers if secret in text(a)]
    assert leaked == [], leaked
    assert all(a["isError"] for a in answers), answers
