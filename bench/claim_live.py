"""The worker's claim with its credential condition (transitions.live_credential_sql, an
EXISTS in the claim's UPDATE) and without, in the same run, alternated: the condition as
a plain read ("exists", what the release and admission's write use) and holding the
agent's row FOR KEY SHARE to the commit ("key_share", the worker's claim: a sign-out in
flight waits for it, or it for the sign-out).

    DATABASE_URL=postgres://... REDIS_URL=redis://.../N HARNESS_SECRET_KEY=... \\
        .venv/bin/python -m bench.claim_live [--rounds 10] [--block 40] [--threads 8]

Needs a migrated database (it writes an agent, sessions and calls to it). Prints the
median time of one claim transaction (BEGIN, the UPDATE with the chain head's lock, the
call.started append, COMMIT) per variant, alone and with `--threads` claiming calls of
one agent at once (one session each), and the ratios to the claim without the condition.
Figures, not a gate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")

import django  # noqa: E402

django.setup()

from django.db import connections, transaction  # noqa: E402

from audit import kinds  # noqa: E402
from dispatcher import admission, agents, transitions  # noqa: E402
from dispatcher.models import Status, ToolCall  # noqa: E402
from dispatcher.proposals import ProposedCall, canonical_json  # noqa: E402
from dispatcher.tools.registry import get_tool  # noqa: E402
from tests.support.factories import make_agent  # noqa: E402

VARIANTS = ("plain", "exists", "key_share")


def _calls(session: Any, count: int) -> list[ToolCall]:
    arguments = {"path": "a.txt"}
    proposed = [ProposedCall(uuid.uuid4().hex, "read_file", canonical_json(arguments), arguments)]
    [first] = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    rows = []
    for _ in range(count):
        row = ToolCall.objects.get(pk=first.pk)
        row.pk, row.tool_use_id, row.status = uuid.uuid4(), uuid.uuid4().hex, Status.QUEUED
        rows.append(row)
    ToolCall.objects.bulk_create(rows)
    return list(ToolCall.objects.filter(pk__in=[r.pk for r in rows]).select_related("session"))


def _claim(call: ToolCall, variant: str) -> float:
    tool = get_tool(call.name, call.session.client)
    assert tool is not None
    started = time.perf_counter()
    with transaction.atomic():
        done = transitions.transition(
            call,
            Status.RUNNING,
            kind=kinds.CALL_STARTED,
            actor="worker",
            payload={"attempt": 1, "timeout": tool.timeout},
            publish=False,
            live=variant != "plain",
            hold_credential=variant == "key_share",
            attempts=1,
        )
    assert done, "the claim wrote nothing"
    return time.perf_counter() - started


def _alone(calls: dict[str, list[ToolCall]], rounds: int, block: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            for _ in range(block):
                times[variant].append(_claim(calls[variant].pop(), variant))
    return times


def _together(
    sessions: list[Any], variant: str, per_thread: int, make: Callable[[Any, int], list[ToolCall]]
) -> list[float]:
    work = [make(s, per_thread) for s in sessions]
    times: list[float] = []
    start = threading.Barrier(len(sessions))

    def run(calls: list[ToolCall]) -> None:
        try:
            start.wait()
            mine = [_claim(call, variant) for call in calls]
            times.extend(mine)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(calls,)) for calls in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    per = args.rounds * args.block
    calls = {v: _calls(session, per + 1) for v in VARIANTS}
    for variant in VARIANTS:  # warm: each statement prepared once
        _claim(calls[variant].pop(), variant)
    alone = _alone(calls, args.rounds, args.block)
    base = statistics.median(alone["plain"])
    print(f"one claim at a time ({per} each, alternated in blocks of {args.block}):")
    for variant in VARIANTS:
        m = statistics.median(alone[variant])
        print(f"  {variant:9} median {m * 1000:.3f} ms  ratio {m / base:.3f}")
    sessions = [agents.start_session(agent=fx.agent) for _ in range(args.threads)]
    print(f"{args.threads} threads claiming calls of one agent at once:")
    together: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(max(args.rounds // 2, 1)):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            together[variant] += _together(sessions, variant, args.block, _calls)
    base = statistics.median(together["plain"])
    for variant in VARIANTS:
        m = statistics.median(together[variant])
        print(f"  {variant:9} median {m * 1000:.3f} ms  ratio {m / base:.3f}")


if __name__ == "__main__":
    main()
