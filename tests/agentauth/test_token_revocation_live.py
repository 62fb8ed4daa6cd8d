"""Revoking one OAuth access token (RFC 7009) while a real Celery worker has its call:
the worker denies it unrun (tests/agentauth/test_token_revocation_calls.py for the rest).

Its own module, unmarked: a live test in a module marked django_db(transaction=True) goes
out among the transactional tests (pytest-django's order), and the live stack's worker,
once started, runs calls that the tests after it on that xdist worker mean to stay queued
(CI, 2026-12-07: five such tests failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.models import Status
from dispatcher.tools import workspace_lock
from tests.agentauth.test_token_revocation_calls import _revoke, _session, _two_sign_ins
from tests.identity.test_leaver_queued_calls import ended, given_back
from tests.support.factories import submit_one, unique
from tests.support.live import LiveStack
from tests.support.oauth import DocumentServer, documents

__all__ = ["documents"]  # the fixture


@pytest.mark.live
def test_a_real_worker_denies_the_queued_call_of_a_token_revoked_while_it_waited(
    documents: DocumentServer, live_stack: LiveStack, live_db: None
) -> None:
    """With a real Celery worker: the call is taken by the worker and given back (another
    command holds its workspace); the token is revoked at /oauth/revoke/; the worker's
    next turn denies it unrun, and a call of the agent's other sign-in runs."""
    client_id, agent, first, second = _two_sign_ins(documents)
    lost = _session(first["access_token"], agent)
    kept = _session(second["access_token"], agent)
    workspace = Path(lost.workspace)
    with workspace_lock.held(workspace):  # another command of the session runs
        gone = submit_one(lost, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
        given_back(str(gone.pk))  # the worker has had it; it waits for the workspace
        _revoke(client_id, first["access_token"])
    call = ended(str(gone.pk))
    # Was: completed, the file's text its result.
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.content
    assert "was revoked" in call.content and "secret" not in call.content
    assert call.started_at is None and call.attempts == 0
    fine = submit_one(kept, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    done = ended(str(fine.pk))
    assert done.status == Status.COMPLETED and "secret" in done.content, done.content
