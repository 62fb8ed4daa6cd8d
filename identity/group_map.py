"""Groups become teams and roles: what HARNESS_SSO_GROUP_MAP says a person's identity
provider groups grant (docs/identity.md, "Groups").

    {"platform-sre": "team:sre:reviewer",
     "security": ["org:auditor", "team:sre:auditor"],
     "harness-admins": "org:admin"}

Each value is a grant or a list of them: `team:NAME:reviewer|auditor|admin` or
`org:admin|auditor`. Parsed once by settings.py (a bad entry stops Harness at start-up
with the entry named); this module reads no database. Applying the grants at each
sign-in, managing only the memberships the map gave (source `sso`), is left for the
teams app (teams.Membership's `source`).

Imported by settings: the standard library and Django's ImproperlyConfigured only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

TEAM_ROLES = ("reviewer", "auditor", "admin")
ORG_ROLES = ("admin", "auditor")
_TEAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True, order=True)
class Grant:
    """One role the map gives: in a team (`team` set) or for the organization."""

    role: str
    team: str = ""

    def __str__(self) -> str:
        return f"team:{self.team}:{self.role}" if self.team else f"org:{self.role}"


def parse_grant(text: str, where: str) -> Grant:
    parts = text.split(":")
    if len(parts) == 2 and parts[0] == "org" and parts[1] in ORG_ROLES:
        return Grant(parts[1])
    if len(parts) == 3 and parts[0] == "team" and parts[2] in TEAM_ROLES:
        if not _TEAM_NAME.match(parts[1]):
            raise ImproperlyConfigured(f"{where}: {parts[1]!r} is not a team name.")
        return Grant(parts[2], parts[1])
    raise ImproperlyConfigured(
        f"{where}: {text!r} is not a grant. Use 'team:NAME:reviewer|auditor|admin' or "
        "'org:admin|auditor'."
    )


def parse_group_map(raw: str) -> dict[str, tuple[Grant, ...]]:
    """HARNESS_SSO_GROUP_MAP's text as {IdP group: grants}; raises ImproperlyConfigured."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"HARNESS_SSO_GROUP_MAP is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured(
            'HARNESS_SSO_GROUP_MAP must be a JSON object: {"IdP group": "team:NAME:reviewer"}.'
        )
    parsed: dict[str, tuple[Grant, ...]] = {}
    for group, value in data.items():
        where = f"HARNESS_SSO_GROUP_MAP[{group!r}]"
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ImproperlyConfigured(f"{where}: a grant or a list of grants (strings).")
        parsed[group] = tuple(sorted({parse_grant(v, where) for v in values}))
    return parsed


def groups_in(extra_data: Mapping[str, Any], kind: str, claim: str) -> list[str]:
    """The groups an identity provider said a person is in: OIDC's claim (userinfo first,
    then the ID token), SAML's attribute (a list of values). One string counts as one
    group; anything else as none."""
    if kind == "oidc":
        sources = [extra_data.get("userinfo") or {}, extra_data.get("id_token") or {}, extra_data]
        value: Any = next((s[claim] for s in sources if isinstance(s, dict) and claim in s), [])
    else:
        value = extra_data.get(claim, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return sorted({v for v in value if isinstance(v, str) and v})


def grants_for(groups: Iterable[str], group_map: Mapping[str, tuple[Grant, ...]]) -> set[Grant]:
    """Every grant the map gives someone in `groups` (groups the map names not: nothing)."""
    return {grant for group in groups for grant in group_map.get(group, ())}


def plan(
    *, wanted: set[Grant], held_from_map: set[Grant], held_by_hand: set[Grant]
) -> tuple[set[Grant], set[Grant]]:
    """(to give, to take) at a sign-in: the map gives what it grants and the person lacks;
    it takes only what it gave before and grants no more. A role given by hand is neither
    given again nor taken."""
    give = wanted - held_from_map - held_by_hand
    take = held_from_map - wanted
    return give, take
