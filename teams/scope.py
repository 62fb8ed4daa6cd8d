"""Who sees and decides what: a person's reach for one role, decided here and nowhere else.

A role held organization-wide (the Django group of that name, or a superuser) reaches
every team; a role held in teams reaches those teams' agents, their sessions, calls and
asks. Views, sockets, exports, notifications and links ask `scope_of` and filter with it;
none decides reach on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.db.models import Exists, FilteredRelation, Model, Q, QuerySet

from floor.compiled import Compiled

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

    def covers_any(self, *team_ids: int | None) -> bool:
        """Does this reach cover any of `team_ids` (an escalated ask belongs to its agent's
        team and to the team it was escalated to: `ask_teams`)?"""
        return any(self.covers(team_id) for team_id in team_ids)

    def filter_either(self, rows: QuerySet[M], *team_fields: str) -> QuerySet[M]:
        """`rows` whose team by any of `team_fields` (paths from one row, so no row is
        repeated and no DISTINCT is needed) this reach covers: an ask is reached through
        its agent's team or the team it was escalated to (`ASK_TEAMS`)."""
        if self.everything:
            return rows
        ids = sorted(self.team_ids)
        either = Q()
        for field in team_fields:
            either |= Q(**{f"{field}__in": ids})
        return rows.filter(either)

    def filter(self, rows: QuerySet[M], team_field: str) -> QuerySet[M]:
        """`rows` narrowed to this reach; `team_field` is the path to the team's id
        (`team_id` for sessions, `session__team_id` for calls: the team a session was
        started under, dispatcher.models.AgentSession.team, not its agent's team of now)."""
        if self.everything:
            return rows
        return rows.filter(**{f"{team_field}__in": sorted(self.team_ids)})

    def filter_any(self, rows: QuerySet[M], *team_fields: str) -> QuerySet[M]:
        """`rows` reached by any of `team_fields` (distinct): the people of a team are its
        members and the owners of its agents (`team_memberships__team_id`,
        `agents__team_id`)."""
        if self.everything:
            return rows
        ids = sorted(self.team_ids)
        either = Q()
        for field in team_fields:
            either |= Q(**{f"{field}__in": ids})
        return rows.filter(either).distinct()

    def filter_via(
        self, rows: QuerySet[M], field: str, owners: QuerySet[Any], team_field: str
    ) -> QuerySet[M]:
        """`rows` whose `field` is the key of one of `owners` this reach covers: for rows
        that name their session or agent without a foreign key (the audit log's chains
        name sessions by id). A subquery, never another statement."""
        if self.everything:
            return rows
        return rows.filter(**{f"{field}__in": self.filter(owners, team_field).values("pk")})


# The organization's roles, as Django groups (audit.roles.ROLES; quorum groups are others).
ORG_ROLE_GROUPS = ("reviewer", "auditor", "admin")


def wholly_within(scope: Scope, person: Any) -> bool:
    """Whether everything `person` is and owns lies inside `scope`: no organization role,
    and no membership or agent in a team it does not cover. A team admin acts on behalf of
    such a person only (changes their rules, makes agents they own): a person's rules
    govern all of their agents, and any team admin can add anyone to their own team."""
    if scope.everything:
        return True
    if person.is_superuser or person.groups.filter(name__in=ORG_ROLE_GROUPS).exists():
        return False
    ids = sorted(scope.team_ids)
    return not (
        person.team_memberships.exclude(team_id__in=ids).exists()
        or person.agents.exclude(team_id__in=ids).exists()
    )


def wholly_within_people(scope: Scope, people: QuerySet[User]) -> QuerySet[User]:
    """`people` narrowed to those `wholly_within` `scope`, in one statement (a list)."""
    if scope.everything:
        return people
    ids = sorted(scope.team_ids)
    # The agents' model through the relation: teams lies below the app that defines it.
    agents: Any = User._meta.get_field("agents").related_model
    return (
        people.filter(is_superuser=False)
        .exclude(groups__name__in=ORG_ROLE_GROUPS)
        .exclude(pk__in=Membership.objects.exclude(team_id__in=ids).values("user_id"))
        .exclude(pk__in=agents._default_manager.exclude(team_id__in=ids).values("owner_id"))
    )


# The paths from an approval request to the teams that decide it: its session's team (the
# team the agent worked for when the session started: AgentSession.team), and once it
# escalated (approvals.services.escalate_due), the next tier's team. Every view,
# socket, link and decision of an ask reaches it through both (ask_teams for a row read).
ASK_TEAMS = ("call__session__team_id", "escalated_to_id")


def ask_teams(approval: Any) -> tuple[int | None, int | None]:
    """The teams whose reviewers decide `approval` (an approvals.ApprovalRequest read with
    its call's session): its session's team, and the team it escalated to."""
    return approval.call.session.team_id, approval.escalated_to_id


NOTHING = Scope(everything=False, team_ids=frozenset())
EVERYTHING = Scope(everything=True, team_ids=frozenset())


def org_holds(user: Any, role: str) -> bool:
    """Does `user` hold `role` organization-wide (a superuser holds every role)?"""
    return scope_of(user, role).everything


def scope_of(user: Any, role: str) -> Scope:
    """The teams `user` reaches with `role` now (nothing unless signed in and active).

    One statement, whatever the number of teams: the organization's group and the teams'
    memberships are read together (`_REACH`), so a page, a socket or a decision that
    checks the role learns its reach in the same read (the statement budgets of the hot
    paths count it once)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NOTHING
    if user.is_superuser:
        return EVERYTHING
    return _scope_of_rows(_REACH.tuples(user.pk, role))


def _scope_of_rows(rows: list[tuple[Any, ...]]) -> Scope:
    """The reach the rows of `_REACH` (or `_SIGN_IN`, by their last two columns) say: one
    (group, team) per row, NULL where none."""
    if any(row[-2] is not None for row in rows):
        return EVERYTHING
    return Scope(everything=False, team_ids=frozenset(r[-1] for r in rows if r[-1] is not None))


def sign_in_scope(
    user_id: int, role: str, session_key: str, now: datetime
) -> tuple[str, Scope] | None:
    """The password hash of an active user and their reach with `role` now (None: no such
    active user, or their sign-in `session_key` has ended: its session deleted or expired
    by `now`), in one statement: what a socket bound to a sign-in reads before every push
    (audit.consumers.BoundToSignIn), so that a reach changed, or a sign-in ended, with no
    close message reaching the socket (one lost: Redis down at that moment, a
    channel-layer expiry, a membership or session written by hand) still closes it. An
    empty `session_key` (a socket opened with none) asks about the user only."""
    rows = _SIGN_IN.tuples(user_id, role, session_key, now)
    if not rows or (session_key and not rows[0][2]):
        return None
    password, superuser = rows[0][:2]
    return password, EVERYTHING if superuser else _scope_of_rows(rows)


def _with_reach(users: QuerySet[User], role: str) -> Any:  # (annotated: mypy cannot follow)
    return users.annotate(
        org=FilteredRelation("groups", condition=Q(groups__name=role)),
        member=FilteredRelation("team_memberships", condition=Q(team_memberships__role=role)),
    ).order_by()


# Asked on every page, socket and decision of a role (floor.compiled): the user's row with
# the organization's group of that name and their memberships with that role, both left
# joins, so one row (NULL, NULL) says "neither" and one row per team otherwise.
_REACH = Compiled(
    lambda user_id, role: _with_reach(User.objects.filter(pk=user_id), role).values_list(
        "org__id", "member__team_id"
    )
)


# `_REACH` of an active user with their password hash, superuser flag and whether the
# sign-in's session is still there, unexpired (sign_in_scope; sessions are in the database:
# identity.services.end_sign_ins deletes them there).
_SIGN_IN = Compiled(
    lambda user_id, role, session_key, now: (
        _with_reach(User.objects.filter(pk=user_id, is_active=True), role)
        .annotate(
            signed_in=Exists(Session.objects.filter(session_key=session_key, expire_date__gt=now))
        )
        .values_list("password", "is_superuser", "signed_in", "org__id", "member__team_id")
    )
)


def scope_of_any(user: Any, roles: list[str]) -> Scope:
    """The teams `user` reaches with any of `roles` (the overview, which every role
    opens, shows the union): one statement, as `scope_of`."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NOTHING
    if user.is_superuser:
        return EVERYTHING
    return _scope_of_rows(_REACH_ANY.tuples(user.pk, sorted(roles)))


_REACH_ANY = Compiled(
    lambda user_id, roles: (
        User.objects.filter(pk=user_id)
        .annotate(
            org=FilteredRelation("groups", condition=Q(groups__name__in=roles)),
            member=FilteredRelation(
                "team_memberships", condition=Q(team_memberships__role__in=roles)
            ),
        )
        .order_by()
        .values_list("org__id", "member__team_id")
    )
)
