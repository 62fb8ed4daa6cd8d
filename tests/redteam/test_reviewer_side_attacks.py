"""Red-team of the reviewer side of approvals: what a reviewer approves is exactly what
runs, approved by whom the rules require, and only once. Each test is an attack through
the real views (Django test client, real PostgreSQL); it passes when the attack fails.

Found and fixed with these tests:
- Under separation of duties (HARNESS_FORBID_SELF_APPROVAL) a quorum counted an earlier
  vote of a reviewer who had since become one of the people behind the agent (it was
  handed over to them, or they became its sponsor): the owner's own vote approved their
  agent's call. Such a vote is now discarded when the quorum is counted, as a leaver's is
  (services._departure).
- A one-tap link confirmed with an effect digest other than the previewed one was refused,
  but its audit event (approval.digest_mismatch) was rolled back with the link's
  transaction, where the queue keeps it (links.use).
- A call its client runs (a coding agent's hook, decide-only) was released to the client
  the moment a reviewer approved it, with no re-check of the guards, where the worker
  re-runs them before any other call runs: an agent revoked, or an owner's mode locked,
  while its hook waited still got "allow", and the client ran the command. The guards now
  run when such a call is approved; one that denies ends it denied, the reviewer told why
  (services._release_denial, transitions.deny_at_release).
- Where quorum rules of several layers matched a call, only the one asking the most
  approvals counted: an agent's owner (their own profile) or a team admin (the team's
  layer) adding `{"rule": "write_file", "approvals": 2}` dropped the organization's "1 of
  sre": two reviewers outside sre approved. Every matching rule now holds together
  (dispatcher.policy.layers.combined): 1 of sre and 1 more from anyone
  (tests/redteam/test_quorum_anyone.py).
- A call whose denial a step-up rule asks to be signed could be ended unsigned by an
  edit (the original ends `edited`, unrun, as by a denial): such a call is now not
  editable; it is denied, signed, with feedback (services._edit_refusal).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from approvals import links
from approvals.models import ApprovalRequest, UsedLink, Vote
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from dispatcher.policy import managed, profiles
from tests.approvals.conftest import ask, closing_connections
from tests.approvals.test_preview_approval import _ask_script, previews_on  # noqa: F401
from tests.approvals.test_quorum import WRITE, quorum_agent, reviewer, status_of, vote
from tests.support.claude_code_hooks import decision, pre_tool_use, send
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("becomes", ["owner", "sponsor"])
@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
def test_a_vote_of_someone_who_since_stands_behind_the_agent_does_not_count(
    becomes: str,
) -> None:
    fx = quorum_agent(approvals=2)
    approval = ask(fx, WRITE)
    first, first_client = reviewer()
    _, second_client = reviewer()
    assert vote(first_client, approval).status_code == 200
    if becomes == "owner":  # e.g. the owner left and the agent went to this reviewer
        agents.hand_over_agent(agent=fx.agent, to=first, actor="test")
    else:
        agents.transfer_agent(agent=fx.agent, sponsor=first, actor="test")

    answer = vote(second_client, approval)

    assert answer.status_code == 200, answer.content
    assert "counts: 1 of 2" in answer.content.decode()
    assert status_of(approval) == "pending_approval"
    assert not Vote.objects.filter(approval=approval, voter=first).exists()
    discarded = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.vote_discarded"
    )
    assert discarded.payload["reviewer"] == first.username
    assert discarded.payload["reason"] == f"they are now this agent's {becomes}"
    # ... and they cannot vote again either: a third, independent reviewer completes it.
    assert vote(first_client, approval).status_code == 403
    _, third_client = reviewer()
    assert vote(third_client, approval).status_code == 200
    assert status_of(approval) == "queued"


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


@pytest.mark.usefixtures("previews_on")
def test_a_link_confirmed_for_another_effect_is_refused_and_audited_as_the_queue_does(
    agent: AgentFixture, reviewer: User
) -> None:
    approval = _ask_script(agent)
    assert approval.effect_digest
    client = Client()
    client.force_login(reviewer)
    link = _path(links.make_url(approval, reviewer, "approve"))
    other_effect = "0" * 64

    refused = client.post(link, {"digest": approval.call.digest, "effect_digest": other_effect})

    assert refused.status_code == 409 and "effect digest mismatch" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    mismatch = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.digest_mismatch"
    )
    assert mismatch.actor == f"user:{reviewer.username}"
    assert mismatch.payload["effect_digest_seen"] == other_effect
    # Nothing was decided, so the link is still unused: confirmed with the effect shown,
    # it decides, once.
    assert not UsedLink.objects.filter(approval=approval).exists()
    done = client.post(
        link, {"digest": approval.call.digest, "effect_digest": approval.effect_digest}
    )
    assert done.status_code == 200 and "Approved run_command." in done.content.decode()
    assert status_of(approval) == "queued"
    again = client.post(
        link, {"digest": approval.call.digest, "effect_digest": approval.effect_digest}
    )
    assert again.status_code == 409


def _while_the_hook_waits(session_id: str, before: Any, reviewer: User) -> dict[str, Any]:
    """In another thread: once the hook's call asks, `before(agent)`, then the reviewer
    approves it on the queue; what they were answered lands in the returned dict."""
    seen: dict[str, Any] = {}

    @closing_connections
    def act() -> None:
        for _ in range(200):
            approval = (
                ApprovalRequest.objects.filter(call__session__external_id=session_id)
                .select_related("call__session__agent__owner")
                .first()
            )
            if approval is not None:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the call never asked")
        before(approval.call.session.agent)
        client = Client()
        client.force_login(reviewer)
        answer = client.post(
            f"/approvals/{approval.pk}/decide",
            {"action": "approve", "digest": approval.call.digest},
            headers={"HX-Request": "true"},
        )
        seen.update(status=answer.status_code, text=answer.content.decode(), id=approval.pk)

    thread = threading.Thread(target=act)
    thread.start()
    seen["thread"] = thread
    return seen


def _revoke(agent: Any) -> None:
    agents.revoke_agent(agent=agent, actor="owner")


def _lock(agent: Any) -> None:
    profiles.set_mode(user=agent.owner, mode="locked", actor="owner")


@pytest.mark.parametrize(
    ("change", "why"),
    [(_revoke, "was revoked; none of its calls run any more"), (_lock, "in locked mode")],
)
@pytest.mark.django_db(transaction=True)
def test_a_client_run_call_approved_after_its_agent_was_stopped_is_not_released(
    change: Any, why: str
) -> None:
    fx = make_agent(mode="standard")
    reviewer_user = make_user(unique("rev"), groups=("reviewer",))
    session_id = str(uuid.uuid4())
    seen = _while_the_hook_waits(session_id, change, reviewer_user)

    body = pre_tool_use(session_id, "Bash", {"command": "rm -rf build"})
    action, reason = decision(send(fx, body, wait=20))
    seen["thread"].join()

    assert action == "deny" and why in reason
    assert seen["status"] == 200 and "It will not run:" in seen["text"] and why in seen["text"]
    call = ToolCall.objects.get(session__external_id=session_id)
    assert call.status == Status.DENIED
    denied = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.denied")
    assert denied.payload["stage"] == "release"
    assert denied.payload["reviewer"] == reviewer_user.username
    assert not AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.approved").exists()
    assert ApprovalRequest.objects.get(pk=seen["id"]).decided_by == reviewer_user


@pytest.mark.django_db(transaction=True)
def test_a_client_run_call_approved_while_its_agent_runs_is_still_released() -> None:
    fx = make_agent(mode="standard")
    reviewer_user = make_user(unique("rev"), groups=("reviewer",))
    session_id = str(uuid.uuid4())
    seen = _while_the_hook_waits(session_id, lambda agent: None, reviewer_user)

    body = pre_tool_use(session_id, "Bash", {"command": "rm -rf build"})
    action, reason = decision(send(fx, body, wait=20))
    seen["thread"].join()

    assert (action, reason) == ("allow", f"Approved by {reviewer_user.username} in Harness.")
    assert seen["status"] == 200 and "It will not run" not in seen["text"]
    assert ToolCall.objects.get(session__external_id=session_id).status == Status.RELEASED


def _org_asks(*entries: dict[str, Any]) -> None:
    for entry in entries:
        for group in [entry.get("group", ""), *entry.get("groups", {})]:
            if group:
                Group.objects.get_or_create(name=group)
    managed.set_layer(team=None, document={"ask": list(entries)}, actor="org-admin", reason="x")


@pytest.mark.parametrize("who", ["owner", "team admin"])
def test_a_lower_layers_larger_quorum_does_not_drop_the_organizations_group(who: str) -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    looser = {"rule": "write_file", "approvals": 2}
    if who == "owner":
        profiles.update_profile(
            user=fx.owner, mode="standard", allow=[], ask=[looser], deny=[], actor="owner"
        )
    else:
        managed.set_layer(team=fx.agent.team, document={"ask": [looser]}, actor="team-admin")
    approval = ask(fx, WRITE)
    _, first = reviewer()
    _, second = reviewer()

    # Both rules hold: 1 of sre and 2 in all (the second from anyone), never two from
    # anyone: the first outsider fills the place anyone may fill, the second is refused.
    assert vote(first, approval).status_code == 200
    refused = vote(second, approval)
    assert refused.status_code == 403
    assert "the rest must come from the groups named" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    assert (approval.approvals_required, approval.group) == (2, "")
    assert approval.groups == [{"group": "sre", "count": 1}]
    assert "1 of the group 'sre' and 1 more from any reviewer (2 approvals in all)" in (
        approval.reason
    )
    _, sre_one = reviewer("sre")
    assert vote(sre_one, approval).status_code == 200
    assert status_of(approval) == "queued"


def test_group_rules_of_two_layers_both_hold() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    Group.objects.get_or_create(name="security")
    team_rule = {"rule": "write_file", "approvals": 1, "group": "security"}
    managed.set_layer(team=fx.agent.team, document={"ask": [team_rule]}, actor="team-admin")
    approval = ask(fx, WRITE)
    assert approval.groups == [{"group": "sre", "count": 1}, {"group": "security", "count": 1}]
    _, sre_one = reviewer("sre")
    _, sre_two = reviewer("sre")
    assert vote(sre_one, approval).status_code == 200
    assert vote(sre_two, approval).status_code == 409  # sre's count is met; security's not
    assert status_of(approval) == "pending_approval"
    _, security = reviewer("security")
    assert vote(security, approval).status_code == 200
    assert status_of(approval) == "queued"


def test_an_edit_does_not_end_unsigned_a_call_whose_denial_must_be_signed() -> None:
    from tests.approvals.test_step_up import step_up_agent

    approval = ask(step_up_agent(["approve", "deny"]), WRITE)
    _, client = reviewer()
    edited = {**WRITE, "content": "something else"}
    refused = client.post(
        f"/approvals/{approval.pk}/edit",
        {"digest": approval.call.digest, "arguments": json.dumps(edited)},
        headers={"HX-Request": "true"},
    )
    assert refused.status_code == 400
    assert "Denying this call must be signed with your passkey" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    assert ToolCall.objects.filter(session=approval.call.session).count() == 1
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    assert "Edit the arguments instead" not in page
