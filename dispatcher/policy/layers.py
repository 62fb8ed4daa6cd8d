"""The four layers of policy, and how one call is decided through them.

From the top: the organization's layer (managed), the team's (of the call's agent), the
agent owner's profile, and the session's grants. Each holds allow / ask / deny rules and
may hold a mode ceiling (`max_mode`; the owner's ceiling is their profile's mode).

- Deny and ask rules of every layer apply: a deny anywhere denies, else an ask anywhere
  asks (and what every matching quorum rule of any layer needs holds together:
  `combined`). The decision names the highest layer whose rule matched.
- Only then may an allow rule of any layer allow; so an allow of a lower layer never lifts
  a deny or an ask of a higher one. A session grant (the lowest layer) allows only when
  no layer denies or asks (dispatcher.policy.waterfall.session_grants).
- The session's mode is the narrowest of its own, its owner's and every layer's
  `max_mode` (`effective_mode`): no allow or grant lifts a ceiling (the mode ceiling
  guard denies what read_only or locked cannot run, whoever allowed it).
- Log-only rules (`trial`) are evaluated and recorded on the decision, deciding nothing.

One rules.evaluate call reads the lists of all layers concatenated top first (deny, then
ask, then allow: the engine's own precedence), so a layered call costs what a single
profile did; `holder` finds the layer of the rule that decided.

The managed layers are stored in PolicyLayer rows (changed only by
`dispatcher.policy.managed`). Admission reads their `revision` with the session it already
reads (`revision_annotations`) and keeps parsed layers per revision in this process
(`managed_layers`): a layer is read again only after it changed.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import User
from django.db.models import OuterRef, Q, Subquery

from dispatcher.policy import rules
from dispatcher.policy.context import CallContext, Decision, Layer, Profile, Quorum, Trial
from dispatcher.policy.models import MODE_ORDER, LayerKind, Mode, PolicyLayer
from dispatcher.policy.profiles import active_lists, profile_for, quorum_of_entries, trial_of

# --- The stack --------------------------------------------------------------------------


def user_layer(profile: Profile, username: str) -> Layer:
    """The owner's profile as a layer (its mode is its ceiling)."""
    return Layer(
        kind="user",
        name=username,
        version=profile.version,
        allow=profile.allow,
        ask=profile.ask,
        deny=profile.deny,
        quorum=profile.quorum,
        trial=profile.trial,
    )


def stack(call: CallContext) -> tuple[Layer, ...]:
    """The call's rule layers, top first: organization, team, owner."""
    return (*call.profile.layers, user_layer(call.profile, call.username))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the layers' rules say about a call, and the layer of the rule that decided."""

    verdict: rules.RuleVerdict
    layer: Layer | None = None

    @property
    def action(self) -> str | None:
        return self.verdict.action


def _joined(layers: Iterable[Layer], name: str) -> tuple[str, ...]:
    return tuple(text for layer in layers for text in getattr(layer, name))


def evaluate(
    call: CallContext, layers: tuple[Layer, ...] | None = None, *, allow: bool = True
) -> Verdict:
    """Deny rules of every layer, then ask rules of every layer, then (unless `allow` is
    false) allow rules of every layer; the first match decides, top layer first."""
    layers = stack(call) if layers is None else layers
    verdict = rules.evaluate(
        call,
        allow=_joined(layers, "allow") if allow else (),
        ask=_joined(layers, "ask"),
        deny=_joined(layers, "deny"),
    )
    if verdict.action is None:
        return Verdict(verdict)
    return Verdict(verdict, holder(layers, verdict.action, verdict.rule))


def holder(layers: tuple[Layer, ...], action: str, rule: str) -> Layer:
    """The highest layer whose `action` list holds `rule` (the top layer if none does: a
    deny or ask is then named by the strictest place it could come from)."""
    for layer in layers:
        if rule in getattr(layer, action, ()):
            return layer
    return layers[0]


def quorum_of(call: CallContext) -> tuple[Quorum, Layer] | None:
    """What every quorum ask rule of any layer matching `call` needs, together, with the
    layer of the strictest one (named in the decision).

    Every quorum rule is tried, not only the first ask rule that matched: a compound
    command caught by a plain ask rule still needs the approvals of a quorum rule that
    another part of it matches. Each rule must still hold (`combined`): a lower layer's
    rule asking more approvals from anyone never drops a higher layer's group. Step-up
    adds up over every matching rule.
    """
    matching = [
        (q, layer)
        for layer in stack(call)
        for q in layer.quorum
        if rules.evaluate(call, allow=(), ask=(q.rule,), deny=()).action == "ask"
    ]
    if not matching:
        return None
    quorum, layer = max(
        matching,
        key=lambda m: (m[0].approvals, len(m[0].groups), bool(m[0].group), -matching.index(m)),
    )
    # Step-up adds up: a verdict any matching rule of any layer asks a passkey for needs one.
    signed = {verdict for q, _ in matching for verdict in q.step_up}
    step_up = tuple(v for v in ("approve", "deny") if v in signed)
    return combined(quorum, [q for q, _ in matching], step_up), layer


def combined(strictest: Quorum, matching: list[Quorum], step_up: tuple[str, ...]) -> Quorum:
    """One requirement that meets every rule of `matching` (highest layer first): each
    group named by any of them, with the most approvals any of them asks of it (distinct
    people: one vote counts towards one place), and at least the most approvals any of
    them asks in all. Where that total is more than the groups' counts, the rest are
    places any eligible reviewer may fill (`approvals` is then more than the groups' sum:
    approvals.models.ApprovalRequest.anyone): an organization's "1 of sre" beside an
    owner's "2 approvals" needs 1 of sre and 1 more from anyone, 2 in all. Never looser
    than any one rule: the total is at least each rule's, each group's count at least
    each rule's count of it."""
    named: dict[str, int] = {}
    for q in matching:
        pairs = q.groups or (((q.group, q.approvals),) if q.group else ())
        for group, count in pairs:
            named[group] = max(named.get(group, 0), count)
    total = max(q.approvals for q in matching)
    if not named:
        return dataclasses.replace(strictest, approvals=total, group="", groups=(), step_up=step_up)
    counts = tuple(named.items())
    total = max(total, sum(count for _, count in counts))
    if len(counts) == 1 and counts[0][1] == total:
        return dataclasses.replace(
            strictest, approvals=total, group=counts[0][0], groups=(), step_up=step_up
        )
    return dataclasses.replace(strictest, approvals=total, group="", groups=counts, step_up=step_up)


def blocks_grant(call: CallContext) -> Verdict:
    """A deny or ask rule of any layer that matches `call` (no grant lifts it), or an
    empty verdict."""
    return evaluate(call, allow=False)


def rule_reason(layer: Layer, action: str, rule: str) -> str:
    """`Rule 'run_command(terraform apply *)' in the organization's ask list (org policy v7).`"""
    return f"Rule '{rule}' in {layer.whose} {action} list ({layer.label})."


# --- Log-only rules ----------------------------------------------------------------------


def with_trial(layers: tuple[Layer, ...], index: int, trial: Trial) -> tuple[Layer, ...]:
    """The stack with one log-only rule made active, at the end of its layer's list."""
    layer = layers[index]
    lists = {name: getattr(layer, name) for name in ("allow", "ask", "deny")}
    lists[trial.action] = (*lists[trial.action], trial.rule)
    active = dataclasses.replace(layer, allow=lists["allow"], ask=lists["ask"], deny=lists["deny"])
    return (*layers[:index], active, *layers[index + 1 :])


def trials(call: CallContext, decision: Decision) -> tuple[dict[str, Any], ...]:
    """What each log-only rule of each layer would have done to `call`: one entry for each
    that would have decided it (`would`), beside what decided (`instead_of`). Costs nothing
    when no layer holds a log-only rule."""
    layers = stack(call)
    found: list[dict[str, Any]] = []
    for index, layer in enumerate(layers):
        for trial in layer.trial:
            tried = evaluate(call, with_trial(layers, index, trial))
            if tried.action != trial.action or tried.verdict.rule != trial.rule:
                continue
            if tried.layer is None or tried.layer.key != layer.key:
                continue
            verb = {"allow": "allowed", "ask": "asked", "deny": "denied"}[trial.action]
            found.append(
                {
                    "layer": layer.key,
                    "layer_version": layer.version,
                    "list": trial.action,
                    "rule": trial.rule,
                    "would": trial.action,
                    "instead_of": decision.action,
                    "note": f"Log-only rule '{trial.rule}' in {layer.whose} {trial.action} "
                    f"list ({layer.label}) would have {verb}.",
                }
            )
    return tuple(found)


def has_trials(call: CallContext) -> bool:
    return bool(call.profile.trial) or any(layer.trial for layer in call.profile.layers)


# --- Mode ceilings -----------------------------------------------------------------------


def _rank(mode: str) -> int:
    return _RANKS.get(mode, -1)


# Each mode's place in MODE_ORDER (a mode that is none: -1), read once.
_RANKS: dict[str, int] = {value: MODE_ORDER.index(Mode(value)) for value in Mode.values}


def effective_mode(mode: str, profile: Profile) -> str:
    """`mode` (the session's) narrowed by the owner's mode and every layer's ceiling."""
    modes = [mode, profile.mode, *(layer.max_mode for layer in profile.layers if layer.max_mode)]
    return min(modes, key=_rank)


def ceiling_of(call: CallContext) -> Layer | None:
    """The highest layer whose ceiling holds the call's mode below its owner's, if any."""
    for layer in call.profile.layers:
        if layer.max_mode == call.mode and _rank(layer.max_mode) < _rank(call.profile.mode):
            return layer
    return None


def ceiling_note(call: CallContext) -> str:
    layer = ceiling_of(call)
    if layer is None:
        return ""
    return f" The mode is capped at {layer.max_mode} by {layer.whose} max_mode ({layer.label})."


def versions(profile: Profile) -> dict[str, int]:
    """The version of each managed layer a decision used, for its provenance."""
    return {layer.key: layer.version for layer in profile.layers}


# --- Loading, by revision ----------------------------------------------------------------

ORG_REVISION = "org_policy_revision"
TEAM_REVISION = "team_policy_revision"


def revision_annotations(team_id: Any) -> dict[str, Subquery]:
    """Annotations that read both managed layers' revisions with a row already read:
    `team_id` is an OuterRef to the agent's team (or the team's id)."""
    return {
        ORG_REVISION: Subquery(
            PolicyLayer.objects.filter(kind=LayerKind.ORG).order_by().values("revision")[:1]
        ),
        TEAM_REVISION: Subquery(
            PolicyLayer.objects.filter(team_id=team_id).order_by().values("revision")[:1]
        ),
    }


def session_revisions(team_path: str) -> dict[str, Subquery]:
    """revision_annotations for a query whose rows reach the team by `team_path`."""
    return revision_annotations(OuterRef(team_path))


def revisions_of(row: Any) -> tuple[Any, Any] | None:
    """The revisions read with `row`, or None when it was read without them."""
    if not hasattr(row, ORG_REVISION) or not hasattr(row, TEAM_REVISION):
        return None
    return getattr(row, ORG_REVISION), getattr(row, TEAM_REVISION)


_MISS = object()
_lock = threading.Lock()
# "org" or "team:<id>" -> (revision, parsed layer or None when it holds nothing).
_cache: dict[str, tuple[str, Layer | None]] = {}


def layer_of_row(row: PolicyLayer) -> Layer | None:
    """A stored layer as policy reads it; None when it holds no rule and no ceiling."""
    document = {"allow": row.allow, "ask": row.ask, "deny": row.deny}
    lists = active_lists(document)
    layer = Layer(
        kind=row.kind,
        name=row.team.name if row.team_id and row.team else "",
        version=row.version,
        max_mode=row.max_mode,
        quorum=quorum_of_entries(row.ask),
        trial=trial_of(document),
        **lists,
    )
    if not (layer.max_mode or layer.allow or layer.ask or layer.deny or layer.trial):
        return None
    return layer


def _norm(revision: Any) -> str:
    """A revision as read from either backend (a UUID, or SQLite's hex text)."""
    try:
        return uuid.UUID(str(revision)).hex
    except ValueError:
        return str(revision)


def _cached(key: str, revision: Any) -> Any:
    if revision is None:
        return None  # no such layer
    entry = _cache.get(key)
    if entry is not None and entry[0] == _norm(revision):
        return entry[1]
    return _MISS


def managed_layers(team_id: int | None, revisions: tuple[Any, Any] | None) -> tuple[Layer, ...]:
    """The organization's and the team's layers (those that hold anything), top first.

    With the `revisions` read alongside the session, layers parsed before are used as they
    are; otherwise (or for a layer that changed) both are read in one statement."""
    team_key = f"team:{team_id}"
    if revisions is not None:
        org, team = _cached("org", revisions[0]), _cached(team_key, revisions[1])
        if org is not _MISS and team is not _MISS:
            return tuple(layer for layer in (org, team) if layer is not None)
    found: dict[str, Layer | None] = {"org": None, team_key: None}
    rows = PolicyLayer.objects.filter(Q(kind=LayerKind.ORG) | Q(team_id=team_id))
    with _lock:
        for row in rows.select_related("team"):
            key = "org" if row.kind == LayerKind.ORG else f"team:{row.team_id}"
            found[key] = layer_of_row(row)
            _cache[key] = (_norm(row.revision), found[key])
    return tuple(layer for layer in (found["org"], found[team_key]) if layer is not None)


def with_layers(profile: Profile, team_id: int | None, revisions: Any = None) -> Profile:
    return dataclasses.replace(profile, layers=managed_layers(team_id, revisions))


def policy_for(owner: User, team_id: int | None) -> Profile:
    """The owner's profile with the managed layers of `team_id`, in one read (two when a
    layer changed since this process last parsed it)."""
    row = (
        User.objects.filter(pk=owner.pk)
        .select_related("permission_profile")
        .annotate(**revision_annotations(team_id))
        .first()
    )
    if row is None:
        return with_layers(profile_for(owner), team_id)
    return with_layers(profile_for(row, preloaded=True), team_id, revisions_of(row))
