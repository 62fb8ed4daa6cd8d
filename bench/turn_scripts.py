"""The turns' Redis scripts (dispatcher.batches: _PUSH, _TAKE, _HOLD, _RELEASE), sent two
ways in one process on one Redis (docs/benchmarks.md, "The caps' Redis scripts"): A, a
redis-py registered Script (`redis_at(url).register_script(text)`, as batches sent them
before), and B, floor.redis_clients.Script (EVALSHA packed by Harness on the same pool,
as they are sent now). Rounds alternate A B / B A; each reports the process's CPU
(process_time: the socket's system time is in it) per call, and the ratio B/A per round
(median, min, max). And the cost the running cap's claim adds (`kept_since_hold`: one
GET of the mark in the claim's transaction): CPU and wall time per call.

    python -m bench.turn_scripts [--calls N] [--rounds R]

Needs Redis (BENCH_REDIS_URL, default redis://127.0.0.1:6379/14); touches only keys
under `bench-turns-<pid>`, deleted at the end.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import django


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    os.environ.setdefault("HARNESS_SECRET_KEY", "bench-secret-key-not-for-production")
    django.setup()


def _cases(url: str, queue: str) -> dict[str, tuple[str, list[str], list[Any], Callable[[], None]]]:
    """Each script with keys and arguments as batches sends them, and what resets its keys
    between rounds (a push lists its call again each time)."""
    from dispatcher import batches
    from floor import celery_message
    from floor.redis_clients import redis_at

    broker = redis_at(url)
    ring, prefix = batches._fair_keys(queue)
    agent = str(uuid.uuid4())
    calls = prefix + agent
    running = batches._running_key(queue, "1")
    token = uuid.uuid4().hex
    message = celery_message.task_message(batches.EXECUTE_TASK, str(uuid.uuid4()), queue)
    kinds, parts = celery_message.task_message_template(
        batches.EXECUTE_TASK, batches.OWED_TURN, queue
    )
    broker.set(batches._counted_key(queue), uuid.uuid4().hex)

    def reset() -> None:
        keys = list(broker.scan_iter(f"{queue}:fair:*")) + [queue]
        broker.delete(*keys)

    push_keys = [
        ring,
        calls,
        queue,
        calls + ":in",
        batches._owner_key(queue, "1"),
        calls + ":owner",
    ]
    return {
        "_PUSH": (batches._PUSH, push_keys, [str(uuid.uuid4()), agent, message, "1"], reset),
        "_TAKE": (
            batches._TAKE,
            [ring, batches._owed_key(queue), batches._counted_key(queue)],
            [
                prefix,
                batches._owner_key(queue, ""),
                1,
                batches._running_key(queue, ""),
                token,
                2.0,
                3600,
            ],
            reset,
        ),
        "_HOLD": (
            batches._HOLD,
            [running, batches._counted_key(queue)],
            [token, 32.0, 3600, 1],
            reset,
        ),
        "_RELEASE": (
            batches._RELEASE,
            [running, batches._owed_key(queue), queue, ring],
            [token, kinds, "", "null", "", *parts],
            reset,
        ),
    }


def _per_call(run: Callable[[], Any], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        run()
    return (time.process_time() - started) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    _setup()
    from dispatcher import batches
    from floor.redis_clients import Script, redis_at

    url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    queue = f"bench-turns-{os.getpid()}"
    client = redis_at(url)
    print(f"redis {url}, {options.rounds} rounds of {options.calls} calls per way")
    try:
        for name, (text, keys, args, reset) in _cases(url, queue).items():
            old = client.register_script(text)
            new = Script(text)
            ways: dict[str, Callable[[], Any]] = {
                "A": functools.partial(old, keys=keys, args=args),
                "B": functools.partial(new.run, client, keys, args),
            }
            for send in ways.values():  # (each loaded once, the pool warm)
                send()
            reset()
            seconds: dict[str, list[float]] = {"A": [], "B": []}
            for round_ in range(options.rounds):
                for way in "AB" if round_ % 2 == 0 else "BA":
                    seconds[way].append(_per_call(ways[way], options.calls))
                    reset()
            ratios = [b / a for a, b in zip(seconds["A"], seconds["B"], strict=True)]
            print(
                f"{name:9} A {statistics.median(seconds['A']) * 1e6:6.1f} us  "
                f"B {statistics.median(seconds['B']) * 1e6:6.1f} us  B/A median "
                f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
            )
        # The claim's question (batches.kept_since_hold), on a turn that held a place: the
        # mark read by redis-py's GET (A) and by the packed script it sends (B).
        turn = batches.Turn("c", url, queue, batches._running_key(queue, "1"), "t")
        turn.generation = uuid.uuid4().hex
        mark = batches._counted_key(queue)
        client.set(mark, turn.generation)
        assert batches.kept_since_hold(turn)
        asks: dict[str, Callable[[], Any]] = {
            "A": functools.partial(client.get, mark),
            "B": functools.partial(batches.kept_since_hold, turn),
        }
        cpu: dict[str, list[float]] = {"A": [], "B": []}
        wall: dict[str, list[float]] = {"A": [], "B": []}
        for round_ in range(options.rounds):
            for way in "AB" if round_ % 2 == 0 else "BA":
                began = time.perf_counter()
                cpu[way].append(_per_call(asks[way], options.calls))
                wall[way].append((time.perf_counter() - began) / options.calls)
        ratios = [b / a for a, b in zip(cpu["A"], cpu["B"], strict=True)]
        print(
            f"the claim's question: GET (A) CPU {statistics.median(cpu['A']) * 1e6:.1f} us, "
            f"wall {statistics.median(wall['A']) * 1e6:.1f} us; kept_since_hold (B) CPU "
            f"{statistics.median(cpu['B']) * 1e6:.1f} us, wall "
            f"{statistics.median(wall['B']) * 1e6:.1f} us per claim; CPU B/A median "
            f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
        )
    finally:
        leftover = list(client.scan_iter(f"{queue}*"))
        if leftover:
            client.delete(*leftover)


if __name__ == "__main__":
    main()
