"""rtcap3: a call is counted in the share of the owner whose ring its take found it in. An
agent moved to another person (agents.transfer_agent) with a call still listed in its
former owner's ring had that call counted as the former owner's: it started beside a
call of its new owner running at their cap of one, two of one person's calls at once.
Now its hold gives the former owner's place back and takes one among its owner's
running calls, below the cap or not at all (then the call is sent again)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import agents, execution
from dispatcher.models import Agent, Status, ToolCall
from tests.battery.procs import wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import live_places, status, worker


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_call_of_an_agent_moved_to_another_person_counts_in_that_persons_share(
    cap_lane: tuple[Any, str],
) -> None:
    broker, queue = cap_lane
    moved, theirs = make_agent(mode="trusted"), make_agent(mode="trusted")
    # A call of the new owner's own runs, at their cap of one ...
    session = agents.start_session(agent=theirs.agent)
    long = submit_one(session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "their call to run")
        # ... when the moving agent's call is listed in its first owner's ring.
        later = submit_one(agents.start_session(agent=moved.agent), "list_directory", {"path": "."})
        assert later.status == Status.QUEUED
        Agent.objects.filter(pk=moved.agent.pk).update(owner=theirs.owner)
        assert broker.rpop(queue) is not None
        execution.execute_turn(str(later.pk))
        # Before: counted in its former owner's share, it ran beside its new owner's call.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
        assert live_places(broker, queue, moved.owner.pk) == 0
        assert live_places(broker, queue, theirs.owner.pk) == 1
    finally:
        Path(session.workspace, "go").touch()
        thread.join(30)
    assert not thread.is_alive()
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    for call in (long, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, theirs.owner.pk) == 0
