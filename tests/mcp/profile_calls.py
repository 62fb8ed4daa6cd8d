"""A measurement, not a test (pytest collects it only when named): the Python work of an
auto-allowed call on admission's write path and its result's write (docs/benchmarks.md,
"Less Python on the allowed call's writes"). Run it against the checkouts to compare:

    pytest -p no:cacheprovider -q -s tests/mcp/profile_calls.py

It prints, per call: the function calls of an MCP admission in the inline lane
(`admit_message`, a trusted upstream HTTP server's `echo`) and of its result's write
(`record_result`), of an agent API admission (`submit_calls`) and of the worker's run
(`execute_call`), with the CPU each took under the profiler; with PERF_INCLUSIVE=1 the
functions that hold the most calls, inclusively (every call counted for each distinct
function on the stack)."""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import time
from typing import Any

import pytest
import redis

from dispatcher import admission, agents, execution, pipeline
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate
from dispatcher.models import AgentSession, Status
from dispatcher.proposals import ProposedCall, canonical_json
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True)]

N = 50


def proposal(i: int, name: str, arguments: dict[str, Any]) -> ProposedCall:
    return ProposedCall(f"mcp:{i}", name, canonical_json(arguments), arguments)


class Inclusive:
    """sys.setprofile hook: every call counted once for each distinct function on the
    stack (recursion counted once)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.counts: dict[str, int] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            if event == "c_call":
                name = f"~{getattr(arg, '__qualname__', arg)}"
            else:
                code = frame.f_code
                name = f"{code.co_filename.split('site-packages/')[-1]}:{code.co_qualname}"
            for function in set(self.stack):
                self.counts[function] = self.counts.get(function, 0) + 1
            self.counts[name] = self.counts.get(name, 0) + 1
            self.stack.append(name)
        elif event in ("return", "c_return", "c_exception") and self.stack:
            self.stack.pop()

    def show(self, label: str, n: int) -> None:
        print(f"\n{label}, inclusive calls per call:")
        for name, count in sorted(self.counts.items(), key=lambda kv: -kv[1])[:60]:
            if not name.startswith("~"):
                print(f"{count / n:8.0f}  {name}")


class Meter:
    """Function calls (cProfile), CPU (process_time) and, when asked, inclusive counts."""

    def __init__(self) -> None:
        self.profile = cProfile.Profile()
        self.cpu = 0.0
        self.inclusive = Inclusive() if os.environ.get("PERF_INCLUSIVE") else None

    def run(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        if self.inclusive is not None:
            sys.setprofile(self.inclusive)
            try:
                return function(*args, **kwargs)
            finally:
                sys.setprofile(None)
                self.inclusive.stack.clear()
        started = time.process_time()
        self.profile.enable()
        try:
            return function(*args, **kwargs)
        finally:
            self.profile.disable()
            self.cpu += time.process_time() - started

    def report(self, label: str, n: int) -> None:
        if self.inclusive is not None:
            self.inclusive.show(label, n)
            return
        calls = sum(entry[1] for entry in pstats.Stats(self.profile).stats.values())  # type: ignore[attr-defined]
        print(
            f"\n{label}: {calls / n:.0f} function calls per call ({self.cpu / n * 1000:.2f} ms CPU, profiled)"
        )


def loaded(token: str, external_id: str) -> AgentSession:
    _, session = authenticate(token, external_id)
    assert session is not None
    return session


def test_an_inline_mcp_admission_and_its_result(trusted_upstream: str) -> None:
    fx = make_agent(mode="trusted")
    session = agents.join_run(agent=fx.agent, client=mcp.CLIENT, title="MCP", idle=0)[0]
    name = f"{trusted_upstream}__echo"
    for i in range(10):  # (warm: statements prepared, caches filled)
        warm = proposal(i, name, {"text": "w"})
        mcp.submit(loaded(fx.token, session.external_id), warm, preloaded=True)
    admitting, writing = Meter(), Meter()
    outcome: pipeline.Outcome | None = None
    for i in range(N):
        session_read = loaded(fx.token, session.external_id)
        item = proposal(100 + i, name, {"text": f"t{i}"})
        _, kept = admitting.run(
            admission.admit_message,
            session=session_read,
            dialect="mcp",
            proposed=[item],
            profile_preloaded=True,
            inline=True,
        )
        claimed, ctx = kept[0]
        if outcome is None:  # (the upstream's answer, once: the body is not measured)
            outcome, _ = asyncio.run(execution.run_body_async(claimed, ctx))
        writing.run(execution.record_result, claimed, ctx, outcome, seconds=0.001)
        assert claimed.status == Status.COMPLETED
    admitting.report("MCP admission, inline (admit_message)", N)
    writing.report("its result's write (record_result)", N)


def test_the_gateways_trips_of_an_inline_call(trusted_upstream: str) -> None:
    """The MCP gateway's two trips of an allowed call run on the loop, with the request's
    wait slot, as `mcp._admit_and_run` makes them: `mcp.admit` (the slot taken, the
    admission, the claim) and `mcp.finish` (the result's write, its wake-up, the slot
    given back); with the Redis round trips of each (commands sent, pipelines as one).
    Then the same trips N more times without the profiler, for their CPU alone."""
    fx = make_agent(mode="trusted")
    session = agents.join_run(agent=fx.agent, client=mcp.CLIENT, title="MCP", idle=0)[0]
    name = f"{trusted_upstream}__echo"
    sent: list[str] = []
    real: list[pipeline.Outcome] = []
    send: Any = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append("x")
        send(self, command, check_health)

    def trips(i: int, admitting: Meter, writing: Meter) -> tuple[int, int]:
        slot = mcp.WaitSlot(fx.agent, 60)
        item = proposal(i, name, {"text": f"t{i}"})
        session_read = loaded(fx.token, session.external_id)
        before = len(sent)
        call, pending = admitting.run(
            mcp.admit, session_read, item, preloaded=True, slot=slot, on_loop=True
        )
        assert pending is not None
        admitted = len(sent) - before
        if not real:  # (the upstream's answer, once: the body is not measured)
            real.append(asyncio.run(execution.run_body_async(*pending))[0])
        before = len(sent)
        writing.run(mcp.finish, call, pending, real[0], 0.001, slot)
        assert call.status == Status.COMPLETED
        return admitted, len(sent) - before

    for i in range(10):  # (warm)
        trips(i, Meter(), Meter())
    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        admitting, writing = Meter(), Meter()
        counts = [trips(100 + i, admitting, writing) for i in range(N)]
        cpu_admit = cpu_finish = 0.0
        for i in range(N * 2):
            slot = mcp.WaitSlot(fx.agent, 60)
            session_read = loaded(fx.token, session.external_id)
            t0 = time.process_time()
            call, pending = mcp.admit(
                session_read,
                proposal(1000 + i, name, {"text": "c"}),
                preloaded=True,
                slot=slot,
                on_loop=True,
            )
            t1 = time.process_time()
            assert pending is not None
            mcp.finish(call, pending, real[0], 0.001, slot)
            cpu_admit += t1 - t0
            cpu_finish += time.process_time() - t1
    finally:
        redis.connection.AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    admitting.report("the gateway's admission trip (mcp.admit, with its wait slot)", N)
    writing.report("the gateway's result trip (mcp.finish: the write, wake-up, slot)", N)
    print(
        f"Redis round trips per call: admission {statistics.median(c[0] for c in counts)}, "
        f"result {statistics.median(c[1] for c in counts)}"
    )
    print(
        f"CPU per call without the profiler ({N * 2} calls): admission trip "
        f"{cpu_admit / (N * 2) * 1000:.2f} ms, result trip {cpu_finish / (N * 2) * 1000:.2f} ms"
    )


def test_an_agent_api_admission_and_the_workers_run() -> None:
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    listing = {"path": "."}
    for i in range(10):
        admission.submit_calls(
            session=session, dialect="native", proposed=[proposal(i, "list_directory", listing)]
        )
    admitting, running = Meter(), Meter()
    calls = []
    for i in range(N):
        item = proposal(100 + i, "list_directory", listing)
        calls += admitting.run(
            admission.submit_calls, session=session, dialect="native", proposed=[item]
        )
    for call in calls:
        running.run(execution.execute_call, str(call.pk))
    admitting.report("agent API admission (submit_calls)", N)
    running.report("the worker's run of list_directory (execute_call)", N)
