"""Managing permission profiles: versioned edits, the simulator, the backtest, session grants.

Every state change here is one transaction with its audit event. `simulate` and
`backtest` write nothing: they run stages 2 to 5 of the pipeline (resolve, validate,
pre_execute, guards) on a call that is never stored.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit.services import record_event

from . import pipeline, rules
from .context import CallContext, Profile
from .models import (
    AgentSession,
    Mode,
    PermissionProfile,
    ProfileVersion,
    SessionGrant,
    ToolCall,
    narrower_mode,
)
from .registry import get_tool
from .services import (
    ServiceError,
    call_context,
    default_profile,
    mode_and_profile,
    profile_for,
)

LISTS = ("allow", "ask", "deny")
BACKTEST_LIMIT = 500


class InvalidProfile(ServiceError):
    """The proposed mode or rules cannot be saved; `problems` names each bad pattern."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


class StaleProfile(ServiceError):
    """The profile changed since the editor loaded it."""


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
            kind="profile.changed",
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


# --- Simulator --------------------------------------------------------------------------


@dataclass(frozen=True)
class Simulation:
    """What the pipeline would decide, and which stage, rule, mode or guard decided it."""

    action: str  # allow | ask | deny | cancel | reject
    stage: str  # receive | resolve | validate | pre_execute | guards
    by: str
    reason: str
    rule: str = ""
    mode: str = ""
    profile_version: int = 0
    guards: tuple[str, ...] = field(default=())

    @property
    def summary(self) -> str:
        return f"{self.action} by {self.by}"


def simulation_workspace() -> Path:
    """Where paths are read when no session is given: an empty directory (never created)."""
    return Path(settings.HARNESS_WORKSPACE_ROOT).resolve() / "_simulator"


def simulate(
    *,
    user: User,
    tool: str,
    arguments: Any,
    session: AgentSession | None = None,
    profile: Profile | None = None,
) -> Simulation:
    """Decide a call as admission would (stages 2 to 5), storing nothing.

    `profile` defaults to `user`'s saved profile; pass a proposed one to try rules before
    saving. With `session`, its workspace, narrowed mode and active grants are used.
    """
    profile = profile or profile_for(user)
    mode = narrower_mode(session.mode, profile.mode) if session else profile.mode

    def answer(
        action: str, stage: str, by: str, reason: str, rule: str = "", guards: tuple[str, ...] = ()
    ) -> Simulation:
        return Simulation(action, stage, by, reason, rule, mode, profile.version, guards)

    if not isinstance(arguments, dict):
        return answer(
            "reject",
            "receive",
            "stage:receive",
            f"The arguments of '{tool}' must be a JSON object.",
        )
    try:
        definition = pipeline.resolve(tool)
        pipeline.validate(definition, arguments)
    except pipeline.Rejection as rejection:
        return answer("reject", rejection.stage, f"stage:{rejection.stage}", rejection.message)
    ctx = CallContext(
        call_id="simulation",
        session_id=str(session.pk) if session else "",
        tool=definition,
        name=tool,
        arguments=arguments,
        workspace=Path(session.workspace) if session else simulation_workspace(),
        mode=mode,
        username=user.get_username(),
        agent_name=session.agent.name if session else "",
        profile=profile,
    )
    decision = pipeline.pre_execute(ctx)
    if decision.action not in ("deny", "cancel"):
        denials = pipeline.guards(ctx)
        if denials:
            names = tuple(name for name, _ in denials)
            reason = " ".join(r for _, r in denials)
            return answer("deny", "guards", "guard:" + ",".join(names), reason, guards=names)
    return answer(decision.action, "pre_execute", decision.by, decision.reason, decision.rule)


def simulate_call(call: ToolCall, profile: Profile | None = None) -> Simulation:
    """Decide a past call again, in its own session, under `profile` (default: saved)."""
    session = call.session
    return simulate(
        user=session.agent.owner,
        tool=call.name,
        arguments=call.arguments,
        session=session,
        profile=profile,
    )


# --- Backtest ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    call: ToolCall
    before: Simulation
    after: Simulation


@dataclass(frozen=True)
class Backtest:
    checked: int
    changes: list[Change]


def backtest(*, user: User, proposed: Profile, limit: int = BACKTEST_LIMIT) -> Backtest:
    """The past calls of `user` (newest `limit`) whose decision (allow / ask / deny) would
    change from the saved profile to `proposed`. Both sides are decided now, in each call's
    own session, so only the rule change makes a difference. Writes nothing."""
    calls = (
        ToolCall.objects.filter(session__agent__owner=user, arguments__isnull=False)
        .exclude(status="rejected")
        .select_related("session__agent__owner")
        .order_by("-created_at")[:limit]
    )
    saved = profile_for(user)
    checked, changes = 0, []
    for call in calls:
        if get_tool(call.name) is None:
            continue
        checked += 1
        before, after = simulate_call(call, saved), simulate_call(call, proposed)
        if before.action != after.action:
            changes.append(Change(call, before, after))
    return Backtest(checked, changes)


# --- Session grants ---------------------------------------------------------------------

GLOB = re.compile(r"([*?\[])")


def _command_word(word: str) -> str:
    """A command-pattern word matching exactly `word` (glob characters bracketed)."""
    return shlex.quote(GLOB.sub(r"[\1]", word))


def _path_pattern(path: str) -> str:
    """A gitignore pattern anchored at the workspace root naming exactly `path`."""
    escaped = re.sub(r"([*?\[\\])", r"\\\1", path)
    return escaped if "/" in path and not path.startswith(("!", "#")) else "/" + escaped


def narrow_rule(call: ToolCall) -> str:
    """The narrowest rule that allows `call` again: its exact command or its exact path.

    Raises ServiceError when the call cannot be named that narrowly (no command or single
    path argument, or a rule that would not match the call itself).
    """
    tool = get_tool(call.name)
    args = call.arguments if isinstance(call.arguments, dict) else None
    alone = "Approve it without a session grant."
    if tool is None or args is None:
        raise ServiceError(f"'{call.name}' cannot be granted for the session. {alone}")
    if tool.command_argument:
        argv = args.get(tool.command_argument)
        if not argv or not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
            raise ServiceError(f"This '{call.name}' call has no command to grant. {alone}")
        specifier = " ".join(_command_word(word) for word in argv)
    elif len(tool.path_arguments) == 1 and isinstance(args.get(tool.path_arguments[0]), str):
        path = posixpath.normpath(args[tool.path_arguments[0]])
        if path.startswith(("/", "..", "~")) or path == ".":
            raise ServiceError(f"'{path}' is not a path inside the workspace. {alone}")
        specifier = _path_pattern(path)
    else:
        raise ServiceError(
            f"'{call.name}' takes no command or single path, so no narrow rule fits. {alone}"
        )
    text = f"{call.name}({specifier})"
    ctx = _context(call)
    if rules.validate_rules({"allow": [text]}) or ctx is None or not _allows(text, ctx):
        raise ServiceError(f"No exact rule can name this call ('{text}' does not). {alone}")
    return text


def _allows(text: str, ctx: CallContext) -> bool:
    try:
        return rules.parse_rule(text).matches(ctx, "allow")
    except rules.RuleError:
        return False


def _context(call: ToolCall) -> CallContext | None:
    mode, profile = mode_and_profile(call.session)
    return call_context(call, call.session, mode, profile)


def grant_for_session(*, call: ToolCall, actor: User) -> SessionGrant:
    """Allow calls like `call` for the rest of its session (narrow rule, see narrow_rule).

    Idempotent: an active grant with the same rule in the session is returned as it is.
    Must be called inside the transaction of the approval it comes with, or alone.
    Raises ServiceError when no narrow rule fits.
    """
    rule = narrow_rule(call)
    with transaction.atomic():
        existing = SessionGrant.objects.filter(
            session_id=call.session_id, rule=rule, revoked_at__isnull=True
        ).first()
        if existing is not None:
            return existing
        grant = SessionGrant.objects.create(
            session_id=call.session_id, rule=rule, tool=call.name, call=call, granted_by=actor
        )
        record_event(
            kind="grant.created",
            actor=f"user:{actor.get_username()}",
            subject=f"grant:{grant.pk}",
            session_id=call.session_id,
            payload={
                "grant_id": grant.pk,
                "rule": rule,
                "tool": call.name,
                "call_id": str(call.pk),
                "session_id": str(call.session_id),
            },
        )
    return grant


def revoke_grant(*, grant_id: int, actor: User) -> bool:
    """Revoke a grant; the session's next call no longer sees it. False if already revoked.

    Raises ServiceError when there is no such grant.
    """
    with transaction.atomic():
        grant = SessionGrant.objects.filter(pk=grant_id).first()
        if grant is None:
            raise ServiceError("This grant does not exist.")
        done = SessionGrant.objects.filter(pk=grant_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_by=actor
        )
        if done:
            record_event(
                kind="grant.revoked",
                actor=f"user:{actor.get_username()}",
                subject=f"grant:{grant.pk}",
                session_id=grant.session_id,
                payload={
                    "grant_id": grant.pk,
                    "rule": grant.rule,
                    "session_id": str(grant.session_id),
                },
            )
    return bool(done)
