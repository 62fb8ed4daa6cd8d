"""HARNESS_SSO_GROUP_MAP: what it grants for a person's groups, a bad entry named at
start-up, and the groups read from what a real provider sent (OIDC claim)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from identity.group_map import Grant, grants_for, groups_in, parse_group_map, plan
from tests.support import oidc
from tests.support.factories import unique

MAP = {
    "platform-sre": "team:sre:reviewer",
    "security": ["org:auditor", "team:sre:auditor"],
    "harness-admins": "org:admin",
}


def test_the_map_grants_team_and_org_roles_for_the_groups_it_names() -> None:
    group_map = parse_group_map(json.dumps(MAP))
    assert grants_for(["platform-sre", "security", "unmapped"], group_map) == {
        Grant("reviewer", "sre"),
        Grant("auditor", "sre"),
        Grant("auditor"),
    }
    assert grants_for(["unmapped"], group_map) == set()
    assert (
        str(Grant("reviewer", "sre")) == "team:sre:reviewer" and str(Grant("admin")) == "org:admin"
    )


def test_the_map_manages_only_what_it_gave() -> None:
    by_hand, from_map = {Grant("admin", "sre")}, {Grant("reviewer", "sre"), Grant("auditor")}
    give, take = plan(
        wanted={Grant("admin", "sre"), Grant("reviewer", "ops")},
        held_from_map=from_map,
        held_by_hand=by_hand,
    )
    assert give == {Grant("reviewer", "ops")}  # the hand-given admin is not given again
    assert take == from_map  # its groups went away; the hand-given role stays


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not valid JSON"),
        ('["team:sre:reviewer"]', "must be a JSON object"),
        ('{"g": "team:sre:owner"}', "is not a grant"),
        ('{"g": "org:reviewer"}', "is not a grant"),
        ('{"g": "team:bad name:reviewer"}', "is not a team name"),
        ('{"g": 3}', "a grant or a list of grants"),
    ],
)
def test_a_bad_entry_is_named(raw: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_group_map(raw)


def test_groups_are_read_from_the_oidc_claim_or_the_saml_attribute() -> None:
    assert groups_in({"userinfo": {"groups": ["b", "a", "a", 3]}}, "oidc", "groups") == ["a", "b"]
    assert groups_in({"id_token": {"roles": "one"}}, "oidc", "roles") == ["one"]
    assert groups_in({"groups": ["sre"]}, "saml", "groups") == ["sre"]
    assert groups_in({}, "saml", "groups") == []


@pytest.mark.django_db
def test_a_real_provider_s_groups_claim_is_what_the_map_reads(settings: Any) -> None:
    with oidc.oidc_provider() as provider:
        oidc.configure(settings, provider)
        sub = unique("grp")
        provider.set_person(
            sub, email=f"{sub}@corp.test", email_verified=True, groups=["platform-sre", "security"]
        )
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
    account = SocialAccount.objects.get(provider="sso", uid=sub)
    [sso] = settings.HARNESS_SSO
    groups = groups_in(account.extra_data, sso.kind, sso.groups_claim)
    assert groups == ["platform-sre", "security"]
    assert Grant("reviewer", "sre") in grants_for(groups, parse_group_map(json.dumps(MAP)))


@pytest.mark.heavy
@pytest.mark.django_db
def test_each_sign_in_gives_what_the_groups_grant_and_takes_what_they_no_longer_do(
    settings: Any,
) -> None:
    from django.contrib.auth.models import User

    from audit import roles
    from audit.models import AuditEvent
    from teams.models import Membership
    from teams.scope import scope_of
    from teams.services import add_member, create_team

    settings.HARNESS_SSO_GROUP_MAP = parse_group_map(json.dumps(MAP))
    ops = create_team(name="ops", actor="test")
    with oidc.oidc_provider() as provider:
        oidc.configure(settings, provider)
        sub = unique("grp")
        provider.set_person(
            sub, email=f"{sub}@corp.test", email_verified=True, groups=["platform-sre", "security"]
        )
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
        person = User.objects.get(email=f"{sub}@corp.test")
        sre = Membership.objects.get(user=person, role="reviewer").team
        assert sre.name == "sre"  # made by the map, audited as the provider's
        assert scope_of(person, "reviewer").team_ids == {sre.pk}
        assert roles.has_role(person, "auditor") and scope_of(person, "auditor").everything
        # A role given by hand is the map's neither to give nor to take.
        add_member(team=ops, user=person, role="reviewer", actor="admin")
        provider.set_person(
            sub, email=f"{sub}@corp.test", email_verified=True, groups=["platform-sre"]
        )
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
        assert not roles.has_role(person, "auditor")  # the security group went away
        assert scope_of(person, "reviewer").team_ids == {sre.pk, ops.pk}
        provider.set_person(sub, email=f"{sub}@corp.test", email_verified=True, groups=[])
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
        assert scope_of(person, "reviewer").team_ids == {ops.pk}
    actors = set(
        AuditEvent.objects.filter(
            kind__in=["team.member_added", "team.member_removed", "role.granted", "role.removed"],
            payload__user=person.username,
        ).values_list("actor", flat=True)
    )
    assert actors == {"sso:sso", "admin"}
