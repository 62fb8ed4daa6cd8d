"""Who sees and decides what: a person's reach for one role, decided here and nowhere else.

A role held organization-wide (the Django group of that name, or a superuser) reaches
every team; a role held in teams reaches those teams' agents, their sessions, calls and
asks. Views, sockets, exports, notifications and links ask `scope_of` and filter with it;
none decides reach on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth.models import Group
from django.db.models import Model, QuerySet

from .models import Membership

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Scope:
    """The teams a person reaches with one role: all of them, or `team_ids`."""

    everything: bool
    team_ids: frozenset[int]

    @property
    def empty(self) -> bool:
        return not self.everything and not self.team_ids

    def covers(self, team_id: int | None) -> bool:
        return self.everything or (team_id is not None and team_id in self.team_ids)

    def filter(self, rows: QuerySet[M], team_field: str) -> QuerySet[M]:
        """`rows` narrowed to this reach; `team_field` is the path to the team's id
        (`agent__team_id` for sessions, `session__agent__team_id` for calls)."""
        if self.everything:
            return rows
        return rows.filter(**{f"{team_field}__in": sorted(self.team_ids)})


NOTHING = Scope(everything=False, team_ids=frozenset())
EVERYTHING = Scope(everything=True, team_ids=frozenset())


def org_holds(user: Any, role: str) -> bool:
    """Does `user` hold `role` organization-wide (a superuser holds every role)?"""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return bool(user.is_superuser or Group.objects.filter(user__id=user.pk, name=role).exists())


def scope_of(user: Any, role: str) -> Scope:
    """The teams `user` reaches with `role` now (nothing unless signed in and active)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NOTHING
    if org_holds(user, role):
        return EVERYTHING
    teams = Membership.objects.filter(user_id=user.pk, role=role).values_list("team_id", flat=True)
    return Scope(everything=False, team_ids=frozenset(teams))
