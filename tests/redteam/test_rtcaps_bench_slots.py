"""The bench floors (bench/api_floor.py, bench/peer_floor.py) take a wait slot with
Harness's own script (dispatcher.limits._RESERVE). The per-person caps changed the
script's arguments (its member before the caps) and its answer (0 when taken): a floor
still sending the old ones got a Lua error for every request, so BENCH_FLOOR_CHECKED and
the peer floor's Redis rows measured nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from django.conf import settings


def test_the_bench_floors_take_and_refuse_slots_with_harness_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import redis.asyncio as aioredis

    from bench import api_floor, peer_floor

    monkeypatch.setenv("REDIS_URL", settings.REDIS_URL)
    monkeypatch.setattr(peer_floor, "_redis", None)
    session, prefix = uuid.uuid4(), uuid.uuid4().hex[:12]

    async def scenario() -> tuple[list[Any], list[Any]]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            api = [await api_floor.take_slot(client, session) for _ in range(65)]
            peer = [await peer_floor.take_slot(prefix) for _ in range(65)]
        finally:
            await client.aclose()
            if peer_floor._redis is not None:
                await peer_floor._redis.aclose()
        return api, peer

    api, peer = asyncio.run(scenario())
    for slots in (api, peer):
        assert all(slot is not None for slot in slots[:64])  # the floors' cap: 64 at once
        assert slots[64] is None
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.zcard(f"bench-floor:waits:{session}") == 64
    client.delete(f"bench-floor:waits:{session}", f"bench-floor:waits:{prefix}")
