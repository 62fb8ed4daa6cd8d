"""What the MCP gateway reads before it admits a call (dispatcher.gateways.mcp_http.
authenticate): after initialize, the token and the session it names in one query, with
the owner's profile and the session's grants, and nothing a bad token could time."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dispatcher import agents
from dispatcher.admission import context_of
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate
from dispatcher.models import Status
from dispatcher.policy import grants
from dispatcher.policy.models import PermissionProfile, SessionGrant
from dispatcher.proposals import ProposedCall, canonical_json
from tests.support.factories import make_agent

pytestmark = pytest.mark.django_db


def open_session(agent: Any, params: dict[str, Any]) -> Any:
    """A new MCP session of `agent`, as an initialize with no run to join starts one."""
    return agents.join_run(agent=agent, client=mcp.CLIENT, title="MCP session", idle=0)[0]


PROFILES = PermissionProfile._meta.db_table


def _proposed(tool_use_id: str, name: str, arguments: dict[str, str]) -> ProposedCall:
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def test_a_good_token_and_its_session_are_one_query_with_what_admission_needs() -> None:
    fx = make_agent(mode="standard")
    session = open_session(fx.agent, {})
    with CaptureQueriesContext(connection) as read:
        agent, loaded = authenticate(fx.token, session.external_id)
        assert loaded is not None and loaded.pk == session.pk
        assert agent == fx.agent and loaded.agent.owner == fx.owner
        loaded.agent.owner.permission_profile  # noqa: B018 (read with the session)
        assert loaded.has_grants is False  # type: ignore[attr-defined]
    assert len(read) == 1


def test_a_bad_token_costs_the_same_whether_its_session_id_exists_or_not() -> None:
    fx, stranger = make_agent(mode="standard"), make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    last = fx.token[-1]
    wrong = fx.token[:-1] + ("a" if last != "a" else "b")
    sent: dict[str, list[str]] = {}
    for label, token, session_id in (
        ("real id", wrong, session.external_id),
        ("unknown id", wrong, "0" * 32),
        ("another agent's token", stranger.token[:-1] + "!", session.external_id),
    ):
        with CaptureQueriesContext(connection) as read:
            assert authenticate(token, session_id) == (None, None)
        sent[label] = [q["sql"].split(" WHERE ")[0] for q in read]
        # The session read is filtered by the token's hash: a bad token's finds no row,
        # so no instance is built for a real id that an unknown one would not cost.
        assert agents._hash_token(token) in read[0]["sql"]
    assert sent["real id"] == sent["unknown id"] == sent["another agent's token"]
    assert len(sent["real id"]) == 2  # the session read, then authenticate_token's


@pytest.mark.parametrize(
    "odd", ["x" * 201, "abc\x01def", "abc\x7fdef", "abc\u00e9", "line\nbreak", "tab\there"]
)
def test_an_id_harness_could_not_have_issued_is_not_sent_with_the_token(odd: str) -> None:
    fx = make_agent(mode="standard")
    with CaptureQueriesContext(connection) as read:
        assert authenticate(fx.token, odd) == (fx.agent, None)
    assert len(read) == 1  # authenticate_token's alone
    assert "external_id" not in read[0]["sql"]


def test_admission_on_a_loaded_session_reads_no_profile_and_applies_its_grants() -> None:
    fx = make_agent(mode="standard")
    session = open_session(fx.agent, {})
    arguments = {"path": "notes.txt", "content": "hello"}
    # Not loaded (an initialize request's new session): admission reads the profile.
    with CaptureQueriesContext(connection) as plain:
        first = mcp.submit(session, _proposed("mcp:1", "write_file", arguments))
    assert first.status == Status.PENDING_APPROVAL
    assert any(PROFILES in q["sql"] for q in plain)
    SessionGrant.objects.create(
        session=session, rule=grants.narrow_rule(context_of(first)), tool="write_file"
    )
    _, loaded = authenticate(fx.token, session.external_id)
    assert loaded is not None and loaded.has_grants is True  # type: ignore[attr-defined]
    with CaptureQueriesContext(connection) as preloaded:
        second = mcp.submit(loaded, _proposed("mcp:2", "write_file", arguments), preloaded=True)
    assert not any(PROFILES in q["sql"] for q in preloaded)
    assert (second.status, second.decided_by) == (
        Status.QUEUED,
        f"grant:{grants.narrow_rule(context_of(first))}",
    )
    # A revoked agent's token reads nothing of its sessions any more.
    agents.revoke_agent(agent=fx.agent, actor="test")
    assert authenticate(fx.token, session.external_id) == (None, None)
