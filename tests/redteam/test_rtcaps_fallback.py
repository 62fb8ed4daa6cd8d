"""Red team of the wait slots' fallback (dispatcher.limits): while Redis cannot be
reached, each web process counts its own waits; a wait taken then is held on (an MCP call
held for a reviewer re-reads its call while the wake-up channel is down) after Redis is
back. Before: Redis's sets knew nothing of those slots, so one person's agents took the
person's waits again in Redis on top of those they held in this process (twice the cap:
with the default 16, all 32 ORM threads of an MCP gateway process)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dispatcher import limits
from tests.support.factories import make_agent, make_user, unique

UNREACHABLE = "redis://127.0.0.1:9/0"  # nothing listens


@pytest.fixture
def slots() -> Any:
    taken: list[str] = []
    yield taken
    for slot in taken:
        limits.release_wait(slot)
    limits._local._held.clear()


@pytest.mark.django_db
def test_waits_held_while_redis_was_down_still_count_once_it_is_back(
    settings: Any, slots: list[str]
) -> None:
    settings.HARNESS_MAX_WAITS_PER_PERSON = "3"
    owner = make_user(unique("person"), mode="standard")
    first, second = make_agent(owner=owner), make_agent(owner=owner)
    with override_settings(REDIS_URL=UNREACHABLE):
        slots += [limits.reserve_wait(first.agent, 60) for _ in range(2)]
    assert all(slot.startswith("local ") for slot in slots)
    slots.append(limits.reserve_wait(second.agent, 60))  # Redis is back: the third
    with pytest.raises(limits.TooManyWaits) as full:
        slots.append(limits.reserve_wait(second.agent, 60))
    assert full.value.cap == "person"
    assert "HARNESS_MAX_WAITS_PER_PERSON" in full.value.message("")
    # ... and the agent's own cap the same way
    settings.HARNESS_MAX_WAITS_PER_AGENT = 2
    with pytest.raises(limits.TooManyWaits) as full:
        limits.reserve_wait(first.agent, 60)
    assert full.value.cap == "agent"
    # the local slots given back: Redis's sets hold the caps again
    for slot in [s for s in slots if s.startswith("local ")]:
        limits.release_wait(slot)
        slots.remove(slot)
    slots += [limits.reserve_wait(first.agent, 60) for _ in range(2)]
    assert limits.person_waits_held(first.agent) == 3
