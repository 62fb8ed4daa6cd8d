"""The simulator and the backtest: stages 2 to 5 run on calls that are never stored.

`simulate` decides a call as admission would; `backtest` decides a user's past calls under
the saved and a proposed profile and lists those whose decision would change. Neither
writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User

from dispatcher.models import Agent, AgentSession, Preview, ToolCall
from dispatcher.policy import effect_rules, layers, stages
from dispatcher.policy.context import CallContext, Decision, Profile
from dispatcher.policy.profiles import profile_for
from dispatcher.tools.registry import API_CLIENT, get_tool
from teams.models import Team
from teams.scope import EVERYTHING, Scope

BACKTEST_LIMIT = 500


@dataclass(frozen=True)
class Simulation:
    """What the pipeline would decide, and which stage, rule, mode or guard decided it."""

    action: str  # allow | ask | deny | cancel | reject
    stage: str  # receive | resolve | validate | pre_execute | guards
    by: str
    reason: str
    rule: str = ""
    mode: str = ""
    profile_version: int = 0
    guards: tuple[str, ...] = field(default=())
    layer: str = ""  # the layer of policy whose rule or ceiling decided, with its version
    log_only: tuple[str, ...] = field(default=())  # what log-only rules would have done

    @property
    def summary(self) -> str:
        return f"{self.action} by {self.by}"


def simulation_workspace() -> Path:
    """Where paths are read when no session is given: an empty directory (never created)."""
    return Path(settings.HARNESS_WORKSPACE_ROOT).resolve() / "_simulator"


def simulate(
    *,
    user: User,
    tool: str,
    arguments: Any,
    session: AgentSession | None = None,
    profile: Profile | None = None,
    layered: bool = False,
    team_id: int | None = None,
) -> Simulation:
    """Decide a call as admission would (stages 2 to 5), storing nothing.

    `profile` defaults to `user`'s saved profile; pass a proposed one to try rules before
    saving. The call is decided as one of an agent of a team: the session's agent's, else
    `team_id`, else that of the user's newest agent, else the default team (`team_of`).
    That team's layer and the organization's bind it as they bind admission (`layered`:
    `profile` already holds them), and the tool is resolved in that team's tool set
    (another team's MCP server is no tool of it). With `session`, its workspace, narrowed
    mode and active grants are used.
    """
    profile = profile or profile_for(user)
    team = session.team_id if session else team_id
    if team is None:
        team = team_of(user, session)
    if not layered:
        profile = layers.with_layers(profile, team)
    mode = layers.effective_mode(session.mode if session else profile.mode, profile)

    def answer(
        action: str,
        stage: str,
        by: str,
        reason: str,
        rule: str = "",
        guards: tuple[str, ...] = (),
        decision: Decision | None = None,
    ) -> Simulation:
        layer = ""
        if decision is not None and decision.layer:
            layer = decision.layer
            if decision.layer_version:
                layer += f" v{decision.layer_version}"
        notes = tuple(str(t["note"]) for t in decision.log_only) if decision else ()
        return Simulation(
            action, stage, by, reason, rule, mode, profile.version, guards, layer, notes
        )

    if not isinstance(arguments, dict):
        return answer(
            "reject",
            "receive",
            "stage:receive",
            f"The arguments of '{tool}' must be a JSON object.",
        )
    try:
        client = session.client if session else API_CLIENT
        definition = stages.resolve(tool, client, team)
        stages.validate(definition, arguments)
    except stages.Rejection as rejection:
        return answer("reject", rejection.stage, f"stage:{rejection.stage}", rejection.message)
    ctx = CallContext(
        call_id="simulation",
        session_id=str(session.pk) if session else "",
        tool=definition,
        name=tool,
        arguments=arguments,
        workspace=Path(session.workspace) if session else simulation_workspace(),
        mode=mode,
        username=user.get_username(),
        agent_name=session.agent.name if session else "",
        profile=profile,
        agent_workspace=session.agent.workspace if session else "",
    )
    decision = stages.pre_execute(ctx)
    if decision.action not in ("deny", "cancel"):
        denial = stages.guards(ctx)
        if denial:
            guard = denial.decision
            return answer("deny", "guards", guard.by, guard.reason, guards=denial.names)
    return answer(
        decision.action,
        "pre_execute",
        decision.by,
        decision.reason,
        decision.rule,
        decision=decision,
    )


def team_of(user: User, session: AgentSession | None) -> int | None:
    """The team whose layer binds a simulation: the session's (the team it was started
    under), else that of the user's newest agent, else the default team."""
    if session is not None:
        return session.team_id
    newest = Agent.objects.filter(owner=user).order_by("-created_at").values("team_id").first()
    return newest["team_id"] if newest else Team.objects.default().pk


def simulate_call(
    call: ToolCall, profile: Profile | None = None, *, layered: bool = False
) -> Simulation:
    """Decide a past call again, in its own session, under `profile` (default: saved).
    A mode's ask of a call with a recorded preview is read against the effect rules too
    (over the recorded effect: nothing runs again)."""
    session = call.session
    profile = profile or profile_for(session.agent.owner)
    result = simulate(
        user=session.agent.owner,
        tool=call.name,
        arguments=call.arguments,
        session=session,
        profile=profile,
        layered=layered,
    )
    return _by_recorded_effect(call, result, profile)


def _by_recorded_effect(call: ToolCall, result: Simulation, profile: Profile) -> Simulation:
    if result.action != "ask" or not result.by.startswith("mode:"):
        return result
    recorded = Preview.objects.filter(call=call).exclude(effect_digest="").first()
    if recorded is None:
        return result
    effect = {**recorded.effect, "appliable": recorded.appliable}
    # Every layer's allow list, the organization's first (dispatcher.policy.layers.stack).
    allow_lists = [*(layer.allow for layer in profile.layers), profile.allow]
    rule = next(
        (found for found in (effect_rules.matching(a, effect) for a in allow_lists) if found),
        None,
    )
    if rule is None:
        return result
    reason = f"Effect rule '{rule}' allows the recorded preview's effect."
    return Simulation(
        "allow", "pre_execute", f"rule:allow:{rule}", reason, rule, result.mode, profile.version
    )


@dataclass(frozen=True)
class Change:
    call: ToolCall
    before: Simulation
    after: Simulation


@dataclass(frozen=True)
class Backtest:
    checked: int
    changes: list[Change]


def backtest(
    *, user: User, proposed: Profile, limit: int = BACKTEST_LIMIT, reach: Scope = EVERYTHING
) -> Backtest:
    """The past calls of `user`'s agents that `reach` covers (newest `limit`: a team
    admin reads no call of another team's agent of the same person) whose decision (allow
    / ask / deny) would change from the saved profile to `proposed`. Both sides are
    decided now, in each call's own session, so only the rule change makes a difference.
    Writes nothing."""
    calls = (
        reach.filter(ToolCall.objects.all(), "session__team_id")
        .filter(session__agent__owner=user, arguments__isnull=False)
        .exclude(status="rejected")
        .select_related("session__agent__owner")
        .order_by("-created_at")[:limit]
    )
    saved = profile_for(user)
    # The layers of each agent's team, read once per team (not once per call).
    bound: dict[int | None, tuple[Profile, Profile]] = {}
    checked, changes = 0, []
    for call in calls:
        if get_tool(call.name, call.session.client) is None:
            continue
        checked += 1
        team_id = call.session.team_id
        if team_id not in bound:
            bound[team_id] = (
                layers.with_layers(saved, team_id),
                layers.with_layers(proposed, team_id),
            )
        old, new = bound[team_id]
        before = simulate_call(call, old, layered=True)
        after = simulate_call(call, new, layered=True)
        if before.action != after.action:
            changes.append(Change(call, before, after))
    return Backtest(checked, changes)
