"""The caps' Redis scripts run by their digest (dispatcher.limits._Script): a Redis that
does not know them (a fresh server, one restarted or whose scripts were flushed) is sent
their text, and the caps count there as before, never in this process's fallback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import limits
from tests.battery.procs import ProcessGroup, RedisServer
from tests.support.factories import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    group = ProcessGroup(tmp_path)
    try:
        yield RedisServer(group)
    finally:
        group.stop_all()
        limits._refused_until.clear()
        limits._by_person.clear()


def test_the_caps_count_in_a_redis_that_lost_their_scripts(
    redis_server: RedisServer, settings: Any
) -> None:
    settings.REDIS_URL = redis_server.url
    settings.HARNESS_MAX_WAITS_PER_AGENT = 1
    settings.HARNESS_MAX_WAITS_PER_PERSON = "0"
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.01
    settings.HARNESS_AGENT_REQUEST_BURST = 1
    settings.HARNESS_PERSON_REQUESTS_PER_SECOND = 0
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 100
    for restarted in (False, True):
        fx = make_agent()
        # A fresh server the first time round, then the same one restarted: neither knows
        # the scripts, and the pool's connections died with the second.
        slot = limits.reserve_wait(fx.agent, 30)
        assert not slot.startswith("local "), restarted  # taken in Redis
        assert limits.waits_held(fx.agent) == 1
        with pytest.raises(limits.TooManyWaits):
            limits.reserve_wait(fx.agent, 30)
        limits.release_wait(slot)
        assert limits.waits_held(fx.agent) == 0
        limits.take_request(fx.agent, fx.token)
        with pytest.raises(limits.TooManyRequests) as refused:
            limits.take_request(fx.agent, fx.token)
        assert refused.value.retry_after >= 99  # one token in 100 seconds
        minute = int(time.time() // 60)
        limits.count_new_session(fx.agent)
        counters = [limits._key("sessions", fx.agent, m) for m in (minute, minute + 1)]
        assert sum(int(n or 0) for n in limits._client(redis_server.url).mget(counters)) == 1
        if not restarted:
            redis_server.kill9()
            redis_server.start()
