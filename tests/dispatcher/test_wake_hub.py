"""The shared wake-up subscription: one Redis connection for every wait of a process, each
wake-up delivered to the waits on its channel only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from dispatcher import wakeups
from tests.approvals.conftest import run_async


def own_wake_clients(besides: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """This process's wake-hub connections, but those in `besides` (ids): a hub another
    test's event loop still holds in this process (its idle close is 30 s away, longer
    on a loaded machine) is not the one a test watches."""
    clients = redis.Redis.from_url(settings.REDIS_URL).client_list()
    name = f"harness-wake-{os.getpid()}"
    return [c for c in clients if c.get("name") == name and c["id"] not in besides]


def others() -> frozenset[str]:
    return frozenset(c["id"] for c in own_wake_clients())


def test_many_waits_use_one_connection_and_wake_only_their_channel() -> None:
    channels = [wakeups.session_channel(f"hub-{uuid.uuid4()}") for _ in range(30)]
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    before = others()

    async def scenario() -> tuple[list[dict[str, str]], list[bool], list[bool]]:
        async with wakeups.wake_on(channels[:1]) as first:
            waits = []
            for channel in channels:  # 30 more waits, one of them on the first's channel too
                waits.append(wakeups.wake_on([channel]))
            entered = [await w.__aenter__() for w in waits]
            connections = own_wake_clients(before)
            publisher.publish(channels[3], "queued")
            woken = await asyncio.gather(*[w.wait(0.5) for w in entered])
            first_woken = [await first.wait(0.01)]
            for w in waits:
                await w.__aexit__(None, None, None)
        return connections, woken, first_woken

    connections, woken, first_woken = run_async(scenario)
    assert len(connections) == 1
    assert connections[0]["sub"] == str(len(channels))
    assert woken == [n == 3 for n in range(len(channels))]
    assert first_woken == [False]  # channels[0] was not published to
    assert own_wake_clients(before) == []  # the loop ended: the connection is closed
    assert wakeups.open_subscriptions() == 0


def test_one_wait_after_another_keeps_one_connection_until_it_is_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent making one call after another must not open a connection per wait."""
    monkeypatch.setattr(wakeups, "IDLE_CLOSE_AFTER", 0.3)
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    before = others()

    async def scenario() -> tuple[list[str], list[bool], list[dict[str, str]]]:
        ids, woken = [], []
        for _ in range(3):
            channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")
            async with wakeups.wake_on([channel]) as wakeup:
                ids += [c["id"] for c in own_wake_clients(before)]
                publisher.publish(channel, "queued")
                woken.append(await wakeup.wait(10))  # (at once, unless never woken)
        # Idle past IDLE_CLOSE_AFTER: the connection closes, and Redis has seen it close
        # (not a fixed 0.6 s: on a loaded host the close reached Redis later); one never
        # closed is still listed at the deadline.
        deadline = asyncio.get_running_loop().time() + 15
        while own_wake_clients(before) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return ids, woken, own_wake_clients(before)

    ids, woken, after_idle = run_async(scenario)
    assert len(ids) == 3 and len(set(ids)) == 1  # the same connection for each wait
    assert woken == [True, True, True]
    assert after_idle == []


def test_a_broken_subscription_answers_instead_of_hanging() -> None:
    async def scenario() -> None:
        async with wakeups.wake_on(["hub-unreachable"]) as wakeup:
            await wakeup.wait(1)

    unreachable = override_settings(REDIS_URL="redis://127.0.0.1:9/0")  # nothing listens
    with unreachable, pytest.raises(wakeups.WakeUnavailable):
        run_async(scenario)


def test_local_wait_slots_cap_each_agent_separately() -> None:
    from dispatcher.limits import LocalSlots

    slots = LocalSlots()  # (0: taken; else which count was full)
    assert [slots.reserve("a", 2) for _ in range(3)] == [0, 0, 1]
    assert slots.reserve("b", 2) == 0
    slots.release("a")
    assert [slots.reserve("a", 2) for _ in range(2)] == [0, 1]
    # ... and a person's count beside each agent's: both taken, or neither
    assert [slots.reserve(agent, 2, ("person", 3)) for agent in ("c", "d", "e")] == [0, 0, 0]
    assert slots.reserve("f", 2, ("person", 3)) == 2
    assert slots.reserve("c", 1, ("person", 9)) == 1
    slots.release("d", "person")
    assert slots.reserve("f", 2, ("person", 3)) == 0


def test_a_wait_for_a_result_reads_only_when_a_wake_up_can_finish_a_call() -> None:
    from dispatcher.gateways.api import wait_until_terminal
    from dispatcher.models import Status, ToolCall

    call_id, session_id = str(uuid.uuid4()), uuid.uuid4()
    channel = wakeups.session_channel(str(session_id))
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    statuses = [Status.QUEUED]  # what each read finds
    reads: list[str] = []

    def call_in(status: str) -> ToolCall:
        return ToolCall(id=uuid.UUID(call_id), session_id=session_id, status=status)

    async def reload() -> list[ToolCall]:
        reads.append(statuses[-1])
        return [call_in(statuses[-1])]

    async def scenario() -> list[ToolCall]:
        waiting = asyncio.create_task(
            wait_until_terminal([call_id], 5, reload, [call_in(Status.QUEUED)])
        )
        while not reads:  # subscribed and read once
            await asyncio.sleep(0.01)
        for status in (Status.RUNNING, Status.QUEUED, Status.RUNNING):  # nothing to read for
            statuses.append(status)
            publisher.publish(channel, f"{call_id} {status}")
            await asyncio.sleep(0.05)
        # Another call of the session finished: nothing to read for either.
        publisher.publish(channel, f"{uuid.uuid4()} {Status.COMPLETED}")
        await asyncio.sleep(0.05)
        assert not waiting.done() and reads == [Status.QUEUED]
        statuses.append(Status.COMPLETED)
        publisher.publish(channel, f"{call_id} {Status.COMPLETED}")
        return await asyncio.wait_for(waiting, 5)

    [call] = run_async(scenario)
    assert call.status == Status.COMPLETED
    assert reads == [Status.QUEUED, Status.COMPLETED]  # the first read, then the result's


def test_a_wake_up_that_says_nothing_known_is_read_for() -> None:
    from dispatcher.gateways.api import wait_until_terminal
    from dispatcher.models import Status, ToolCall

    call_id, session_id = str(uuid.uuid4()), uuid.uuid4()
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    reads: list[int] = []

    async def reload() -> list[ToolCall]:
        reads.append(1)
        status = Status.COMPLETED if len(reads) > 1 else Status.QUEUED
        return [ToolCall(id=uuid.UUID(call_id), session_id=session_id, status=status)]

    async def scenario() -> list[ToolCall]:
        queued = ToolCall(id=uuid.UUID(call_id), session_id=session_id, status=Status.QUEUED)
        waiting = asyncio.create_task(wait_until_terminal([call_id], 5, reload, [queued]))
        while not reads:
            await asyncio.sleep(0.01)
        publisher.publish(wakeups.session_channel(str(session_id)), "something-else")
        return await asyncio.wait_for(waiting, 5)

    [call] = run_async(scenario)
    assert call.status == Status.COMPLETED and len(reads) == 2


def sub_count(besides: frozenset[str]) -> int:
    return sum(int(c["sub"]) for c in own_wake_clients(besides))


@override_settings(HARNESS_WAKE_LINGER=0.3)
def test_a_channel_lingers_after_its_wait_and_the_next_wait_joins_it_without_redis() -> None:
    channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")
    never = wakeups.session_channel(f"hub-{uuid.uuid4()}")
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    before = others()

    async def scenario() -> dict[str, object]:
        seen: dict[str, object] = {}
        seen["before any wait"] = wakeups.join_subscribed(channel)
        async with wakeups.wake_on([channel]):
            pass
        seen["lingering"] = sub_count(before)
        seen["never subscribed"] = wakeups.join_subscribed(never)
        seen["after joining nothing"] = sub_count(before)
        joined = wakeups.join_subscribed(channel)
        assert joined is not None
        publisher.publish(channel, "c-1 completed")
        seen["woken"] = await joined.wakeup.wait(10)  # (at once, unless never woken)
        seen["news"] = joined.wakeup.take_news()
        await joined.leave()
        # Past the linger, and Redis has seen the unsubscribe (not a fixed 0.6 s: a loaded
        # host's took longer); one never unsubscribed is still counted at the deadline.
        deadline = asyncio.get_running_loop().time() + 15
        while sub_count(before) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        seen["after the linger"] = sub_count(before)
        seen["joined after the linger"] = wakeups.join_subscribed(channel)
        return seen

    seen = run_async(scenario)
    assert seen["before any wait"] is None  # no hub yet: nothing subscribed, nothing asked
    assert seen["lingering"] == 1
    assert seen["never subscribed"] is None and seen["after joining nothing"] == 1
    assert seen["woken"] is True and seen["news"] == {"c-1 completed"}
    assert seen["after the linger"] == 0
    assert seen["joined after the linger"] is None


def test_at_most_max_lingering_channels_stay_subscribed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wakeups, "MAX_LINGERING", 2)
    before = others()

    async def scenario() -> int:
        for _ in range(5):
            async with wakeups.wake_on([wakeups.session_channel(f"hub-{uuid.uuid4()}")]):
                pass
        # (the evicted ones' unsubscribes reach Redis a moment later; more than two kept
        # subscribed are still counted at the deadline)
        deadline = asyncio.get_running_loop().time() + 15
        while sub_count(before) > 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return sub_count(before)

    assert run_async(scenario) == 2


def test_a_wait_joined_before_the_write_misses_no_change_and_reads_only_for_one() -> None:
    """The agent API joins the session's channel before admitting the calls: a change
    published while the request was still admitting (a fast worker) is not lost, and the
    wait reads the calls only when a wake-up can have finished one (not once up front)."""
    from dispatcher.gateways.api import wait_until_terminal
    from dispatcher.models import Status, ToolCall

    call_id, session_id = str(uuid.uuid4()), uuid.uuid4()
    channel = wakeups.session_channel(str(session_id))
    publisher = redis.Redis.from_url(settings.REDIS_URL)
    stored = [Status.QUEUED]  # the call's status in the database
    reads: list[str] = []

    async def reload() -> list[ToolCall]:
        reads.append(stored[-1])
        return [ToolCall(id=uuid.UUID(call_id), session_id=session_id, status=stored[-1])]

    async def finish_later() -> None:
        await asyncio.sleep(0.2)
        stored.append(Status.COMPLETED)
        publisher.publish(channel, f"{call_id} {Status.COMPLETED}")

    async def scenario() -> list[ToolCall]:
        async with wakeups.wake_on([channel]):  # an earlier wait of the session
            pass
        joined = wakeups.join_subscribed(channel)
        assert joined is not None
        try:
            # While "admitting": the call is queued, and a worker starts it at once.
            stored.append(Status.RUNNING)
            publisher.publish(channel, f"{call_id} {Status.RUNNING}")
            await asyncio.sleep(0.05)
            queued = ToolCall(id=uuid.UUID(call_id), session_id=session_id, status=Status.QUEUED)
            finishing = asyncio.create_task(finish_later())
            result = await wait_until_terminal([call_id], 30, reload, [queued], joined=joined)
            await finishing
            return result
        finally:
            await joined.leave()

    began = time.monotonic()
    [call] = run_async(scenario)
    assert call.status == Status.COMPLETED
    assert time.monotonic() - began < 10  # woken, not the 30 s deadline (5 s and 2 s once)
    assert reads == [Status.COMPLETED]  # no read up front, none for "running"


def subscribes_so_far() -> int:
    stats = redis.Redis.from_url(settings.REDIS_URL).info("commandstats")
    return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))


def test_a_wait_cancelled_while_a_new_hub_subscribes_leaves_nothing_behind() -> None:
    """(Review: a client gone during the first subscribe of a fresh hub left a waiter and
    a confirmation that never came, and every later wait on the channel timed out.)"""
    channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")
    publisher = redis.Redis.from_url(settings.REDIS_URL)

    async def wait_forever() -> None:
        async with wakeups.wake_on([channel]) as wakeup:
            await wakeup.wait(30)

    async def scenario() -> bool:
        first = asyncio.create_task(wait_forever())
        for _ in range(3):  # the hub is connecting: cancel the wait there
            await asyncio.sleep(0)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        async with asyncio.timeout(3), wakeups.wake_on([channel]) as wakeup:
            publisher.publish(channel, "c-1 completed")
            return await wakeup.wait(2)

    assert run_async(scenario) is True


@override_settings(HARNESS_WAKE_LINGER=0.2)
def test_a_wait_cancelled_while_leaving_still_unsubscribes() -> None:
    """(Review: a cancellation while the hub's lock was busy left a channel subscribed in
    Redis that nothing tracked.)"""
    channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")
    before = others()

    async def scenario() -> tuple[int, bool]:
        entered = asyncio.Event()

        async def waiter() -> None:
            async with wakeups.wake_on([channel]):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(waiter())
        await entered.wait()
        hub = wakeups._hub()
        async with hub.lock:  # busy: the leaving waiter must wait for it
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # again, while it leaves (anyio, the MCP SDK's, cancels so)
            await asyncio.sleep(0.05)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Past the linger, and Redis has seen the unsubscribe (not a fixed 0.6 s: the
        # unsubscribe is a trip to Redis a loaded host may take longer over); one never
        # unsubscribed is still counted at the deadline.
        deadline = asyncio.get_running_loop().time() + 15
        while sub_count(before) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return sub_count(before), channel in hub.waiters or channel in hub.lingering

    assert run_async(scenario) == (0, False)


def test_waiting_again_on_a_lingering_channel_asks_redis_nothing() -> None:
    channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")

    async def scenario() -> int:
        async with wakeups.wake_on([channel]):
            pass
        before = subscribes_so_far()
        async with wakeups.wake_on([channel]):
            pass
        return subscribes_so_far() - before

    assert run_async(scenario) == 0


@override_settings(HARNESS_WAKE_LINGER=5)
def test_a_refused_request_does_not_keep_a_channel_lingering() -> None:
    """(Review: a request with a bad token joined and left, and so renewed the linger.)"""
    channel = wakeups.session_channel(f"hub-{uuid.uuid4()}")

    async def scenario() -> tuple[float, float]:
        async with wakeups.wake_on([channel]):
            pass
        hub = wakeups._hub()
        expires = hub.lingering[channel]
        await asyncio.sleep(0.05)
        joined = wakeups.join_subscribed(channel)
        assert joined is not None and channel not in hub.lingering
        await joined.leave(served=False)
        return expires, hub.lingering[channel]

    before, after = run_async(scenario)
    assert after == before


def test_a_redis_that_accepts_and_never_answers_fails_waits_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Review: the hub's connect and the wait for its lock had no deadline, so a Redis
    that accepted the connection and answered nothing held every wait of the process.)"""
    import socket
    import threading

    monkeypatch.setattr(wakeups, "SUBSCRIBE_TIMEOUT", 1.0)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])  # and never a byte back

    threading.Thread(target=accept, daemon=True).start()
    mute = override_settings(REDIS_URL=f"redis://127.0.0.1:{server.getsockname()[1]}/0")

    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def one() -> float:
            with contextlib.suppress(wakeups.WakeUnavailable):
                async with wakeups.wake_on([wakeups.session_channel(f"hub-{uuid.uuid4()}")]):
                    pass
            return loop.time() - began

        return list(await asyncio.gather(*(one() for _ in range(4))))

    try:
        with mute:
            took = run_async(scenario)
    finally:
        stop.set()
        for conn in accepted:
            conn.close()
        server.close()
    # All gave up together, at SUBSCRIBE_TIMEOUT's deadline (not the default's 5 s), not one
    # after another (which spreads four by three timeouts: 3 s). Spread, not wall time: a
    # loaded machine may run the loop late for all alike, or stall it between two of them
    # (so half the one-after-another spread, not a fraction of a timeout).
    timeout = wakeups.SUBSCRIBE_TIMEOUT
    assert max(took) - min(took) < timeout * 1.5, took
    assert max(took) < timeout + 3.5, took  # (the default's 5 s would not be)
