"""Red team rt8w2 (5607365c), what held: a streamed page or export whose streaming raises
is closed by `_closed_on_error` (audit.streaming.Held), and its handler may close it again
(its client gone at the same moment): the export slot is given back once, never twice, so
two exports after it still meet HARNESS_MAX_EXPORTS; an error before the first byte gives
the slot back too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from django.test import override_settings

from audit.export import Slots
from audit.streaming import Held


class Broken(Exception):
    """The page's database failing mid-stream."""


async def _fails_after(pieces: int) -> AsyncIterator[bytes]:
    for _ in range(pieces):
        yield b"row\n"
    raise Broken


async def _read(response: Held) -> list[bytes]:
    got: list[bytes] = []
    with pytest.raises(Broken):
        async for data in response.streaming_content:  # type: ignore[union-attr]
            got.append(data)
    return got


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pieces", [0, 2])
@override_settings(
    HARNESS_MAX_EXPORTS=2, HARNESS_MAX_EXPORTS_PER_PERSON=0, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_a_stream_that_raises_gives_its_slot_back_once(pieces: int) -> None:
    slots = Slots()
    release = slots.take("ann", ["t1"])
    assert callable(release)
    response = Held(_fails_after(pieces), content_type="text/plain", release=release)
    got = asyncio.run(_read(response))
    assert got == [b"row\n"] * pieces
    assert slots.running == 0  # closed on the error, not at a garbage collection
    response.close()  # the handler's close too (its client left): nothing more given back
    assert slots.running == 0
    first, second = slots.take("bob", ["t1"]), slots.take("cy", ["t1"])
    assert callable(first) and callable(second)
    assert slots.take("dee", ["t1"]) == "HARNESS_MAX_EXPORTS"  # the cap holds
    del response
    assert slots.take("dee", ["t1"]) == "HARNESS_MAX_EXPORTS"  # (its finalizer: nothing)
