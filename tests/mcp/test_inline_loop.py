"""Where an inline call's upstream request is made (issue 37; upstream.Pool.loop_for): a
web request that runs a call of an HTTP upstream server inline makes the request on its
own event loop, which awaits the call, rather than on the pool's loop thread; a worker's
call, a stdio server's, and a call from the loop's own thread stay on the pool's loop.

Against a real upstream HTTP server; the gateway's side of it (a request's call answered
while the pool's loop thread is held up) is in test_fast_path.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dispatcher.tools.sources import upstream

pytestmark = [pytest.mark.heavy]


def http_endpoint(url: str) -> upstream.Endpoint:
    return upstream.Endpoint(server_id=0, version=1, name="loops", transport="http", url=url)


def test_a_call_from_the_loops_own_thread_goes_to_the_pool_and_does_not_wait_on_itself(
    http_upstream: str,
) -> None:
    """A body run on the very loop it names (synchronous code on the loop's thread) would
    block the loop it waits for: the call goes to the pool's loop and is answered."""
    endpoint = http_endpoint(http_upstream)
    [echo] = [d for d in upstream.list_definitions(endpoint) if d.name == "echo"]

    async def on_the_loop() -> str:
        loop = asyncio.get_running_loop()
        assert upstream.POOL.loop_for(endpoint, loop) is upstream.POOL.loop()
        result = upstream.POOL.call(endpoint, "echo", echo.fingerprint, {"text": "x"}, loop)
        return upstream.result_text(result)

    assert asyncio.run(asyncio.wait_for(on_the_loop(), 60)) == "echo: x"


def test_a_stopped_loop_a_stdio_server_and_a_worker_use_the_pools_loop(
    http_upstream: str,
) -> None:
    endpoint = http_endpoint(http_upstream)
    stdio = upstream.Endpoint(server_id=0, version=1, name="p", transport="stdio")
    own = upstream.POOL.loop()
    stopped = asyncio.new_event_loop()
    try:
        assert upstream.POOL.loop_for(endpoint, stopped) is own  # not running
    finally:
        stopped.close()
    assert upstream.POOL.loop_for(endpoint, None) is own  # a worker's call
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), running).result(10)
        assert upstream.POOL.loop_for(endpoint, running) is running
        assert upstream.POOL.loop_for(stdio, running) is own
    finally:
        running.call_soon_threadsafe(running.stop)
        thread.join(10)
        running.close()
