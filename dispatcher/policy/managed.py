"""Changing the managed layers of policy: the organization's and each team's (PolicyLayer),
their versions, two-person changes to the organization's, and making a log-only rule of
any layer active.

A layer's document is the rules file `manage.py set_rules --org` / `--team` reads and
`get_rules` prints: `{"max_mode", "allow", "ask", "deny"}`, entries as in a user's file
(rule texts, quorum objects, `{"rule": ..., "log_only": true}`). Every change is one
transaction with its version row and its audit event. With HARNESS_POLICY_TWO_PERSON a
change to the organization's layer is stored as a proposal (LayerProposal) and applied
only when another org admin accepts it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit import kinds
from audit.services import record_event
from dispatcher.policy import profiles
from dispatcher.policy.models import (
    LayerKind,
    LayerProposal,
    LayerVersion,
    Mode,
    PolicyLayer,
    ProposalStatus,
)
from dispatcher.policy.profiles import LISTS, InvalidProfile, StaleProfile
from floor.errors import ServiceError
from teams.models import Team
from teams.scope import org_holds, scope_of

KEYS = ("max_mode", *LISTS)


class NotAllowed(ServiceError):
    """The person may not make this change (not an org admin, or their own proposal)."""


@dataclass(frozen=True)
class Outcome:
    """What a change did: saved as a new version (`layer`), or waits as `proposal`."""

    layer: PolicyLayer | None = None
    proposal: LayerProposal | None = None
    changed: bool = True


def layer_name(team: Team | None) -> str:
    return "the organization's policy" if team is None else f"team {team.name}'s policy"


def _row(team: Team | None) -> PolicyLayer | None:
    if team is None:
        return PolicyLayer.objects.filter(kind=LayerKind.ORG).first()
    return PolicyLayer.objects.filter(team=team).first()


def _document_of(row: PolicyLayer | None) -> dict[str, Any]:
    if row is None:
        return {"max_mode": None, "allow": [], "ask": [], "deny": []}
    return {"max_mode": row.max_mode or None, **{n: list(getattr(row, n)) for n in LISTS}}


def layer_document(team: Team | None) -> dict[str, Any]:
    """The layer as its rules file holds it (what set_rules --org / --team reads)."""
    return _document_of(_row(team))


def layer_version(team: Team | None) -> int:
    row = _row(team)
    return row.version if row is not None else 0


def clean_document(document: Any, current: Mapping[str, Any]) -> dict[str, Any]:
    """A layer's rules file, checked and cleaned. A file without `max_mode` keeps the
    current ceiling; `null` or "" removes it. Raises InvalidProfile naming every problem."""
    if not isinstance(document, dict):
        raise InvalidProfile(
            ['The rules file must be a JSON object: {"max_mode", "allow", "ask", "deny"}.']
        )
    problems = []
    unknown = sorted(set(document) - set(KEYS))
    if unknown:
        hint = " (a layer has no mode of its own: use max_mode)" if "mode" in unknown else ""
        problems.append(f"Unknown key(s) {', '.join(unknown)}: use {', '.join(KEYS)}{hint}.")
    max_mode = document.get("max_mode", current.get("max_mode")) or ""
    if max_mode not in ("", *Mode.values):
        problems.append(
            f"'max_mode' must be one of: {', '.join(Mode.values)} (or null for no ceiling)."
        )
    lists: dict[str, list[Any]] = {}
    for name in LISTS:
        value = document.get(name, [])
        if not isinstance(value, list):
            problems.append(f"'{name}' must be a list of rules, not {type(value).__name__}.")
            value = []
        lists[name] = profiles.clean_rules(value)
    if not problems:
        problems += profiles.list_problems(lists)
    if problems:
        raise InvalidProfile(problems)
    return {"max_mode": max_mode or None, **lists}


def layer_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """As profiles.profile_diff, with `max_mode` in place of `mode`."""
    diff = profiles.profile_diff({**old, "mode": ""}, {**new, "mode": ""})
    if (old.get("max_mode") or None) != (new.get("max_mode") or None):
        diff["max_mode"] = [old.get("max_mode"), new.get("max_mode")]
    return diff


def _check_may_change(actor: User | str, team: Team | None) -> None:
    """A person changes the organization's layer as an org admin, a team's as an admin of
    that team (or an org admin); a command ("cli") is the operator's."""
    if isinstance(actor, str):
        return
    if team is None and not org_holds(actor, "admin"):
        raise NotAllowed("Only an org admin changes the organization's policy.")
    if team is not None and not scope_of(actor, "admin").covers(team.pk):
        raise NotAllowed(f"Only an admin of team {team.name} changes its policy.")


def _actor_name(actor: User | str) -> str:
    return actor if isinstance(actor, str) else f"user:{actor.get_username()}"


def set_layer(
    *,
    team: Team | None,
    document: Any,
    actor: User | str,
    reason: str = "",
    expected_version: int | None = None,
) -> Outcome:
    """Replace the organization's layer (`team` None) or a team's with `document`.

    The organization's layer needs a `reason`, and with HARNESS_POLICY_TWO_PERSON the
    change is stored as a proposal (Outcome.proposal) that another org admin accepts
    (`accept_proposal`); the proposer must then be a person who is an org admin. Raises
    InvalidProfile (nothing saved) naming each problem, StaleProfile when
    `expected_version` is not the layer's version, NotAllowed. An unchanged document
    changes nothing (Outcome.changed False).
    """
    reason = reason.strip()
    _check_may_change(actor, team)
    if team is None and not reason:
        raise InvalidProfile(["A change to the organization's policy needs a reason (--reason)."])
    current = layer_document(team)
    cleaned = clean_document(document, current)
    if not layer_diff(current, cleaned):
        return Outcome(layer=_row(team), changed=False)
    if team is None and settings.HARNESS_POLICY_TWO_PERSON:
        return Outcome(proposal=propose(document=cleaned, actor=actor, reason=reason))
    return Outcome(
        layer=_apply(
            team=team,
            document=cleaned,
            actor=actor,
            reason=reason,
            expected_version=expected_version,
        )
    )


@transaction.atomic
def _apply(
    *,
    team: Team | None,
    document: Mapping[str, Any],
    actor: User | str,
    reason: str,
    expected_version: int | None = None,
    accepted_by: User | None = None,
) -> PolicyLayer:
    if team is None:
        row, _ = PolicyLayer.objects.select_for_update().get_or_create(kind=LayerKind.ORG)
    else:
        row, _ = PolicyLayer.objects.select_for_update().get_or_create(
            kind=LayerKind.TEAM, team=team
        )
    if expected_version is not None and row.version != expected_version:
        raise StaleProfile(
            f"{layer_name(team).capitalize()} was changed (now v{row.version}, the change was "
            f"made on v{expected_version}). Look at the new version and make it again."
        )
    old = _document_of(row)
    diff = layer_diff(old, document)
    row.max_mode = document.get("max_mode") or ""
    row.allow, row.ask, row.deny = (list(document[n]) for n in LISTS)
    row.version += 1
    row.revision = uuid.uuid4()
    row.save()
    LayerVersion.objects.create(
        layer=row,
        version=row.version,
        document=dict(document),
        changed_by=None if isinstance(actor, str) else actor,
        actor=_actor_name(actor),
        accepted_by=accepted_by,
        reason=reason,
        diff=diff,
    )
    if team is None:  # what was proposed on an older version can no longer apply
        LayerProposal.objects.filter(
            status=ProposalStatus.PENDING, base_version__lt=row.version
        ).update(status=ProposalStatus.SUPERSEDED, decided_at=timezone.now())
    record_event(
        kind=kinds.POLICY_CHANGED,
        actor=_actor_name(actor),
        subject="policy:org" if team is None else f"policy:team:{team.name}",
        payload={
            "layer": "org" if team is None else f"team:{team.name}",
            "version": row.version,
            "from_version": row.version - 1,
            "reason": reason,
            **({"accepted_by": accepted_by.get_username()} if accepted_by else {}),
            **dict(document),
            "diff": diff,
        },
    )
    return row


@transaction.atomic
def propose(*, document: Mapping[str, Any], actor: User | str, reason: str) -> LayerProposal:
    """Store a change to the organization's layer for a second org admin to accept."""
    if isinstance(actor, str) or not org_holds(actor, "admin"):
        raise NotAllowed(
            "With HARNESS_POLICY_TWO_PERSON a change to the organization's policy is proposed "
            "by an org admin (manage.py set_rules --org FILE --reason R --by USERNAME)."
        )
    current = layer_document(None)
    proposal = LayerProposal.objects.create(
        layer_kind=LayerKind.ORG,
        document=dict(document),
        base_version=layer_version(None),
        reason=reason,
        diff=layer_diff(current, document),
        proposed_by=actor,
    )
    record_event(
        kind=kinds.POLICY_PROPOSED,
        actor=_actor_name(actor),
        subject=f"policy_proposal:{proposal.pk}",
        payload={
            "proposal": proposal.pk,
            "layer": "org",
            "base_version": proposal.base_version,
            "reason": reason,
            "diff": proposal.diff,
        },
    )
    return proposal


@transaction.atomic
def accept_proposal(*, proposal_id: int, user: User) -> PolicyLayer:
    """Apply a pending proposal as the organization's next version, accepted by `user`.

    Raises NotAllowed when `user` is not an org admin or proposed it themselves,
    ServiceError when it is not pending, StaleProfile when the organization's policy
    changed since it was proposed (the change that did marked it superseded)."""
    proposal = LayerProposal.objects.select_for_update().filter(pk=proposal_id).first()
    if proposal is not None and proposal.status == ProposalStatus.SUPERSEDED:
        raise StaleProfile(
            f"The organization's policy changed since proposal {proposal.pk} was made "
            f"(on v{proposal.base_version}); propose the change again."
        )
    if proposal is None or proposal.status != ProposalStatus.PENDING:
        raise ServiceError(f"There is no pending policy proposal {proposal_id}.")
    if not org_holds(user, "admin"):
        raise NotAllowed("Only an org admin can accept a change to the organization's policy.")
    if proposal.proposed_by_id == user.pk:
        raise NotAllowed(
            "You proposed this change: another org admin must accept it (two-person rule)."
        )
    if proposal.base_version != layer_version(None):
        raise StaleProfile(
            f"The organization's policy changed since proposal {proposal.pk} was made "
            f"(on v{proposal.base_version}); propose the change again."
        )
    proposer = proposal.proposed_by
    row = _apply(
        team=None,
        document=proposal.document,
        actor=proposer if proposer is not None else "unknown",
        reason=proposal.reason,
        expected_version=proposal.base_version,
        accepted_by=user,
    )
    LayerProposal.objects.filter(pk=proposal.pk).update(
        status=ProposalStatus.ACCEPTED, decided_by=user, decided_at=timezone.now()
    )
    record_event(
        kind=kinds.POLICY_PROPOSAL_ACCEPTED,
        actor=_actor_name(user),
        subject=f"policy_proposal:{proposal.pk}",
        payload={"proposal": proposal.pk, "layer": "org", "version": row.version},
    )
    return row


# --- Log-only rules made active ---------------------------------------------------------


def _activated(lists: Mapping[str, Any], action: str, rule: str) -> dict[str, list[Any]]:
    """The lists with the log-only entry `rule` of `action` made active (its log_only
    dropped); InvalidProfile when there is no such entry."""
    if action not in LISTS:
        raise InvalidProfile([f"Unknown list '{action}': use allow, ask or deny."])
    out = {name: list(lists.get(name, [])) for name in LISTS}
    for index, entry in enumerate(out[action]):
        if profiles.is_log_only(entry) and profiles.entry_rule(entry) == rule:
            active = {k: v for k, v in entry.items() if k != "log_only"}
            out[action][index] = profiles.clean_rules([active])[0]
            return out
    raise InvalidProfile([f"There is no log-only rule '{rule}' in that {action} list any more."])


def activate_rule(*, layer: str, action: str, rule: str, actor: User, reason: str = "") -> Outcome:
    """Make the log-only rule `rule` of `action` in `layer` (`org`, `team:<name>`,
    `user:<name>`) active: a new version of that layer, audited as any change (for the
    organization's, a proposal under HARNESS_POLICY_TWO_PERSON)."""
    kind, _, name = layer.partition(":")
    if kind == "user":
        subject = User.objects.filter(username=name).first()
        if subject is None:
            raise InvalidProfile([f"No user named '{name}'."])
        saved = profiles.rules_document(subject)
        lists = _activated(saved, action, rule)
        profiles.update_profile(
            user=subject,
            mode=saved["mode"],
            actor=actor,
            allow=lists["allow"],
            ask=lists["ask"],
            deny=lists["deny"],
        )
        return Outcome()
    team = None
    if kind == "team":
        team = Team.objects.filter(name=name).first()
        # Another team's layer is not found, as a team that does not exist: what it holds
        # (its log-only rules, looked up below) is that team's.
        if team is None or not scope_of(actor, "admin").covers(team.pk):
            raise InvalidProfile([f"No team named '{name}'."])
    elif kind != "org":
        raise InvalidProfile([f"Unknown layer '{layer}'."])
    # Who may change the layer is checked before anything of it is read.
    _check_may_change(actor, team)
    current = layer_document(team)
    document = {"max_mode": current["max_mode"], **_activated(current, action, rule)}
    return set_layer(
        team=team,
        document=document,
        actor=actor,
        reason=reason or f"Made the log-only {action} rule '{rule}' active.",
        expected_version=layer_version(team),
    )


def pending_proposals() -> list[LayerProposal]:
    return list(
        LayerProposal.objects.filter(status=ProposalStatus.PENDING).select_related("proposed_by")
    )
