"""How long a revocation's first statement (the agent's row locked FOR UPDATE, as a
sign-out, a rotation, a void or a move lock it: agents.revoke_agent) waits while worker
processes claim and run calls of that agent in a loop (each claim holds the agent's row
FOR KEY SHARE to its commit: transitions.live_credential_sql(hold=True)). PostgreSQL
queues no waiter behind share lockers: while one of them is always in flight, the
revocation waits.

    DATABASE_URL=postgres://... REDIS_URL=redis://.../N HARNESS_SECRET_KEY=... \\
        .venv/bin/python -m bench.kill_under_stream [--procs 1 2 4] [--stream 20]

Needs a migrated database (it writes agents, sessions and calls to it). Prints, per
number of processes, the calls claimed per second and how long the lock waited (capped
by what is left of the stream: a lock that waited that long was starved for all of it).
Figures, not a gate.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")

import django  # noqa: E402

django.setup()

from django.db import connections, transaction  # noqa: E402

from dispatcher import admission, agents, execution  # noqa: E402
from dispatcher.models import Agent, Status, ToolCall  # noqa: E402
from dispatcher.proposals import ProposedCall, canonical_json  # noqa: E402
from tests.support.factories import make_agent  # noqa: E402


def _stream(call_ids: list[str], until: float, counts: Any, index: int, stop: Any) -> None:
    """Claim and run the queued calls `call_ids` (the worker's task body) until `until`."""
    for call_id in call_ids:
        if time.time() >= until or stop.value:
            break
        execution.execute_call(call_id)
        counts[index] += 1
    connections.close_all()


def _queued(session: Any, count: int) -> list[str]:
    """`count` queued read_file calls of `session` (one admitted, the rest its copies)."""
    arguments = {"path": "a.txt"}
    proposed = [ProposedCall(uuid.uuid4().hex, "read_file", canonical_json(arguments), arguments)]
    [first] = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    rows = []
    for _ in range(count):
        row = ToolCall.objects.get(pk=first.pk)
        row.pk, row.tool_use_id, row.status = uuid.uuid4(), uuid.uuid4().hex, Status.QUEUED
        rows.append(row)
    ToolCall.objects.bulk_create(rows)
    return [str(row.pk) for row in rows]


def measure(procs: int, stream: float) -> tuple[float, float]:
    """(calls claimed per second before the revocation, seconds the revocation waited)."""
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    (Path(session.workspace) / "a.txt").write_text("x")
    calls = [_queued(session, int(stream * 60)) for _ in range(procs)]
    connections.close_all()
    context = multiprocessing.get_context("spawn")
    counts, stop = context.Array("i", procs), context.Value("i", 0)
    until = time.time() + stream
    workers = [
        context.Process(target=_stream, args=(calls[i], until, counts, i, stop))
        for i in range(procs)
    ]
    for worker in workers:
        worker.start()
    while sum(counts) < 20 * procs and time.time() < until:  # every process claiming
        time.sleep(0.05)
    before, start = sum(counts), time.time()
    time.sleep(1.0)
    rate = (sum(counts) - before) / (time.time() - start)
    started = time.time()
    with transaction.atomic():  # revoke_agent's first statement, without its sweep
        Agent.objects.select_for_update(of=("self",)).filter(pk=fx.agent.pk).exists()
        waited = time.time() - started
    stop.value = 1
    for worker in workers:
        worker.join(60)
    connections.close_all()
    return rate, waited


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--stream", type=float, default=20.0)
    options = parser.parse_args()
    for procs in options.procs:
        rate, waited = measure(procs, options.stream)
        print(f"processes {procs}: {rate:.0f} calls/s claimed, revocation waited {waited:.2f} s")


if __name__ == "__main__":
    main()
