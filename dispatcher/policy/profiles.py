"""Managing permission profiles: versioned edits, the simulator, the backtest, session grants.

Every state change here is one transaction with its audit event. `simulate` and
`backtest` write nothing: they run stages 2 to 5 of the pipeline (resolve, validate,
pre_execute, guards) on a call that is never stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction

from audit import kinds
from audit.services import record_event
from dispatcher.policy import rules
from dispatcher.policy.context import Profile, Quorum, Trial
from dispatcher.policy.models import Mode, PermissionProfile, ProfileVersion
from dispatcher.tools.base import Tool
from floor.errors import ServiceError

LISTS = ("allow", "ask", "deny")
# A rule entry: a rule text, or an object: (ask list only) a quorum
# {"rule": "run_command(terraform apply *)", "approvals": 2, "group": "sre"}, which may
# also ask for step-up: "step_up": true (approving needs a passkey), or a list of the
# verdicts that do (["approve", "deny"]); and (any list) a log-only rule
# {"rule": "...", "log_only": true}: evaluated and recorded, deciding nothing.
Entry = str | dict[str, Any]
QUORUM_KEYS = frozenset({"rule", "approvals", "group", "step_up", "log_only"})
STEP_UP_VERDICTS = ("approve", "deny")
# The keys an object of the allow or deny list may have.
PLAIN_KEYS = frozenset({"rule", "log_only"})
MAX_APPROVALS = 10
GROUP_NAME = re.compile(r"^[\w.@+\- ]{1,150}$")


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
        return snapshot_of(default_profile())
    return snapshot_of(_snapshot(row), version=row.version)


def snapshot_of(document: Mapping[str, Any], version: int = 1) -> Profile:
    """The Profile policy reads from stored entries: active rule texts in the lists, the
    ask entries that are quorum objects in `quorum` as well, log-only entries in `trial`."""
    lists = active_lists(document)
    return Profile(
        mode=document["mode"],
        allow=lists["allow"],
        ask=lists["ask"],
        deny=lists["deny"],
        version=version,
        quorum=quorum_of_entries(document.get("ask", [])),
        trial=trial_of(document),
    )


def is_log_only(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("log_only") is True


def active_lists(document: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The rule texts of the active entries of each list (log-only ones left out)."""
    return {
        name: tuple(entry_rule(e) for e in document.get(name, []) if not is_log_only(e))
        for name in LISTS
    }


def quorum_of_entries(entries: Iterable[Any]) -> tuple[Quorum, ...]:
    return tuple(_quorum_of_entry(e) for e in entries if isinstance(e, dict) and not is_log_only(e))


def trial_of(document: Mapping[str, Any]) -> tuple[Trial, ...]:
    return tuple(
        Trial(name, entry_rule(e))
        for name in LISTS
        for e in document.get(name, [])
        if is_log_only(e)
    )


def _quorum_of_entry(entry: Mapping[str, Any]) -> Quorum:
    """A quorum object's requirement. "approvals" is a count (of anyone, or of "group"),
    or a list of {"group", "count"}: several groups as several counts."""
    approvals = entry.get("approvals", 1)
    step_up = step_up_verdicts(entry.get("step_up"))
    if isinstance(approvals, list):
        groups = tuple((str(g["group"]), int(g.get("count", 1))) for g in approvals)
        return Quorum(str(entry["rule"]), sum(n for _, n in groups), "", step_up, groups)
    return Quorum(str(entry["rule"]), int(approvals), str(entry.get("group", "")), step_up)


def quorum_groups(entry: Any) -> list[str]:
    """The group names a quorum object names (its "group", or those of its list)."""
    if not isinstance(entry, dict):
        return []
    names = [entry["group"]] if isinstance(entry.get("group"), str) else []
    if isinstance(entry.get("approvals"), list):
        names += [
            g["group"]
            for g in entry["approvals"]
            if isinstance(g, dict) and isinstance(g.get("group"), str)
        ]
    return names


def step_up_verdicts(value: Any) -> tuple[str, ...]:
    """The verdicts a quorum object's "step_up" asks a passkey for: true is ("approve",);
    a list names them (in STEP_UP_VERDICTS order); anything else, none."""
    if value is True:
        return ("approve",)
    if isinstance(value, list):
        return tuple(v for v in STEP_UP_VERDICTS if v in value)
    return ()


def _step_up_problem(shown: str, value: Any) -> list[str]:
    if value is True or value is False:
        return []
    if isinstance(value, list) and value and all(v in STEP_UP_VERDICTS for v in value):
        return []
    return [
        f'ask: {shown}: "step_up" must be true (approving needs a passkey) or a list of '
        'the verdicts that need one: ["approve"], ["deny"] or ["approve", "deny"].'
    ]


# --- Editing ----------------------------------------------------------------------------


def entry_rule(entry: Any) -> str:
    """The rule text of an entry (a quorum object's "rule"); "" when there is none."""
    if isinstance(entry, dict):
        rule = entry.get("rule")
        return rule.strip() if isinstance(rule, str) else ""
    return str(entry).strip()


def _clean_entry(item: Any) -> Any:
    """A rule text stripped; a quorum object (or a line holding one as JSON, as the
    dashboard's text areas send it) with its rule stripped and an absent group dropped.
    An object asking for one approval from anyone is the plain rule text. Anything else
    is returned as it is, for check_profile to name."""
    if isinstance(item, str) and item.strip().startswith("{"):
        try:
            item = json.loads(item)
        except ValueError:
            return item.strip()
    if not isinstance(item, dict):
        return str(item).strip()
    entry = dict(item)
    if isinstance(entry.get("rule"), str):
        entry["rule"] = entry["rule"].strip()
    if entry.get("group") in ("", None):
        entry.pop("group", None)
    if entry.get("log_only") is False:
        entry.pop("log_only")
    if entry.get("step_up") in (False, None):
        entry.pop("step_up", None)
    plain = set(entry) <= {"rule", "approvals"} and type(entry.get("approvals", 1)) is int
    if plain and entry.get("approvals", 1) == 1 and isinstance(entry.get("rule"), str):
        return str(entry["rule"])
    return entry


def clean_rules(lines: Iterable[Any]) -> list[Entry]:
    """One entry per item: surrounding blanks removed, empty items and repeated rules
    dropped (the first entry for a rule text is kept)."""
    out: list[Entry] = []
    seen: set[str] = set()
    for line in lines:
        entry = _clean_entry(line)
        key = entry_rule(entry) if isinstance(entry, dict) else entry
        if entry == "" or key in seen:
            continue
        seen.add(key)
        out.append(entry)
    return out


def entry_problems(
    lists: Mapping[str, Iterable[Any]], tools: Sequence[Tool] | None = None
) -> list[str]:
    """Every problem in rule lists whose entries may be quorum objects: the objects'
    shape, then the rules (rules.validate_rules on their texts). Reads no database."""
    problems: list[str] = []
    texts: dict[str, list[str]] = {}
    for action, entries in lists.items():
        if isinstance(entries, str) or not isinstance(entries, Iterable):
            texts[action] = entries  # type: ignore[assignment]  # validate_rules names it
            continue
        texts[action] = []
        for entry in entries:
            if isinstance(entry, dict):
                problems += _quorum_problems(action, entry)
                texts[action].append(entry_rule(entry) or "(no rule)")
            else:
                texts[action].append(entry)
    return problems + rules.validate_rules(texts, tools)


def _quorum_problems(action: str, entry: dict[str, Any]) -> list[str]:
    shown = json.dumps(entry, ensure_ascii=True)[:200]
    problems = []
    if "log_only" in entry and not isinstance(entry["log_only"], bool):
        problems.append(f'{action}: {shown}: "log_only" must be true or false.')
    if action != "ask":
        if not set(entry) <= PLAIN_KEYS:
            return [
                f"{action}: {shown}: only ask rules can require approvals; write the rule "
                'text (or {"rule": ..., "log_only": true}).'
            ]
        if not isinstance(entry.get("rule"), str) or not entry["rule"].strip():
            problems.append(f'{action}: {shown}: "rule" must be a rule text.')
        return problems
    unknown = sorted(set(entry) - QUORUM_KEYS)
    if unknown:
        problems.append(
            f"ask: {shown}: unknown key(s) {', '.join(unknown)} "
            "(use rule, approvals, group, step_up, log_only)."
        )
    if not isinstance(entry.get("rule"), str) or not entry["rule"].strip():
        problems.append(f'ask: {shown}: "rule" must be a rule text such as "run_command(make *)".')
    approvals = entry.get("approvals", 1)
    if isinstance(approvals, list):
        problems += _groups_problems(shown, entry, approvals)
    elif type(approvals) is not int or not 1 <= approvals <= MAX_APPROVALS:
        problems.append(
            f'ask: {shown}: "approvals" must be a whole number from 1 to {MAX_APPROVALS}, '
            'or a list of {"group": ..., "count": ...}.'
        )
    group = entry.get("group", "")
    if not isinstance(group, str) or (group and not GROUP_NAME.match(group)):
        problems.append(f'ask: {shown}: "group" must be the name of a group of reviewers.')
    return problems + _step_up_problem(shown, entry.get("step_up", False))


def _groups_problems(shown: str, entry: dict[str, Any], approvals: list[Any]) -> list[str]:
    """The list form of "approvals": each item one group's count, no group twice."""
    if "group" in entry:
        return [f'ask: {shown}: name the groups in "approvals", not in "group" as well.']
    shape = all(
        isinstance(g, dict)
        and set(g) <= {"group", "count"}
        and isinstance(g.get("group"), str)
        and GROUP_NAME.match(g["group"])
        and type(g.get("count", 1)) is int
        and g.get("count", 1) >= 1
        for g in approvals
    )
    if not approvals or not shape:
        return [
            f'ask: {shown}: each item of "approvals" must be {{"group": "<group of '
            'reviewers>", "count": <1 or more>}.'
        ]
    names = [g["group"] for g in approvals]
    if len(set(names)) != len(names):
        return [f'ask: {shown}: a group is named twice in "approvals"; add up its counts.']
    if sum(g.get("count", 1) for g in approvals) > MAX_APPROVALS:
        return [f'ask: {shown}: the counts of "approvals" add up to more than {MAX_APPROVALS}.']
    return []


def check_profile(
    mode: str, lists: dict[str, list[Entry]], tools: Sequence[Tool] | None = None
) -> None:
    """Raise InvalidProfile with one message per problem (naming the bad pattern, the bad
    quorum object, or a quorum group that does not exist)."""
    problems = []
    if mode not in Mode.values:
        problems.append(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    problems += list_problems(lists, tools)
    if problems:
        raise InvalidProfile(problems)


def list_problems(
    lists: Mapping[str, list[Entry]], tools: Sequence[Tool] | None = None
) -> list[str]:
    """Every problem of cleaned rule lists: the entries (entry_problems, against `tools`:
    default the registry), and quorum groups that do not exist."""
    problems = entry_problems(lists, tools)
    groups = {name for e in lists.get("ask", []) for name in quorum_groups(e)}
    known = set(Group.objects.filter(name__in=groups).values_list("name", flat=True))
    problems += [
        f"ask: the group '{name}' does not exist; create it (and add reviewers to it) first."
        for name in sorted(groups - known)
    ]
    return problems


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
    allow: Iterable[Any],
    ask: Iterable[Any],
    deny: Iterable[Any],
    actor: User | str,
    expected_version: int | None = None,
    tools: Sequence[Tool] | None = None,
) -> PermissionProfile:
    """Save `user`'s mode and rules as a new version, with its history row and audit event.

    An entry is a rule text or (ask only) a quorum object; see clean_rules. Its tools are
    checked against `tools` (a team admin's teams' tools; default: the registry).
    Raises InvalidProfile (nothing saved) naming each bad rule, and StaleProfile when
    `expected_version` is given and someone saved another version meanwhile. Saving the
    same mode and rules again changes nothing and keeps the version.
    """
    lists = {"allow": clean_rules(allow), "ask": clean_rules(ask), "deny": clean_rules(deny)}
    check_profile(mode, lists, tools)
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
    user: User,
    mode: str,
    allow: Iterable[Any],
    ask: Iterable[Any],
    deny: Iterable[Any],
    tools: Sequence[Tool] | None = None,
) -> Profile:
    """The profile `user` would have if these were saved (validated against `tools`, as
    update_profile does: a team admin's teams' tools; default the registry; InvalidProfile
    if not)."""
    lists = {"allow": clean_rules(allow), "ask": clean_rules(ask), "deny": clean_rules(deny)}
    check_profile(mode, lists, tools)
    current = profile_for(user)
    return snapshot_of({"mode": mode, **lists}, version=current.version + 1)


# --- Rules as a document (manage.py get_rules / set_rules) --------------------------------


def entry_line(entry: Entry) -> str:
    """One entry as one line of the dashboard's text areas: the rule text, or a quorum
    object as compact JSON (clean_rules reads it back)."""
    if isinstance(entry, dict):
        return json.dumps(entry, ensure_ascii=False)
    return entry


def rules_document(user: User) -> dict[str, Any]:
    """`user`'s mode and rules as the rules file holds them:
    {"mode", "allow", "ask", "deny"}, each entry a rule text or a quorum object."""
    row = PermissionProfile.objects.filter(user=user).first()
    return _snapshot(row) if row is not None else default_profile()


def set_rules(*, user: User, document: Any, actor: User | str) -> PermissionProfile:
    """Save a rules document (see rules_document) through update_profile: validated,
    versioned, audited. Raises InvalidProfile naming every problem of the document."""
    if not isinstance(document, dict):
        raise InvalidProfile(
            ['The rules file must be a JSON object: {"mode", "allow", "ask", "deny"}.']
        )
    unknown = sorted(set(document) - {"mode", "max_mode", *LISTS})
    problems = (
        [f"Unknown key(s) {', '.join(unknown)}: use mode, allow, ask, deny."] if unknown else []
    )
    if "max_mode" in document:
        problems.append(
            "'max_mode' belongs in the organization's or a team's file (set_rules --org, "
            "--team); a user's 'mode' is already the ceiling of their agents' sessions."
        )
    lists: dict[str, list[Any]] = {}
    for name in LISTS:
        value = document.get(name, [])
        if not isinstance(value, list):
            problems.append(f"'{name}' must be a list of rules, not {type(value).__name__}.")
            value = []
        lists[name] = value
    mode = document["mode"] if "mode" in document else rules_document(user)["mode"]
    if not isinstance(mode, str):
        problems.append(f"'mode' must be one of: {', '.join(Mode.values)}.")
    if problems:
        raise InvalidProfile(problems)
    return update_profile(
        user=user,
        mode=mode,
        actor=actor,
        allow=lists["allow"],
        ask=lists["ask"],
        deny=lists["deny"],
    )
