"""The four layers of policy (dispatcher.policy.layers): a table of every combination of
an organization, team and owner rule (deny / ask / allow / none) and a session grant, and
of mode ceilings, with the decision and the layer it records; then the same through the
agent API, with the layers stored and read as admission reads them."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from dispatcher import agents
from dispatcher.policy import layers, managed, profiles, stages
from dispatcher.policy.context import CallContext, Decision, Layer, Profile
from dispatcher.policy.models import SessionGrant
from dispatcher.tools.registry import get_tool
from teams import services as team_services
from tests.policy.conftest import start_session, submit
from tests.support.factories import make_agent

RULE = "write_file(src/**)"
GRANT = "write_file(src/app.py)"
ARGS = {"path": "src/app.py", "content": "x"}
CHOICES = ("deny", "ask", "allow", None)


def _lists(choice: str | None) -> dict[str, tuple[str, ...]]:
    return {name: (RULE,) if name == choice else () for name in ("allow", "ask", "deny")}


def _context(
    session_id: str,
    org: str | None,
    team: str | None,
    user: str | None,
    *,
    org_max: str = "",
    team_max: str = "",
    user_mode: str = "standard",
    session_mode: str = "trusted",
    has_grant: bool = False,
) -> CallContext:
    profile = Profile(
        mode=user_mode,
        version=4,
        layers=(
            Layer("org", "", 7, max_mode=org_max, **_lists(org)),
            Layer("team", "payments", 3, max_mode=team_max, **_lists(team)),
        ),
        **_lists(user),
    )
    tool = get_tool("write_file")
    assert tool is not None
    return CallContext(
        call_id="t",
        session_id=session_id,
        tool=tool,
        name="write_file",
        arguments=ARGS,
        workspace=Path("/nonexistent-ws"),
        mode=layers.effective_mode(session_mode, profile),
        username="alice",
        agent_name="a",
        profile=profile,
        may_have_grants=has_grant,
    )


def _decide(ctx: CallContext) -> Decision:
    """Stages 4 and 5 as admission runs them."""
    decision = stages.pre_execute(ctx)
    if decision.action in ("deny", "cancel"):
        return decision
    denial = stages.guards(ctx)
    return denial.decision if denial else decision


def _expected(
    org: str | None, team: str | None, user: str | None, grant: bool
) -> tuple[str, str, str]:
    """(action, by, layer) the layers promise."""
    named = (("org", org), ("team:payments", team), ("user:alice", user))
    for action in ("deny", "ask"):
        for key, choice in named:
            if choice == action:
                return action, f"rule:{action}:{RULE}", key
    if grant:
        return "allow", f"grant:{GRANT}", "grant"
    for key, choice in named:
        if choice == "allow":
            return "allow", f"rule:allow:{RULE}", key
    return "ask", "mode:standard", ""


@pytest.fixture
def granted_session(db: None) -> str:
    """A session holding the grant `write_file(src/app.py)`."""
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent)
    SessionGrant.objects.create(session=session, rule=GRANT, tool="write_file")
    return str(session.pk)


@pytest.mark.parametrize("grant", [True, False], ids=["grant", "no-grant"])
def test_every_combination_of_layers_decides_and_names_its_layer(
    granted_session: str, grant: bool
) -> None:
    wrong = []
    for org, team, user in itertools.product(CHOICES, repeat=3):
        ctx = _context(granted_session, org, team, user, user_mode="standard", has_grant=grant)
        decision = _decide(ctx)
        got = (decision.action, decision.by, decision.layer)
        want = _expected(org, team, user, grant)
        if got != want:
            wrong.append(f"org={org} team={team} user={user} grant={grant}: {got} != {want}")
        if decision.by.startswith("rule:"):
            layer = {each.key: each for each in layers.stack(ctx)}[decision.layer]
            assert decision.reason.startswith(
                f"Rule '{RULE}' in {layer.whose} {decision.action} list ({layer.label})."
            ), decision.reason
            assert decision.layer_version == layer.version
    assert not wrong, "\n".join(wrong)


def test_a_decision_names_the_layer_and_its_version_in_words(granted_session: str) -> None:
    decision = _decide(_context(granted_session, "ask", "allow", "allow"))
    assert decision.reason == f"Rule '{RULE}' in the organization's ask list (org policy v7)."
    assert decision.as_provenance()["layer"] == "org"
    assert decision.as_provenance()["layer_version"] == 7
    decision = _decide(_context(granted_session, None, "deny", "allow"))
    assert (
        decision.reason == f"Rule '{RULE}' in team payments's deny list (team payments policy v3)."
    )


# (org max_mode, team max_mode, owner's mode, owner's rule, grant) -> (action, by, layer)
CEILINGS = [
    ("", "", "trusted", None, False, ("allow", "mode:trusted", "")),
    ("standard", "", "trusted", None, False, ("ask", "mode:standard", "org")),
    ("", "standard", "trusted", None, False, ("ask", "mode:standard", "team:payments")),
    ("standard", "read_only", "trusted", None, False, ("deny", "mode:read_only", "team:payments")),
    ("read_only", "", "trusted", "allow", False, ("deny", "guard:mode_ceiling", "")),
    ("read_only", "", "standard", None, True, ("deny", "mode:read_only", "org")),
    ("locked", "standard", "trusted", "allow", True, ("deny", "guard:mode_ceiling", "")),
    ("standard", "", "trusted", "allow", False, ("allow", f"rule:allow:{RULE}", "user:alice")),
    ("standard", "", "trusted", None, True, ("allow", f"grant:{GRANT}", "grant")),
    ("trusted", "", "standard", None, False, ("ask", "mode:standard", "")),
]


@pytest.mark.parametrize(("org_max", "team_max", "mode", "user", "grant", "want"), CEILINGS)
def test_no_allow_or_grant_lifts_a_ceiling(
    granted_session: str,
    org_max: str,
    team_max: str,
    mode: str,
    user: str | None,
    grant: bool,
    want: tuple[str, str, str],
) -> None:
    ctx = _context(
        granted_session,
        None,
        None,
        user,
        org_max=org_max,
        team_max=team_max,
        user_mode=mode,
        has_grant=grant,
    )
    decision = _decide(ctx)
    assert (decision.action, decision.by, decision.layer) == want, decision.reason
    if want[2] in ("org", "team:payments") and want[1].startswith("mode:"):
        assert "max_mode" in decision.reason, decision.reason
    if want[1] == "guard:mode_ceiling":
        assert "by the organization's max_mode" in decision.reason, decision.reason


def test_a_log_only_rule_records_what_it_would_have_done_and_decides_nothing(
    granted_session: str,
) -> None:
    ctx = _context(granted_session, None, None, "allow")
    org = ctx.profile.layers[0]
    trial = profiles.trial_of({"ask": [{"rule": RULE, "log_only": True}]})
    profile = Profile(
        mode="standard",
        version=4,
        allow=(RULE,),
        layers=(Layer("org", "", 8, trial=trial), *ctx.profile.layers[1:]),
    )
    import dataclasses

    decision = _decide(dataclasses.replace(ctx, profile=profile))
    assert (decision.action, decision.by) == ("allow", f"rule:allow:{RULE}")
    [entry] = decision.as_provenance()["log_only"]
    assert entry["would"] == "ask" and entry["instead_of"] == "allow"
    assert entry["layer"] == "org" and entry["layer_version"] == 8
    assert entry["note"] == (
        f"Log-only rule '{RULE}' in the organization's ask list (org policy v8) would have asked."
    )
    assert org.version == 7


# --- Stored layers, through the agent API ------------------------------------------------


def test_the_organizations_ask_binds_an_owner_who_allows(db: None) -> None:
    fx = make_agent(mode="trusted")
    profiles.update_profile(
        user=fx.owner, mode="trusted", allow=[RULE], ask=[], deny=[], actor="test"
    )
    managed.set_layer(
        team=None,
        document={"ask": ["write_file(src/**)"]},
        actor="cli",
        reason="every source change is reviewed",
    )
    session_id = start_session(fx)
    call = submit(fx, session_id, "c1", "write_file", ARGS)
    assert call.status == "pending_approval"
    assert (
        call.reason == "Rule 'write_file(src/**)' in the organization's ask list (org policy v1)."
    )
    assert call.provenance["layer"] == "org" and call.provenance["layer_version"] == 1
    assert call.provenance["layers"] == {"org": 1}


def test_an_org_ceiling_makes_trusted_unavailable_and_a_team_rule_denies(db: None) -> None:
    fx = make_agent(mode="trusted")
    managed.set_layer(
        team=None, document={"max_mode": "standard"}, actor="cli", reason="no trusted mode"
    )
    team = team_services.create_team(name="payments", actor="test")
    agents.transfer_agent(agent=fx.agent, team=team, actor="test")
    managed.set_layer(team=team, document={"deny": ["write_file(**/.env)"]}, actor="cli")
    session_id = start_session(fx)
    asked = submit(fx, session_id, "c1", "write_file", ARGS)
    assert (asked.status, asked.decided_by) == ("pending_approval", "mode:standard")
    assert "capped at standard by the organization's max_mode (org policy v1)" in asked.reason
    denied = submit(fx, session_id, "c2", "write_file", {"path": "a/.env", "content": ""})
    assert denied.status == "denied"
    assert denied.reason == (
        "Rule 'write_file(**/.env)' in team payments's deny list (team payments policy v1)."
    )
    assert denied.provenance["layers"] == {"org": 1, "team:payments": 1}
    # The ceiling lifted: a new session runs in its owner's mode again (one started under
    # the ceiling keeps the mode it started with, as under a narrowed owner's mode).
    managed.set_layer(team=None, document={"max_mode": None}, actor="cli", reason="lifted")
    later = start_session(fx)
    allowed = submit(fx, later, "c3", "write_file", {"path": "b.txt", "content": ""})
    assert (allowed.status, allowed.decided_by) == ("queued", "mode:trusted")


def test_no_session_grant_is_made_for_a_call_an_ask_rule_of_any_layer_matches(
    granted_session: str,
) -> None:
    from dispatcher.policy import grants
    from floor.errors import ServiceError

    assert grants.narrow_rule(_context(granted_session, None, None, None)) == GRANT
    with pytest.raises(ServiceError, match=r"in team payments's ask list \(team payments policy"):
        grants.narrow_rule(_context(granted_session, None, "ask", "allow"))
    with pytest.raises(ServiceError, match="in alice's ask list"):
        grants.narrow_rule(_context(granted_session, None, None, "ask"))
