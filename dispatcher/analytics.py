"""Approval analytics: what reviewers decide, the rules that would spare them, and signs of
rubber stamping.

Read from the calls reviewers decided (`decided_by` "user:<name>", decision allow or
deny): the time to decide is from the call's arrival (when it asked) to its approval
(`queued_at`) or denial (`finished_at`). Each call is reduced to a rule candidate of its
tool (a command's first two words, a path's directory); a candidate always approved at
least MIN_APPROVED times becomes an allow suggestion, one always denied at least
MIN_DENIED times a deny suggestion, each with its backtest. Applying one is an ordinary
profile change (`profiles.update_profile`: versioned and audited). Reads only, except
`apply_suggestion`.

Lives with the lifecycle (not in the policy package) because it reads calls and runs the
backtest; the approvals app is not read, so a decision counts whichever way it was made.
"""

from __future__ import annotations

import posixpath
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Q
from django.utils import timezone

from dispatcher import simulation
from dispatcher.models import ToolCall
from dispatcher.policy import profiles, rules
from dispatcher.policy.context import Profile
from dispatcher.policy.models import PermissionProfile, PolicyLayer
from dispatcher.policy.profiles import profile_for
from dispatcher.policy.shell import SHELLS
from dispatcher.tools.base import Tool
from dispatcher.tools.registry import get_tool
from teams.scope import EVERYTHING, Scope, wholly_within_people

DAYS = 30
MAX_DECISIONS = 5000  # newest reviewer decisions read
MIN_APPROVED = 5
MIN_DENIED = 3
MAX_SUGGESTIONS = 8
BACKTEST_CALLS = 200
FAST_SECONDS = 2.0  # nobody reads a call in less
FAST_SHARE = 0.3  # a reviewer with more than this share of fast decisions is flagged
LONG_STREAK = 20  # approvals in a row without a single denial
# Characters that make a command more than its words: never generalised into a rule.
SHELL_SYNTAX = set(";|&$`<>(){}[]*?!\\'\"\n")
# Programs that run another program or a script: no rule is drawn for them.
RUNS_OTHERS = set(SHELLS) | set(
    [
        "env",
        "sudo",
        "doas",
        "su",
        "xargs",
        "nohup",
        "timeout",
        "nice",
        "time",
        "exec",
        "python",
        "python3",
        "node",
        "perl",
        "ruby",
        "php",
        "deno",
        "bun",
        "npx",
        "uvx",
    ]
)


@dataclass
class Decision:
    owner_id: int
    reviewer: str
    tool: str
    approved: bool
    seconds: float
    at: datetime
    specifier: str | None  # None: no rule can be drawn from this call


@dataclass
class Pattern:
    """One rule candidate of one owner, with what reviewers did with its calls."""

    owner: User
    tool: str
    specifier: str
    approved: int = 0
    denied: int = 0
    seconds: list[float] = field(default_factory=list)

    @property
    def rule(self) -> str:
        return f"{self.tool}({self.specifier})" if self.specifier else self.tool

    @property
    def decisions(self) -> int:
        return self.approved + self.denied

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds) if self.seconds else 0.0


@dataclass
class Suggestion:
    pattern: Pattern
    action: str  # allow | deny
    backtest: simulation.Backtest
    version: int  # the profile version it was computed against

    @property
    def rule(self) -> str:
        return self.pattern.rule


@dataclass
class ReviewerStats:
    reviewer: str
    decisions: int = 0
    approved: int = 0
    fast: int = 0
    longest_streak: int = 0
    seconds: list[float] = field(default_factory=list)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds) if self.seconds else 0.0

    @property
    def reasons(self) -> list[str]:
        """Why the reviewer looks like a rubber stamp (empty: they do not)."""
        out = []
        if self.decisions and self.fast / self.decisions > FAST_SHARE:
            out.append(
                f"{self.fast} of {self.decisions} decisions in under {FAST_SECONDS:g} seconds"
            )
        if self.longest_streak >= LONG_STREAK:
            out.append(f"{self.longest_streak} approvals in a row")
        return out


def candidate_specifier(tool_name: str, arguments: Any) -> str | None:
    """The specifier a rule for calls like this one would have: "" for the whole tool,
    None when no safe rule can be drawn (a command with shell syntax, a missing path)."""
    tool = get_tool(tool_name)
    if tool is None or not isinstance(arguments, dict):
        return None
    if tool.command_argument:
        command = arguments.get(tool.command_argument)
        words = command.split() if isinstance(command, str) else command
        if (
            not isinstance(words, list)
            or not words
            or not all(
                isinstance(w, str) and w and not (SHELL_SYNTAX & set(w)) and not w.isspace()
                for w in words
            )
        ):
            return None
        if any(c.isspace() for w in words for c in w):
            return None
        if posixpath.basename(words[0]) in RUNS_OTHERS:
            return None  # `bash *`, `env *`, `sudo *`: a rule for what they run, never for them
        return " ".join(words) if len(words) <= 2 else " ".join(words[:2]) + " *"
    if tool.path_arguments:
        path = arguments.get(tool.path_arguments[0])
        if not isinstance(path, str) or not path.strip() or "\n" in path:
            return None
        if any(c in path for c in "*?[]!\\"):
            return None
        folder = posixpath.dirname(posixpath.normpath(path.strip()))
        return f"{folder}/**" if folder and folder not in (".", "/") else posixpath.basename(path)
    return ""


def reviewer_decisions(
    since: datetime, limit: int = MAX_DECISIONS, reach: Scope = EVERYTHING
) -> list[Decision]:
    """The newest `limit` calls a person decided since `since` of agents `reach` covers
    (teams.scope), oldest first."""
    rows = (
        reach.filter(ToolCall.objects.all(), "session__team_id")
        .filter(
            created_at__gte=since, decided_by__startswith="user:", decision__in=["allow", "deny"]
        )
        .filter(Q(queued_at__isnull=False) | Q(finished_at__isnull=False))
        .values_list(
            "session__agent__owner_id",
            "decided_by",
            "name",
            "decision",
            "arguments",
            "created_at",
            "queued_at",
            "finished_at",
        )
        .order_by("-created_at")[:limit]
    )
    out = []
    for owner_id, by, name, decision, arguments, created, queued, finished in rows:
        approved = decision == "allow"
        decided = queued if approved and queued else finished
        if decided is None:
            continue
        out.append(
            Decision(
                owner_id=owner_id,
                reviewer=by.removeprefix("user:"),
                tool=name,
                approved=approved,
                seconds=max(0.0, (decided - created).total_seconds()),
                at=decided,
                specifier=candidate_specifier(name, arguments),
            )
        )
    return sorted(out, key=lambda d: d.at)


def patterns(decisions: Iterable[Decision]) -> list[Pattern]:
    """Decisions grouped by owner and rule candidate, most decided first."""
    found: dict[tuple[int, str, str], Pattern] = {}
    decisions = list(decisions)
    owner_ids = {d.owner_id for d in decisions}
    owners = {u.pk: u for u in User.objects.filter(pk__in=owner_ids)}
    for d in decisions:
        if d.specifier is None or d.owner_id not in owners:
            continue
        key = (d.owner_id, d.tool, d.specifier)
        pattern = found.setdefault(key, Pattern(owners[d.owner_id], d.tool, d.specifier))
        if d.approved:
            pattern.approved += 1
        else:
            pattern.denied += 1
        pattern.seconds.append(d.seconds)
    return sorted(found.values(), key=lambda p: (-p.decisions, p.owner.pk, p.rule))


def _with_rule(profile: Profile, action: str, rule: str) -> dict[str, list[Any]]:
    lists = {name: list(getattr(profile, name)) for name in profiles.LISTS}
    lists[action].append(rule)
    return lists


def _already(profile: Profile, rule: str) -> bool:
    """Whether any list of the profile holds `rule` (as a string, or an entry's "rule")."""
    for name in profiles.LISTS:
        for entry in getattr(profile, name):
            text = entry.get("rule") if isinstance(entry, Mapping) else entry
            if text == rule:
                return True
    return False


def suggestions(found: Iterable[Pattern], reach: Scope = EVERYTHING) -> list[Suggestion]:
    """Allow rules for what reviewers always approved, deny rules for what they always
    denied, each valid for its tool, new to its owner, and with its backtest (a rule that
    would change none of the owner's recent calls is not suggested). The backtest reads
    only the calls of agents `reach` covers (a team admin's page shows no other team's).
    Only for owners whose rules the reach manages (teams.scope.wholly_within_people, as
    applying one requires): of anyone else, a team admin would read whether a rule exists
    and the profile's version, and be offered a click that is refused."""
    found = list(found)
    managed = {p.owner.pk for p in found}
    if not reach.everything:  # an organization role manages everyone's: no statement
        people = wholly_within_people(reach, User.objects.filter(pk__in=managed))
        managed = set(people.values_list("pk", flat=True))
    out: list[Suggestion] = []
    for pattern in found:
        if len(out) >= MAX_SUGGESTIONS:
            break
        if pattern.owner.pk not in managed:
            continue
        if pattern.denied == 0 and pattern.approved >= MIN_APPROVED:
            action = "allow"
        elif pattern.approved == 0 and pattern.denied >= MIN_DENIED:
            action = "deny"
        else:
            continue
        if rules.validate_rules({action: [pattern.rule]}):
            continue
        saved = profile_for(pattern.owner)
        if _already(saved, pattern.rule):
            continue
        try:
            proposed = profiles.proposed_profile(
                pattern.owner, saved.mode, **_with_rule(saved, action, pattern.rule)
            )
        except profiles.InvalidProfile:
            continue
        test = simulation.backtest(
            user=pattern.owner, proposed=proposed, limit=BACKTEST_CALLS, reach=reach
        )
        if not test.changes:
            continue  # the mode or a rule decides these already: the rule would change nothing
        out.append(Suggestion(pattern, action, test, saved.version))
    return out


def reviewer_stats(decisions: Iterable[Decision]) -> list[ReviewerStats]:
    """Per reviewer: decisions, approvals, fast decisions, the longest approval streak."""
    stats: dict[str, ReviewerStats] = {}
    streak: dict[str, int] = {}
    for d in decisions:  # oldest first
        s = stats.setdefault(d.reviewer, ReviewerStats(d.reviewer))
        s.decisions += 1
        s.seconds.append(d.seconds)
        if d.seconds < FAST_SECONDS:
            s.fast += 1
        if d.approved:
            s.approved += 1
            streak[d.reviewer] = streak.get(d.reviewer, 0) + 1
            s.longest_streak = max(s.longest_streak, streak[d.reviewer])
        else:
            streak[d.reviewer] = 0
    return sorted(stats.values(), key=lambda s: (-len(s.reasons), -s.decisions, s.reviewer))


def report(
    now: datetime | None = None, days: int = DAYS, reach: Scope = EVERYTHING
) -> dict[str, Any]:
    """The analytics of the calls of agents `reach` covers (a team admin's page: their
    teams' only; the organization's whole traffic by default)."""
    now = now or timezone.now()
    decisions = reviewer_decisions(now - timedelta(days=days), reach=reach)
    found = patterns(decisions)
    return {
        "days": days,
        "decisions": len(decisions),
        "patterns": found,
        "suggestions": suggestions(found, reach),
        "reviewers": reviewer_stats(decisions),
        "log_only": log_only_rules(now - timedelta(days=days), reach=reach),
    }


# --- Log-only rules over live traffic ----------------------------------------------------


@dataclass
class TrialStats:
    """One log-only rule of one layer, and what it would have done to the calls admitted
    since the period began: the calls it would have decided, and how many of those it
    would have decided otherwise than what did (`changed`, by the action that decided)."""

    layer: str  # org | team:<name> | user:<name>
    action: str
    rule: str
    version: int = 0
    matched: int = 0
    changed: dict[str, int] = field(default_factory=dict)
    examples: list[ToolCall] = field(default_factory=list)

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())


def _stored_trials(reach: Scope = EVERYTHING) -> dict[tuple[str, str, str], TrialStats]:
    """Every log-only rule stored now in a layer `reach` reads: the organization's, its
    teams', and the rules of people wholly within it (as the policy page and a person's
    rules page show them: another team's layer and an outsider's rules say what other
    teams' agents run and allow)."""
    found: dict[tuple[str, str, str], TrialStats] = {}
    layers = PolicyLayer.objects.select_related("team")
    people = PermissionProfile.objects.select_related("user")
    if not reach.everything:
        layers = layers.filter(Q(team__isnull=True) | Q(team_id__in=sorted(reach.team_ids)))
        people = people.filter(user__in=wholly_within_people(reach, User.objects.all()))
    for row in layers:
        layer = "org" if row.team is None else f"team:{row.team.name}"
        for trial in profiles.trial_of({n: getattr(row, n) for n in profiles.LISTS}):
            found[(layer, trial.action, trial.rule)] = TrialStats(
                layer, trial.action, trial.rule, row.version
            )
    for saved in people:
        layer = f"user:{saved.user.get_username()}"
        for trial in profiles.trial_of({n: getattr(saved, n) for n in profiles.LISTS}):
            found[(layer, trial.action, trial.rule)] = TrialStats(
                layer, trial.action, trial.rule, saved.version
            )
    return found


def log_only_rules(
    since: datetime, limit: int = MAX_DECISIONS, reach: Scope = EVERYTHING
) -> list[TrialStats]:
    """The log-only rules stored now that `reach` reads, each with what it would have done
    to the calls of agents `reach` covers admitted since `since` (the newest `limit` calls
    that recorded any log-only rule)."""
    found = _stored_trials(reach)
    calls = (
        reach.filter(ToolCall.objects.all(), "session__team_id")
        .filter(created_at__gte=since, provenance__has_key="log_only")
        .order_by("-created_at")
        .only("id", "name", "arguments", "decision", "provenance", "session_id")[:limit]
    )
    for call in calls:
        for entry in call.provenance.get("log_only") or []:
            if not isinstance(entry, Mapping):
                continue
            key = (str(entry.get("layer")), str(entry.get("list")), str(entry.get("rule")))
            stats = found.get(key)
            if stats is None:
                continue  # made active or removed since
            stats.matched += 1
            if entry.get("would") != entry.get("instead_of"):
                was = str(entry.get("instead_of"))
                stats.changed[was] = stats.changed.get(was, 0) + 1
            if len(stats.examples) < 5:
                stats.examples.append(call)
    return sorted(found.values(), key=lambda s: (-s.matched, s.layer, s.rule))


def apply_suggestion(
    *,
    user: User,
    action: str,
    rule: str,
    actor: User,
    expected_version: int,
    tools: Sequence[Tool] | None = None,
) -> PermissionProfile:
    """Add `rule` to `user`'s `action` list: a new profile version, audited as any rule
    change. Raises InvalidProfile (the rule is bad, or the action unknown) and
    StaleProfile (the profile changed since the suggestion was computed)."""
    if action not in ("allow", "deny"):
        raise profiles.InvalidProfile([f"Suggestions add allow or deny rules, not '{action}'."])
    saved = profile_for(user)
    return profiles.update_profile(
        user=user,
        mode=saved.mode,
        actor=actor,
        expected_version=expected_version,
        tools=tools,
        **_with_rule(saved, action, rule),
    )
