"""Groups become teams and roles at each single sign-on (docs/identity.md, "Groups").

`apply` reads the groups the identity provider sent for the person (identity.group_map),
and through the one role service of each kind (teams.services for team roles,
audit.roles for organization roles; each change audited there) gives what the map
grants and takes what the map gave before and grants no more. A role given by hand is
neither given again nor taken. A team the map names that does not exist yet is made.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from audit import roles
from teams.models import Membership, Source, Team
from teams.services import add_member, create_team, remove_member

from .group_map import Grant, grants_for, groups_in, plan
from .models import MappedOrgRole


@transaction.atomic
def apply(
    *, user: User, provider_id: str, extra_data: dict[str, Any]
) -> tuple[set[Grant], set[Grant]]:
    """(given, taken) for this sign-in of `user` through provider `provider_id`."""
    group_map = settings.HARNESS_SSO_GROUP_MAP
    provider = next((p for p in settings.HARNESS_SSO if p.id == provider_id), None)
    if provider is None or not group_map:
        return set(), set()
    wanted = grants_for(groups_in(extra_data, provider.kind, provider.groups_claim), group_map)
    memberships = list(Membership.objects.filter(user=user).select_related("team"))
    mapped_org = set(MappedOrgRole.objects.filter(user=user).values_list("role", flat=True))
    held_from_map = {Grant(m.role, m.team.name) for m in memberships if m.source == Source.SSO}
    held_from_map |= {Grant(role) for role in mapped_org}
    held_by_hand = {Grant(m.role, m.team.name) for m in memberships if m.source != Source.SSO}
    org = user.groups.filter(name__in=roles.ROLES).values_list("name", flat=True)
    held_by_hand |= {Grant(r) for r in org if r not in mapped_org}
    give, take = plan(wanted=wanted, held_from_map=held_from_map, held_by_hand=held_by_hand)
    actor = f"sso:{provider_id}"
    for grant in sorted(give):
        if grant.team:
            team = Team.objects.filter(name=grant.team).first() or create_team(
                name=grant.team, actor=actor
            )
            add_member(team=team, user=user, role=grant.role, actor=actor, source=Source.SSO)
        else:
            roles.grant_role(user=user, role=grant.role, actor=actor)
            MappedOrgRole.objects.get_or_create(user=user, role=grant.role)
    for grant in sorted(take):
        if grant.team:
            held = Team.objects.filter(name=grant.team).first()
            if held is not None:
                remove_member(team=held, user=user, role=grant.role, actor=actor, source=Source.SSO)
        else:
            roles.remove_role(user=user, role=grant.role, actor=actor)
            MappedOrgRole.objects.filter(user=user, role=grant.role).delete()
    return give, take
