"""Managing permission profiles: versioned edits, the simulator, the backtest, session grants.

Every state change here is one transaction with its audit event. `simulate` and
`backtest` write nothing: they run stages 2 to 5 of the pipeline (resolve, validate,
pre_execute, guards) on a call that is never stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from audit import kinds
from audit.services import record_event
from dispatcher.errors import ServiceError
from dispatcher.policy import rules
from dispatcher.policy.context import Profile
from dispatcher.policy.models import Mode, PermissionProfile, ProfileVersion

LISTS = ("allow", "ask", "deny")


class InvalidProfile(ServiceError):
    """The proposed mode or rules cannot be saved; `problems` names each bad pattern."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


class StaleProfile(ServiceError):
    """The profile changed since the editor loaded it."""


def default_profile() -> dict[str, Any]:
    """What a user without a saved profile has: HARNESS_DEFAULT_MODE and _RULES."""
    rules = settings.HARNESS_DEFAULT_RULES
    return {
        "mode": settings.HARNESS_DEFAULT_MODE,
        **{key: list(rules.get(key, [])) for key in ("allow", "ask", "deny")},
    }


def profile_for(user: User, *, preloaded: bool = False) -> Profile:
    """The user's profile. `preloaded`: the caller has just read `user` with
    select_related("permission_profile"), so that row is used instead of a new read."""
    if preloaded:
        row = getattr(user, "permission_profile", None)  # None: the user has no saved profile
    else:
        row = PermissionProfile.objects.filter(user=user).first()
    if row is None:
        default = default_profile()
        return Profile(
            mode=default["mode"],
            allow=tuple(default["allow"]),
            ask=tuple(default["ask"]),
            deny=tuple(default["deny"]),
        )
    return Profile(
        mode=row.mode,
        allow=tuple(row.allow),
        ask=tuple(row.ask),
        deny=tuple(row.deny),
        version=row.version,
    )


# --- Editing ----------------------------------------------------------------------------


def clean_rules(lines: Iterable[str]) -> list[str]:
    """One rule per item: surrounding blanks removed, empty items and repeats dropped."""
    out: list[str] = []
    for line in lines:
        text = str(line).strip()
        if text and text not in out:
            out.append(text)
    return out


def check_profile(mode: str, lists: dict[str, list[str]]) -> None:
    """Raise InvalidProfile with one message per problem (naming the bad pattern)."""
    problems = []
    if mode not in Mode.values:
        problems.append(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    problems += rules.validate_rules(lists)
    if problems:
        raise InvalidProfile(problems)


def profile_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """{"mode": [from, to]?, "<list>": {"added": [...], "removed": [...]}?}; empty if equal.

    A reordered list (order matters: the first match decides) shows as "order": [old, new].
    """
    diff: dict[str, Any] = {}
    if old["mode"] != new["mode"]:
        diff["mode"] = [old["mode"], new["mode"]]
    for name in LISTS:
        before, after = list(old[name]), list(new[name])
        if before == after:
            continue
        change: dict[str, Any] = {
            "added": [r for r in after if r not in before],
            "removed": [r for r in before if r not in after],
        }
        if not change["added"] and not change["removed"]:
            change["order"] = [before, after]
        diff[name] = change
    return diff


def _snapshot(profile: PermissionProfile) -> dict[str, Any]:
    return {"mode": profile.mode, **{name: list(getattr(profile, name)) for name in LISTS}}


def update_profile(
    *,
    user: User,
    mode: str,
    allow: Iterable[str],
    ask: Iterable[str],
    deny: Iterable[str],
    actor: User | str,
    expected_version: int | None = None,
) -> PermissionProfile:
    """Save `user`'s mode and rules as a new version, with its history row and audit event.

    Raises InvalidProfile (nothing saved) naming each bad rule, and StaleProfile when
    `expected_version` is given and someone saved another version meanwhile. Saving the
    same mode and rules again changes nothing and keeps the version.
    """
    lists = {"allow": clean_rules(allow), "ask": clean_rules(ask), "deny": clean_rules(deny)}
    check_profile(mode, lists)
    with transaction.atomic():
        profile, _ = PermissionProfile.objects.select_for_update().get_or_create(
            user=user, defaults=default_profile()
        )
        if expected_version is not None and profile.version != expected_version:
            raise StaleProfile(
                f"{user.get_username()}'s profile was changed (now v{profile.version}, you "
                f"edited v{expected_version}). Reload the page and apply your change again."
            )
        old = _snapshot(profile)
        diff = profile_diff(old, {"mode": mode, **lists})
        if not diff:
            return profile
        profile.mode = mode
        profile.allow, profile.ask, profile.deny = lists["allow"], lists["ask"], lists["deny"]
        profile.version += 1
        profile.save()
        changed_by = None if isinstance(actor, str) else actor
        ProfileVersion.objects.create(
            user=user, version=profile.version, mode=mode, changed_by=changed_by, diff=diff, **lists
        )
        record_event(
            kind=kinds.PROFILE_CHANGED,
            actor=actor if isinstance(actor, str) else f"user:{actor.get_username()}",
            subject=f"user:{user.get_username()}",
            payload={
                "user": user.get_username(),
                "version": profile.version,
                "from_version": profile.version - 1,
                "mode": mode,
                **lists,
                "diff": diff,
            },
        )
    return profile


def set_mode(*, user: User, mode: str, actor: User | str) -> PermissionProfile:
    """Change only `user`'s mode (the command line's `set_mode`); the rules stay.

    `actor` is the person, or a name such as "cli" for a command. Raises InvalidProfile
    for an unknown mode.
    """
    row = PermissionProfile.objects.filter(user=user).first()
    rules = {k: getattr(row, k) for k in LISTS} if row else default_profile()
    return update_profile(
        user=user,
        mode=mode,
        allow=rules["allow"],
        ask=rules["ask"],
        deny=rules["deny"],
        actor=actor,
    )


def proposed_profile(
    user: User, mode: str, allow: Iterable[str], ask: Iterable[str], deny: Iterable[str]
) -> Profile:
    """The profile `user` would have if these were saved (validated; InvalidProfile if not)."""
    lists = {"allow": clean_rules(allow), "ask": clean_rules(ask), "deny": clean_rules(deny)}
    check_profile(mode, lists)
    current = profile_for(user)
    return Profile(
        mode=mode,
        allow=tuple(lists["allow"]),
        ask=tuple(lists["ask"]),
        deny=tuple(lists["deny"]),
        version=current.version + 1,
    )
