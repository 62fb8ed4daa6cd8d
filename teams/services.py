"""Every change to a team or its members, each with its audit event.

A membership given by the identity provider's group map says so (`source="sso"`): the map
removes only what it gave, and a role given by hand is never taken by a sign-in.
Removing a member's last role closes their sockets after commit (as `audit.roles` does
for organization roles), so a socket never outlives the role it was opened with, and
runs the steps of settings.HARNESS_TEAM_LEFT_STEPS when it was their last role in that
team (the agents a person signed in for that team stop: agentauth.services).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.module_loading import import_string

from audit import kinds
from audit.roles import close_sockets, user_group
from audit.services import record_event

from .models import TEAM_NAME, Membership, Source, Team, TeamRole


class TeamError(ValueError):
    """A team change that cannot be made, with the reason a person can act on."""


def _role(role: str) -> str:
    if role not in TeamRole.values:
        raise TeamError(f"Unknown team role '{role}'. Roles: {', '.join(TeamRole.values)}.")
    return role


@transaction.atomic
def create_team(*, name: str, actor: str) -> Team:
    try:
        TEAM_NAME(name)
    except ValidationError as error:
        raise TeamError(" ".join(error.messages)) from None
    if Team.objects.filter(name__iexact=name).exists():
        raise TeamError(f"A team named '{name}' exists already.")
    team = Team.objects.create(name=name)
    record_event(
        kind=kinds.TEAM_CREATED, actor=actor, subject=f"team:{team.pk}", payload={"team": name}
    )
    return team


def team_named(name: str) -> Team:
    team = Team.objects.filter(name=name).first()
    if team is None:
        known = ", ".join(Team.objects.values_list("name", flat=True)) or "none"
        raise TeamError(f"No team named '{name}'. Teams: {known}.")
    return team


@transaction.atomic
def add_member(
    *, team: Team, user: User, role: str, actor: str, source: str = Source.MANUAL
) -> bool:
    """Give `user` the role in `team`; False (and no event) if they hold it already.
    Their sockets close after commit: a page reopens its socket with the wider reach (a
    queue socket joins the groups of the teams it reaches when it opens)."""
    _role(role)
    _, created = Membership.objects.get_or_create(
        team=team, user=user, role=role, defaults={"source": source}
    )
    if not created:
        return False
    record_event(
        kind=kinds.TEAM_MEMBER_ADDED,
        actor=actor,
        subject=f"team:{team.pk}",
        payload={"team": team.name, "user": user.get_username(), "role": role, "source": source},
    )
    transaction.on_commit(functools.partial(close_sockets, user_group(user.pk)))
    return True


@transaction.atomic
def remove_member(
    *, team: Team, user: User, role: str, actor: str, source: str | None = None
) -> bool:
    """Take the role in `team` from `user`; False (and no event) if they did not hold it
    (or, with `source`, did not hold it from that source). When it was their last role in
    `team`, each step of settings.HARNESS_TEAM_LEFT_STEPS runs in this transaction (what it
    returns joins the audit event). Their sockets close after commit: a page still within
    another role reopens its socket and is checked again."""
    _role(role)
    rows = Membership.objects.filter(team=team, user=user, role=role)
    if source is not None:
        rows = rows.filter(source=source)
    if not rows.delete()[0]:
        return False
    payload: dict[str, Any] = {"team": team.name, "user": user.get_username(), "role": role}
    if not Membership.objects.filter(team=team, user=user).exists():
        for step in team_left_steps():
            payload |= step(team=team, user=user, actor=actor)
    record_event(
        kind=kinds.TEAM_MEMBER_REMOVED, actor=actor, subject=f"team:{team.pk}", payload=payload
    )
    transaction.on_commit(functools.partial(close_sockets, user_group(user.pk)))
    return True


def team_left_steps() -> list[Callable[..., dict[str, Any]]]:
    """settings.HARNESS_TEAM_LEFT_STEPS, imported (named there, not imported here: the steps
    live in apps above teams; checked at start-up, audit.E011)."""
    return [_import_step(path) for path in settings.HARNESS_TEAM_LEFT_STEPS]


@functools.cache
def _import_step(path: str) -> Callable[..., dict[str, Any]]:
    step: Callable[..., dict[str, Any]] = import_string(path)
    return step


MAX_ESCALATION_AFTER = 7 * 24 * 3600  # a week: longer is a typo, not a delay


@transaction.atomic
def set_escalation(*, team: Team, after: int | None, to: Team | None, actor: str) -> bool:
    """Escalate `team`'s asks that no one decided within `after` seconds to `to` (another
    team; None: the organization's reviewers); `after` None turns escalation off. False
    (and no event) when nothing changes."""
    if after is not None and not 1 <= after <= MAX_ESCALATION_AFTER:
        raise TeamError(
            f"The escalation delay is a number of seconds from 1 to {MAX_ESCALATION_AFTER}."
        )
    if to is not None and to.pk == team.pk:
        raise TeamError("A team cannot escalate to itself: name another team, or none.")
    to = to if after is not None else None
    if (team.escalation_after, team.escalate_to_id) == (after, to.pk if to else None):
        return False
    before = {
        "after": team.escalation_after,
        "to": team.escalate_to.name if team.escalate_to_id and team.escalate_to else None,
    }
    team.escalation_after, team.escalate_to = after, to
    team.save(update_fields=["escalation_after", "escalate_to"])
    record_event(
        kind=kinds.TEAM_ESCALATION_SET,
        actor=actor,
        subject=f"team:{team.pk}",
        payload={
            "team": team.name,
            "after": after,
            "to": to.name if to else None,
            "before": before,
        },
    )
    return True


def escalation_text(team: Team) -> str:
    """How a team escalates, as its page and the command say it."""
    if team.escalation_after is None:
        return "No escalation: an undecided ask waits for this team's reviewers until it expires."
    to = f"the team {team.escalate_to.name}" if team.escalate_to else "the organization's reviewers"
    return f"After {team.escalation_after} s without a decision, an ask is offered to {to} too."
