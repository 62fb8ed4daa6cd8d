"""Deciding pending calls: exactly one decision per call, bound to the digest the reviewer saw."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, User
from django.db import connection, transaction
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from audit import kinds
from audit.roles import REVIEWER, reach
from audit.services import record_event
from dispatcher import admission, transitions
from dispatcher.admission import context_of
from dispatcher.agents import lock_sign_in, read_sign_in, signed_in_now, token_refusal
from dispatcher.models import Agent, AgentSession, Executor, Status, ToolCall
from dispatcher.policy import grants, stages
from dispatcher.policy.stages import GuardDenial
from dispatcher.proposals import ProposedCall, canonical_json
from dispatcher.tools.write_file import bound_before
from floor import compiled, errors
from floor.compiled import Compiled
from floor.redis_clients import one_round_trip
from teams.models import Membership
from teams.scope import Scope, ask_teams

from . import live, stepup
from .models import ANYONE, ApprovalRequest, Decision, Vote


class DecisionRefused(Exception):
    """The decision was not taken; `status` is the HTTP status a view should answer with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def open_request(*, call: ToolCall, presentation: dict[str, Any]) -> ApprovalRequest:
    """Record the request for a call that just asked. Runs inside the call's transition.

    A quorum (more than one approval, or approvals from a group) comes from the decision
    that asked, recorded in the call's provenance (and its call.approval_requested event).
    """
    approval = ApprovalRequest(
        call=call,
        reason=call.reason,
        asked_by=call.decided_by,
        presentation=presentation,
        digest=call.digest,
        effect_digest=str((presentation.get("preview") or {}).get("digest", "")),
        expires_at=timezone.now() + timedelta(seconds=settings.HARNESS_APPROVAL_TIMEOUT),
        approvals_required=max(1, int(call.provenance.get("approvals", 1))),
        group=str(call.provenance.get("group", "")),
        groups=[
            {"group": str(g["group"]), "count": int(g["count"])}
            for g in call.provenance.get("groups", [])
        ],
        step_up=[str(v) for v in call.provenance.get("step_up", [])],
    )
    stuck = out_of_reach(approval)  # (no statement for an ask that needs one approval)
    if stuck:
        approval.reason = f"{approval.reason} {stuck}"
    compiled.create(approval)  # (one prepared INSERT ... RETURNING: every ask writes one)
    return approval


def decide(
    *,
    approval_id: int,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    feedback: str = "",
    allow_session: bool = False,
    via: str = "queue",
    signed: stepup.Signed | None = None,
    effect_digest: str = "",
) -> ApprovalRequest:
    """Approve or deny one pending call as `user`, who saw arguments with `digest`.

    A previewed command (the request has an `effect_digest`) is approved only with the
    digest of the effect the reviewer saw as `effect_digest` too (409 otherwise, audited
    like an arguments mismatch); a deny needs no effect digest.

    With `allow_session` (approve only), the same transaction also grants the narrowest
    rule naming this call (its exact command or path) for the rest of its session; when no
    such rule exists nothing is decided (400).

    Quorum: when the request needs more than one approval (or approvals from a group), an
    approval is one vote, audited (approval.vote) and bound to `digest`; the vote that
    completes the quorum approves the call. Only votes of people who are, when a vote is
    counted, active, reviewers, in the group and (under separation of duties) none of the
    people behind the agent count: an earlier vote of someone who left, or whom the agent
    was handed to since, is discarded (approval.vote_discarded). A deny from any reviewer ends the call. The
    returned request has `decision` "" while it still waits for votes. `via` records how
    the decision came (queue, link, edit).

    Step-up: when a rule asks a passkey for this verdict, `signed` must hold `user`'s
    assertion over this request, digest, verdict and nonce (approvals.stepup); it is
    verified, kept (SignedVerdict) and carried by the audit event, or the decision is
    refused (400 nothing signed, 403 a signature that does not prove it; audited as
    approval.step_up_refused).

    Exactly one decision per call whatever the races: the approval row is locked (votes
    on one request are serialized by it) and the call moves by a conditional update.
    Raises DecisionRefused: 400 (a session grant asked for a quorum call), 403 (not a
    reviewer; not a reviewer of the agent's team (teams.scope: the reach is read with the
    role, in one statement); under separation of duties, one of the people behind the
    agent (`people_behind`: its owner, sponsor, or the person who started its sessions); not in the
    quorum's group),
    404 (no such request), 409 (already decided, naming by whom; already voted; or a
    digest mismatch, which is audited).
    """
    scope = reach(user, REVIEWER)
    if scope.empty:
        raise DecisionRefused("Only reviewers can decide tool calls.", 403)
    pk = int(approval_id)
    if not -(2**63) <= pk < 2**63:  # no such row (and no 64-bit value to bind)
        raise DecisionRefused("This approval request does not exist.", 404)
    # After the commit the worker's message leaves first, on its own; the wake-up and
    # the queues' pushes that follow it are kept and sent together, one round trip.
    with one_round_trip(settings.REDIS_URL), transaction.atomic():
        # Lock order everywhere: the approval row, then the call (dispatcher locks it).
        approval = _LOCKED_REQUEST.first(pk)
        if approval is None:
            raise DecisionRefused("This approval request does not exist.", 404)
        now = timezone.now()  # the decision's time: checked against the deadline, recorded
        refusal = _outside(approval, scope) or _refusal(approval, user, digest, now)
        if refusal is None and approve and allow_session:
            refusal = _escalated_only(approval, scope)
        if refusal is None and approve:
            refusal = _effect_refusal(approval, user, effect_digest)
        if refusal is None and approve:
            refusal = _vote_refusal(approval, user, allow_session)
        signature: dict[str, Any] | None = None
        if refusal is None:
            signature, refusal = _signature(approval, user, approve, digest, signed)
        if refusal is None:
            _apply(
                approval,
                user,
                approve,
                digest,
                feedback,
                now,
                allow_session and approve,
                via,
                signature,
            )
    # Raised after commit so that the audit event of a digest mismatch is kept.
    if refusal is not None:
        raise refusal
    return approval


def people_behind(agent: Agent) -> dict[Any, str]:
    """The people an agent acts for, who may not approve its calls under separation of
    duties (HARNESS_FORBID_SELF_APPROVAL), by user id, each with what they are: its owner,
    its sponsor, the person whose OAuth consent started its sessions (agentauth's
    AgentClient: every session of an OAuth agent runs on that person's token), and the
    people a bearer token of it was ever shown to (who created it or rotated its token in
    the dashboard: each held a credential that acted as the agent). Reads
    nothing when the caller selected `oauth_client` with the agent (the decision's read
    does)."""
    people: dict[Any, str] = {}
    client = getattr(agent, "oauth_client", None)  # None: not an OAuth agent
    if client is not None:
        people[client.owner_id] = "the person whose sign-in started this agent's sessions"
    for holder in agent.token_holders or ():
        people[holder] = "a person who was shown a token of this agent"
    if agent.sponsor_id is not None:
        people[agent.sponsor_id] = "this agent's sponsor"
    people[agent.owner_id] = "this agent's owner"
    return people


# The request every decision reads and locks, with its call (floor.compiled); on
# PostgreSQL its agent's row held FOR KEY SHARE before it (`_agent_held`).
_LOCKED_REQUEST = Compiled(
    lambda pk: (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("call__session__agent__oauth_client")
        .filter(_agent_held(), pk=pk)
        .order_by()[:1]
    )
)


def _agent_held() -> Q | RawSQL:
    """The decision's read holds the call's agent's row FOR KEY SHARE to its commit, taken
    before the request's own row (a condition on the request's row, checked as it is
    read, before the read locks it), in the statement that locks it: no statement more.
    The release then holds the credential's rows as the worker's claim does
    (transitions._release_approved): every step that kills a credential locks the agent's
    row FOR UPDATE first, and a deactivation then locks the requests its leaver voted on
    (void_votes_of): taken after the request's row, the agent's row would have waited for
    a deactivation that waited for the request (a deadlock). FOR KEY SHARE conflicts with
    FOR UPDATE only: decisions, claims and edits (FOR NO KEY UPDATE) hold it together."""
    if connection.vendor != "postgresql":  # (SQLite: one writer, no row locks)
        return Q()
    q = connection.ops.quote_name

    def col(model: Any, name: str) -> str:
        return q(str(model._meta.get_field(name).column))

    sql = (
        f"EXISTS (SELECT 1 FROM {q(Agent._meta.db_table)} held_a "  # noqa: S608
        f"INNER JOIN {q(AgentSession._meta.db_table)} held_s "
        f"ON held_s.{col(AgentSession, 'agent')} = held_a.{col(Agent, 'id')} "
        f"INNER JOIN {q(ToolCall._meta.db_table)} held_c "
        f"ON held_c.{col(ToolCall, 'session')} = held_s.{col(AgentSession, 'id')} "
        f"WHERE held_c.{col(ToolCall, 'id')} = "
        f"{q(ApprovalRequest._meta.db_table)}.{col(ApprovalRequest, 'call')} "
        "FOR KEY SHARE OF held_a)"
    )
    # (names from the models only: nothing of a request in it)
    return RawSQL(sql, (), output_field=BooleanField())  # noqa: S611


OUTSIDE = (
    "This call is of another team's agent: only that team's reviewers and organization "
    "reviewers can decide it."
)


def _outside(approval: ApprovalRequest, scope: Scope) -> DecisionRefused | None:
    """The refusal for a reviewer whose reach does not cover the call's agent's team,
    before anything of the call is checked or recorded."""
    if scope.covers_any(*ask_teams(approval)):
        return None
    return DecisionRefused(OUTSIDE, 403)


ESCALATED_ONLY = (
    "This call was escalated to your team: approve it on its own. Only the agent's team's "
    "reviewers and organization reviewers can allow it for the rest of its session."
)


def _escalated_only(approval: ApprovalRequest, scope: Scope) -> DecisionRefused | None:
    """Escalation offers the next tier one ask, not the agent's session: a reviewer who
    reaches the call only through its escalation decides it, but grants nothing for the
    session's later calls (which would be decided without ever being offered to them)."""
    if scope.covers(approval.call.session.team_id):
        return None
    return DecisionRefused(ESCALATED_ONLY, 403)


def _refusal(
    approval: ApprovalRequest, user: AbstractBaseUser, digest: str, now: datetime
) -> DecisionRefused | None:
    call = approval.call
    if call.status != Status.PENDING_APPROVAL:
        return DecisionRefused(already_decided(approval), 409)
    if settings.HARNESS_EXPIRY_ACTION == "deny" and now >= approval.expires_at:
        # Past its time but not yet swept by the periodic expiry: expire it now, so that
        # no decision can land after the deadline whatever the scheduler's delay.
        _expire(approval)
        return DecisionRefused(already_decided(approval), 409)
    behind = people_behind(call.session.agent) if settings.HARNESS_FORBID_SELF_APPROVAL else {}
    if user.pk in behind:
        return DecisionRefused(
            f"You are {behind[user.pk]}; another reviewer must decide its calls.", 403
        )
    if digest != call.digest:
        _audit_mismatch(approval, user, digest_seen=digest, digest_logged=approval.call.digest)
        return DecisionRefused(
            "The arguments you reviewed do not match the logged arguments (digest mismatch). "
            "Reload the call and review it again.",
            409,
        )
    return None


def _signature(
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    signed: stepup.Signed | None,
) -> tuple[dict[str, Any] | None, DecisionRefused | None]:
    """The verified step-up record of this verdict (None when no rule asks a passkey for
    it), or the refusal, audited (approval.step_up_refused)."""
    verdict = "approve" if approve else "deny"
    if not approval.needs_key(verdict):
        return None, None
    try:
        with transaction.atomic():  # a refused signature leaves no row behind
            return stepup.check(
                approval=approval, user=user, verdict=verdict, digest=digest, signed=signed
            ), None
    except stepup.StepUpRefused as refused:
        record_event(
            kind=kinds.APPROVAL_STEP_UP_REFUSED,
            actor=f"user:{user.get_username()}",
            subject=f"call:{approval.call_id}",
            session_id=approval.call.session_id,
            payload={"call_id": str(approval.call_id), "verdict": verdict, "reason": str(refused)},
        )
        return None, DecisionRefused(str(refused), refused.status)


def _effect_refusal(
    approval: ApprovalRequest, user: AbstractBaseUser, effect_digest: str
) -> DecisionRefused | None:
    """An approval binds to the previewed effect as well as to the arguments."""
    if not approval.effect_digest or effect_digest == approval.effect_digest:
        return None
    _audit_mismatch(
        approval,
        user,
        effect_digest_seen=effect_digest,
        effect_digest_previewed=approval.effect_digest,
    )
    return DecisionRefused(
        "The effect you reviewed is not the previewed effect of this command (effect digest "
        "mismatch). Reload the call and review what it would do again.",
        409,
    )


def _vote_refusal(
    approval: ApprovalRequest, user: AbstractBaseUser, allow_session: bool
) -> DecisionRefused | None:
    """Why `user`'s approval cannot count towards this request, or None."""
    if allow_session and approval.step_up:
        return DecisionRefused(
            "This call must be signed with a passkey, so it cannot be allowed for the rest "
            "of the session. Approve it on its own.",
            400,
        )
    if not approval.is_quorum:
        return None
    if allow_session:
        return DecisionRefused(
            "This call needs several approvals, so it cannot be allowed for the rest of the "
            "session by one reviewer. Approve it on its own.",
            400,
        )
    if approval.group and not user.groups.filter(name=approval.group).exists():  # type: ignore[attr-defined]
        return DecisionRefused(
            f"This call needs approvals from the group '{approval.group}', and you are not "
            "in it. You can still deny it.",
            403,
        )
    if approval.votes.filter(voter_id=user.pk).exists():
        return DecisionRefused(
            f"You already approved this call ({approval.progress()}); another reviewer "
            "must approve it too.",
            409,
        )
    if approval.groups:
        return _groups_refusal(approval, user)
    return None


def _groups_refusal(approval: ApprovalRequest, user: AbstractBaseUser) -> DecisionRefused | None:
    """A several-groups request: `user`'s vote must fill a place no vote fills yet (one
    vote counts towards one place only): a place of one of their groups, or one any
    eligible reviewer may fill (`approval.anyone`). Votes of people who left are
    discarded first (audited, in this deciding transaction): a place is never held by
    someone who may no longer vote."""
    _discard_departed_votes(approval)
    counts, anyone = approval.counts(), approval.anyone
    mine = set(user.groups.filter(name__in=list(counts)).values_list("name", flat=True))  # type: ignore[attr-defined]
    if not mine and not anyone:
        named = " and ".join(f"{n} of '{g}'" for g, n in counts.items())
        return DecisionRefused(
            f"This call needs approvals from {named}, and you are in none of these groups. "
            "You can still deny it.",
            403,
        )
    memberships = _memberships(approval) | {user.pk: mine}
    before = len(assign(counts, _voters(approval), memberships, anyone))
    if len(assign(counts, [*_voters(approval), user.pk], memberships, anyone)) > before:
        return None
    if not mine:
        return DecisionRefused(
            f"The approvals any reviewer may give are given ({approval.progress()}); the "
            "rest must come from the groups named, and you are in none of them. You can "
            "still deny it.",
            403,
        )
    return DecisionRefused(
        f"Your groups ({', '.join(sorted(mine))}) already have the approvals they need "
        f"({approval.progress()}); the call waits for the others.",
        409,
    )


def who_may_fill(approval: ApprovalRequest, user_ids: list[Any]) -> set[Any]:
    """Of `user_ids` (people who may decide the call: the caller checks reach and
    separation of duties), those whose approval would fill a place still open, less the
    people who voted: everyone for a request that names no group; the group's members for
    a single group; for a
    several-groups request, whoever's vote would count more (a place of one of their
    groups, one anyone may fill, or one a counted voter may move to), less the people who
    voted. Reads only (the notifications route asks by it)."""
    if not approval.group and not approval.groups:
        return set(user_ids) - set(_voters(approval)) if approval.is_quorum else set(user_ids)
    if approval.group:
        members = User.groups.through.objects.filter(
            user_id__in=user_ids, group__name=approval.group
        ).values_list("user_id", flat=True)
        return set(members) - set(_voters(approval))
    counts, anyone = approval.counts(), approval.anyone
    voters, memberships = _voters(approval), _memberships(approval)
    theirs: dict[Any, set[str]] = {pk: set() for pk in user_ids}
    rows = User.groups.through.objects.filter(
        user_id__in=user_ids, group__name__in=list(counts)
    ).values_list("user_id", "group__name")
    for user_id, name in rows:
        theirs[user_id].add(name)
    before = len(assign(counts, voters, memberships, anyone))
    grows: dict[frozenset[str], bool] = {}
    for groups in {frozenset(g) for g in theirs.values()}:
        trial = memberships | {"(candidate)": set(groups)}
        grows[groups] = len(assign(counts, [*voters, "(candidate)"], trial, anyone)) > before
    return {pk for pk, g in theirs.items() if grows[frozenset(g)]} - set(voters)


def deciders(approval: ApprovalRequest) -> Any:
    """Active people who may decide `approval` now: the organization's reviewers
    (superusers hold every role) and the reviewers of the agent's team or of the team it
    escalated to (teams.scope.ask_teams), less the people behind the agent under
    separation of duties (HARNESS_FORBID_SELF_APPROVAL)."""
    teams = [team for team in ask_teams(approval) if team is not None]
    team_reviewers = Membership.objects.filter(team_id__in=teams, role=REVIEWER).values("user_id")
    people = User.objects.filter(is_active=True).filter(
        Q(is_superuser=True) | Q(groups__name=REVIEWER) | Q(pk__in=team_reviewers)
    )
    if settings.HARNESS_FORBID_SELF_APPROVAL:
        people = people.exclude(pk__in=list(people_behind(approval.call.session.agent)))
    return people.distinct()


def out_of_reach(approval: ApprovalRequest) -> str:
    """Why no set of the people who may decide a quorum now (`deciders`) can complete it
    (a sentence), or "" when they can: fewer such people than its approvals, or fewer of
    them in a group than its count. The ask says so (`open_request`), so that it does not
    wait unexplained until it expires (or, with HARNESS_EXPIRY_ACTION keep, for ever)."""
    if not approval.is_quorum:
        return ""
    required = approval.approvals_required
    if approval.groups:
        counts, anyone = approval.counts(), approval.anyone
    elif approval.group:
        counts, anyone = {approval.group: required}, 0
    else:
        counts, anyone = {}, required
    people = list(deciders(approval).values_list("pk", flat=True))
    memberships: dict[Any, set[str]] = {}
    for user_id, name in User.groups.through.objects.filter(
        user_id__in=people, group__name__in=list(counts)
    ).values_list("user_id", "group__name"):
        memberships.setdefault(user_id, set()).add(name)
    # The groups' members and as many others as places: enough for a maximum matching.
    others = [pk for pk in people if pk not in memberships][:required]
    if len(assign(counts, [*memberships, *others], memberships, anyone)) >= required:
        return ""
    short = [
        f"the group '{group}' has {have} (it needs {count})"
        for group, count in counts.items()
        if (have := sum(group in theirs for theirs in memberships.values())) < count
    ]
    who = f"{len(people)} reviewer{'s' if len(people) != 1 else ''} may decide it"
    return (
        f"No one can approve it as things stand: {who}"
        + (f", and of them {' and '.join(short)}" if short else "")
        + f", too few for the {required} distinct approvals it needs. It waits until more "
        "reviewers (or group members) can decide it; any reviewer can deny it."
    )


def _voters(approval: ApprovalRequest) -> list[Any]:
    return [v.voter_id for v in approval.votes.order_by("created_at", "pk")]


def _memberships(approval: ApprovalRequest) -> dict[Any, set[str]]:
    """{voter id: the request's groups they are in} for its voters (one statement)."""
    rows = User.groups.through.objects.filter(
        user_id__in=approval.votes.values("voter_id"), group__name__in=list(approval.counts())
    ).values_list("user_id", "group__name")
    out: dict[Any, set[str]] = {}
    for user_id, name in rows:
        out.setdefault(user_id, set()).add(name)
    return out


def assign(
    counts: dict[str, int],
    voters: list[Any],
    memberships: dict[Any, set[str]],
    anyone: int = 0,
) -> dict[Any, str]:
    """{voter: group, or ANYONE} counting as many votes as possible, each in one place: a
    place of one of their groups with a count left, or one of the `anyone` places every
    voter may fill (a maximum bipartite matching of voters to places, by augmenting paths;
    earlier voters first, and a group's place tried before an anyone place, so an
    assignment moves only when it must). `voters` are only people whose vote may count
    (the caller discards the others first): each may fill an anyone place."""
    places = [(group, i) for group, count in counts.items() for i in range(count)]
    places += [(ANYONE, i) for i in range(anyone)]
    holder: dict[tuple[str, int], Any] = {}

    def fits(voter: Any, spot: tuple[str, int]) -> bool:
        return spot[0] == ANYONE or spot[0] in memberships.get(voter, set())

    def place(voter: Any, seen: set[tuple[str, int]]) -> bool:
        for spot in places:
            if not fits(voter, spot) or spot in seen:
                continue
            seen.add(spot)
            if spot not in holder or place(holder[spot], seen):
                holder[spot] = voter
                return True
        return False

    for voter in dict.fromkeys(voters):  # (one voter, one place, however often named)
        place(voter, set())
    return {voter: spot[0] for spot, voter in holder.items()}


def _vote(
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    feedback: str,
    via: str,
    actor: str,
    extra: dict[str, Any],
) -> bool:
    """A quorum's vote: an approval is recorded (votes of people who left are discarded
    first) and the count joins `extra`. True when the quorum is still short (the vote is
    audited and the call waits); False when the decision goes ahead (a denial, or the last
    approval needed)."""
    if approve:
        Vote.objects.create(
            approval=approval,
            voter=user,  # type: ignore[misc]
            digest_seen=digest,
            comment=feedback,
            via=via,
        )
        _discard_departed_votes(approval)
    voters = approval.approvers()
    extra |= {"approvals": voters, "required": approval.approvals_required}
    short = len(voters) < approval.approvals_required
    if approval.groups:
        short = _count_groups(approval, extra)
    if approve and short:
        _record_vote(approval, actor, extra)
        return True
    return False


def _count_groups(approval: ApprovalRequest, extra: dict[str, Any]) -> bool:
    """Assign each counted vote of a several-groups request to one place (Vote.group: a
    group, or ANYONE; kept for the queue's progress), add the progress per group (and of
    the places anyone may fill) to `extra`; True while a place is not filled."""
    counts, anyone = approval.counts(), approval.anyone
    votes = list(approval.votes.select_related("voter").order_by("created_at", "pk"))
    chosen = assign(counts, [v.voter_id for v in votes], _memberships(approval), anyone)
    for vote in votes:
        if vote.group != chosen.get(vote.voter_id, ""):
            vote.group = chosen.get(vote.voter_id, "")
            vote.save(update_fields=["group"])
    extra["groups"] = [
        {"group": group, "count": count, "approvals": names}
        for group, count, names in approval.group_progress()
    ]
    if anyone:
        extra["anyone"] = {"count": anyone, "approvals": approval.anyone_progress()}
        extra["approvals"] = [v.voter.get_username() for v in votes if v.voter_id in chosen]
    return len(chosen) < sum(counts.values()) + anyone


def _apply(
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    feedback: str,
    now: datetime,
    allow_session: bool = False,
    via: str = "queue",
    signature: dict[str, Any] | None = None,
) -> None:
    call = approval.call
    actor = f"user:{user.get_username()}"
    extra: dict[str, Any] = {
        "reviewer": user.get_username(),
        "digest_seen": digest,
        "feedback": feedback,
        "decision_seconds": round((now - approval.created_at).total_seconds(), 3),
    }
    if via != "queue":
        extra["via"] = via
    if signature is not None:
        extra["step_up_signature"] = signature
    if approval.is_quorum and _vote(approval, user, approve, digest, feedback, via, actor, extra):
        return  # one vote of a quorum: the call still waits
    refused = _release_denial(call) if approve else None
    if refused is not None:
        allow_session = False  # (a call that does not run grants nothing)
    if allow_session:
        try:
            extra["session_grant"] = grants.narrow_rule(context_of(call))
        except errors.ServiceError as problem:
            raise DecisionRefused(str(problem), 400) from None
    if refused is not None:
        done = transitions.deny_at_release(call=call, denial=refused, extra=extra)
    elif approve:
        done = transitions.approve_call(
            call_id=call.pk, actor=actor, reason=feedback, extra=extra, call=call
        )
    else:
        done = transitions.deny_call(
            call_id=call.pk,
            actor=actor,
            reviewer=user.get_username(),
            feedback=feedback,
            extra=extra,
            call=call,
        )
    if not done:
        # The call moved first (the agent cancelled it, or another decision won the
        # conditional update): nothing here is recorded; the transaction rolls back.
        raise DecisionRefused(already_decided(approval), 409)
    if allow_session and call.status != Status.DENIED:
        # (denied at the release: its credential died after the read above, and a call
        # that does not run grants nothing: transitions._release_approved)
        approval.grant = grants.grant_for_session(ctx=context_of(call), actor=user)  # type: ignore[arg-type,attr-defined]
    approval.decision = Decision.APPROVED if approve else Decision.DENIED
    approval.decided_by = user  # type: ignore[assignment]
    approval.decided_at = now
    approval.feedback = feedback
    approval.digest_seen = digest
    compiled.save_fields(
        approval, ["decision", "decided_by", "decided_at", "feedback", "digest_seen"]
    )


def _release_denial(call: ToolCall) -> GuardDenial | None:
    """Why an approval must deny `call` instead, or None. Any call sent with an agent
    token voided or rotated (replaced) since (`token_refusal`, the agent row read now): a
    call its client runs would be released to that client, which may be the old token's
    holder, and a session grant asked with the approval would outlive the call the worker
    then denies (the agent row is the one read with the approval's lock: no statement
    more; for a client's signed-in agent, read again once a sign-out committing now has
    committed: agents.signed_in_now, two statements). For a call its client runs (decide-only), also what the guards say now:
    approving it releases it to the client at once, and no worker re-runs them before it
    runs, as it does for every other call (an agent revoked, a mode locked, while the call
    waited). None for a call the guards let through."""
    signed_in_now(call.session.agent)  # (a sign-out committing now: waited for)
    if refused := token_refusal(call, call.session.agent):
        return refused
    if call.executor != Executor.CLIENT:
        return None
    try:
        ctx = context_of(call)
    except errors.ServiceError:
        return GuardDenial((("registry", "The tool is no longer registered."),))
    return stages.guards(ctx)


def _departure(approval: ApprovalRequest, voter: User) -> str:
    """Why `voter`'s earlier vote no longer counts ("" when it still does)."""
    if not voter.is_active:
        return "their account was deactivated"
    if settings.HARNESS_FORBID_SELF_APPROVAL:
        # Separation of duties binds every vote counted, not only the one cast last: a
        # voter the agent was handed to, or who became its sponsor, since their vote.
        behind = people_behind(approval.call.session.agent)
        if voter.pk in behind:
            return f"they are now {behind[voter.pk]}"
    if not reach(voter, REVIEWER).covers_any(*ask_teams(approval)):
        return "they are no longer a reviewer of the agent's team"
    if approval.group and not voter.groups.filter(name=approval.group).exists():
        return f"they are no longer in the group '{approval.group}'"
    if (
        approval.groups
        and not approval.anyone  # (anyone may fill those places: the recount places them)
        and not voter.groups.filter(name__in=list(approval.counts())).exists()
    ):
        return f"they are no longer in any of the groups {', '.join(approval.counts())}"
    return ""


def _discard_departed_votes(approval: ApprovalRequest) -> None:
    """A quorum counts only votes of people who are, when it is counted, active,
    reviewers, in its group and (under separation of duties) none of the people behind
    the agent: each other vote is deleted and audited
    (approval.vote_discarded), in the deciding transaction (the request row is locked)."""
    for vote in approval.votes.select_related("voter").order_by("created_at", "pk"):
        reason = _departure(approval, vote.voter)
        if not reason:
            continue
        name = vote.voter.get_username()
        vote.delete()
        record_event(
            kind=kinds.APPROVAL_VOTE_DISCARDED,
            actor="harness",
            subject=f"call:{approval.call_id}",
            session_id=approval.call.session_id,
            payload={
                "call_id": str(approval.call_id),
                "reviewer": name,
                "reason": reason,
                "digest_seen": vote.digest_seen,
                "voted_at": vote.created_at.isoformat(),
                "via": vote.via,
                "group": approval.group,
            },
        )


def void_votes_of(*, user: User, actor: str, sponsor: User | None = None) -> dict[str, Any]:
    """A deactivation step (settings.HARNESS_DEACTIVATION_STEPS, inside audit.roles.
    deactivate's transaction): every vote `user` gave to a call still pending is deleted
    and audited (approval.vote_discarded), its request row locked as a decision locks it.
    The call waits for the votes it still lacks."""
    pending = ApprovalRequest.objects.select_for_update().filter(
        votes__voter=user, call__status=Status.PENDING_APPROVAL
    )
    voided: list[str] = []
    for approval in pending.select_related("call").order_by("pk"):
        vote = approval.votes.filter(voter=user).first()
        if vote is None:
            continue
        vote.delete()
        record_event(
            kind=kinds.APPROVAL_VOTE_DISCARDED,
            actor=actor,
            subject=f"call:{approval.call_id}",
            session_id=approval.call.session_id,
            payload={
                "call_id": str(approval.call_id),
                "reviewer": user.get_username(),
                "reason": "their account was deactivated",
                "digest_seen": vote.digest_seen,
                "voted_at": vote.created_at.isoformat(),
                "via": vote.via,
                "group": approval.group,
            },
        )
        voided.append(str(approval.call_id))
    return {"votes_voided": voided}


def _record_vote(approval: ApprovalRequest, actor: str, extra: dict[str, Any]) -> None:
    """A vote that does not complete the quorum: audited, and shown live in every queue."""
    record_event(
        kind=kinds.APPROVAL_VOTE,
        actor=actor,
        subject=f"call:{approval.call_id}",
        session_id=approval.call.session_id,
        payload={"call_id": str(approval.call_id), "group": approval.group, **extra},
    )
    approval_id = approval.pk
    transaction.on_commit(lambda: live.push_progress(approval_id))


# --- Edits: a reviewer changes the arguments instead of approving them ---------------


@dataclass(frozen=True)
class Edit:
    """What an edit did: the original's request (now edited) and the new call, with its
    request when it still asks (`replacement_approval`, None when it was allowed)."""

    approval: ApprovalRequest
    replacement: ToolCall
    replacement_approval: ApprovalRequest | None


class _EditRefused(Exception):
    pass


def edit(
    *,
    approval_id: int,
    user: AbstractBaseUser,
    digest: str,
    arguments: Any,
    comment: str = "",
) -> Edit:
    """Replace a pending call by a new call with `arguments`, as `user`, who saw `digest`.

    The original ends `edited` (its content tells the model what runs instead); the new
    call, with its own digest, `edited_from` the original and the tool_use_id
    `<original>#editN`, passes validation, rules, mode and guards again in the
    original's place in its batch. When it still asks, this edit is `user`'s approval of
    it (a quorum still needs the others). When policy denies, rejects or cancels it, the
    edit is refused with that reason and nothing changes (the original stays pending);
    the refusal is audited (approval.edit_refused).

    Raises DecisionRefused: 400 (not a JSON object, unchanged, a tool the client runs, or
    refused by policy), 403, 404, 409 as `decide`.
    """
    scope = reach(user, REVIEWER)
    if scope.empty:
        raise DecisionRefused("Only reviewers can edit tool calls.", 403)
    if not isinstance(arguments, dict):
        raise DecisionRefused("The edited arguments must be a JSON object.", 400)
    with transaction.atomic():
        # Lock order everywhere: the agent's row FOR KEY SHARE and the approval row, in one
        # statement (as `decide`: the release of the call the edit approves holds the
        # agent's row, and taken there, after the call's row, an edit of a bearer agent's
        # call and a move, void or revocation of the agent, which locks the agent's row and
        # then its waiting calls, each held what the other waited for: a deadlock, the
        # edit a 500); then, for a signed-in agent, the agent's row again (FOR NO KEY
        # UPDATE) and its client link (as a sign-out), then the call and its chain.
        approval = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("call__session__agent__owner", "call__session__agent__oauth_client")
            .filter(_agent_held(), pk=approval_id)
            .first()
        )
        if approval is None:
            raise DecisionRefused("This approval request does not exist.", 404)
        _lock_as_a_sign_out(approval)
        now = timezone.now()
        refusal = (
            _outside(approval, scope)
            or _refusal(approval, user, digest, now)
            or _edit_refusal(approval, arguments)
        )
        outcome = None
        if refusal is None:
            try:
                with transaction.atomic():  # a refused edit leaves nothing behind
                    outcome = _replace(approval, user, arguments, comment, now)
            except _EditRefused as refused:
                refusal = DecisionRefused(str(refused), 400)
                _audit_edit_refused(approval, user, arguments, str(refused))
    if refusal is not None:
        raise refusal
    assert outcome is not None
    return outcome


def _lock_as_a_sign_out(approval: ApprovalRequest) -> None:
    """For an edit of a call of a client's signed-in agent, once the approval's row is
    locked: lock the agent's row (reading its sign-in again: agents.read_sign_in), then
    its client link (agents.lock_sign_in), in the order a sign-out takes them before the
    calls' rows and audit chains. The edit
    writes the call's row and chain (and admits its replacement) before its release locks
    the link (agents.signed_in_now): taken then, an edit and a sign-out each held what the
    other waited for (a deadlock, the edit a 500). Taken before the approval's row, an
    edit and an approval of the same call did (the approval locks the row, then the link).
    Two statements more for such an edit, none for any other (the agent and its link are
    read with the approval). What the approval's read showed may be older than a
    sign-out that committed while the edit waited here: a call it cancelled, the edit's
    conditional update of the call finds decided (409); the agent's sign-in is read
    again with its lock, so a call it did not cancel (written after its sweep, sent with
    the sign-in it ended) is refused by the edit's token check (409), not edited and its
    replacement admitted under the sign-in read before."""
    agent = approval.call.session.agent
    if getattr(agent, "oauth_client", None) is None:  # (selected with the approval)
        return
    read_sign_in(agent, lock_row=True)
    lock_sign_in(agent)


def _edit_refusal(approval: ApprovalRequest, arguments: dict[str, Any]) -> DecisionRefused | None:
    call = approval.call
    if call.executor == Executor.CLIENT:
        return DecisionRefused(
            "This call's tool runs on the client, which runs only the arguments it sent: "
            "deny it with feedback instead, and the agent can call again.",
            400,
        )
    if approval.needs_key("deny"):
        # An edit ends the call unrun, as a denial does; a rule asks that to be signed.
        return DecisionRefused(
            "Denying this call must be signed with your passkey, and an edit ends it as a "
            "denial does: deny it (signed) with feedback for the agent instead, and the "
            "agent can call again.",
            400,
        )
    if canonical_json(arguments) == canonical_json(call.arguments):
        return DecisionRefused("The arguments are unchanged: approve the call instead.", 400)
    if refused := token_refusal(call, call.session.agent):
        # The replacement would be admitted under the agent's token as it is now, and run
        # although the token that sent the original may have leaked (or its holder left).
        return DecisionRefused(
            f"{' '.join(refused.reasons)} It cannot be edited either: deny it.", 409
        )
    return None


def _edit_id(call: ToolCall) -> str:
    """The replacement's tool_use_id: `<original>#editN`, the first N free in the session."""
    root = call.tool_use_id[:180]
    taken = set(
        ToolCall.objects.filter(
            session_id=call.session_id, tool_use_id__startswith=f"{root}#edit"
        ).values_list("tool_use_id", flat=True)
    )
    n = 1
    while f"{root}#edit{n}" in taken:
        n += 1
    return f"{root}#edit{n}"


def _replace(
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    arguments: dict[str, Any],
    comment: str,
    now: datetime,
) -> Edit:
    call, reviewer = approval.call, user.get_username()
    tool_use_id, text = _edit_id(call), canonical_json(arguments)
    extra = {"reviewer": reviewer, "digest_seen": call.digest, "comment": comment}
    if not transitions.edit_call(
        call_id=call.pk,
        actor=f"user:{reviewer}",
        reviewer=reviewer,
        replacement=tool_use_id,
        arguments_json=text,
        extra=extra,
        call=call,
    ):
        raise DecisionRefused(already_decided(approval), 409)
    proposed = ProposedCall(tool_use_id, call.name, text, arguments, edited_from=call.pk)
    [new] = admission.submit_calls(
        session=call.session,
        dialect=call.dialect,
        proposed=[proposed],
        place=(call.batch_id, call.batch_index),
    )
    if new.edited_from_id != call.pk:  # the agent used that tool_use_id meanwhile
        raise _EditRefused("The new call's id was taken; reload and edit again.")
    if new.status in (Status.DENIED, Status.REJECTED, Status.CANCELLED):
        raise _EditRefused(f"The edited call would not be allowed: {new.reason}")
    approval.decision, approval.decided_at = Decision.EDITED, now
    approval.decided_by = user  # type: ignore[assignment]
    approval.feedback, approval.digest_seen = comment, call.digest
    compiled.save_fields(
        approval, ["decision", "decided_by", "decided_at", "feedback", "digest_seen"]
    )
    replacement_approval = None
    if new.status == Status.PENDING_APPROVAL:
        replacement_approval = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("call__session__agent")
            .get(call=new)
        )
        if approval.escalated_at is not None:
            # The edit continues an escalated ask: the next tier it was offered to (whose
            # reviewer may have written this edit) still sees and decides it, and it is
            # not escalated again (teams.scope.ASK_TEAMS).
            replacement_approval.escalated_at = approval.escalated_at
            replacement_approval.escalated_to_id = approval.escalated_to_id
            compiled.save_fields(replacement_approval, ["escalated_at", "escalated_to"])
        # A previewed command's effect was not seen yet: it asks the editor again; so
        # does a diff made against a file other than the one the editor was shown
        # (write_file's binding: the file changed since the ask, or the edit names
        # another file), a call of a tool other than the one shown (an upstream tool's
        # definition accepted, or its server registered again, meanwhile), and a command
        # that would start in a directory other than the one the editor was shown
        # (run_command's `cwd`), and a file that is git metadata (a hook) now and was not
        # shown as such (`git_metadata`: a link made meanwhile turned its path into one).
        if (
            not replacement_approval.effect_digest
            and _same_file_shown(approval, replacement_approval)
            and _same_git_warning(approval, replacement_approval)
            and _same_binding(call, new)
            and _same_cwd_shown(approval, replacement_approval)
            and _vote_refusal(replacement_approval, user, False) is None
            and not replacement_approval.needs_key("approve")
        ):
            # The edit is the editor's approval of what they wrote (unless a passkey must
            # sign it: the editor then approves the new call from the queue, signing it).
            _apply(replacement_approval, user, True, new.digest, comment, now, via="edit")
    return Edit(approval, new, replacement_approval)


def _same_binding(call: ToolCall, replacement: ToolCall) -> bool:
    """Whether the replacement is a call of the tool as the editor was shown it: its
    binding (`Tool.binding`: an upstream tool's server registration and accepted
    definition) is the original's. The replacement is admitted under the tool as it is
    now: an admin may have accepted another definition of it, or registered its server
    again, while the original waited (the worker would run it under that binding)."""
    return (call.provenance or {}).get("binding") == (replacement.provenance or {}).get("binding")


def _same_cwd_shown(approval: ApprovalRequest, replacement: ApprovalRequest) -> bool:
    """Whether the replacement starts in the directory the editor was shown (run_command's
    presentation binds it: `cwd`, `cwd_identity`), or binds none. Made at the edit, its
    presentation resolved `cwd` again: a link turned after the ask (`sub -> dirA` to
    `dirB`) had the editor, shown `dirA`, approve with an edit of the argv alone a
    command that ran in `dirB`."""
    shown = approval.presentation if isinstance(approval.presentation, dict) else {}
    now = replacement.presentation if isinstance(replacement.presentation, dict) else {}
    if "cwd_identity" not in now:
        return True
    return (shown.get("cwd"), shown.get("cwd_identity")) == (now.get("cwd"), now["cwd_identity"])


def _same_git_warning(approval: ApprovalRequest, replacement: ApprovalRequest) -> bool:
    """Whether the editor was shown what the replacement's page shows of git metadata
    (write_file's and delete_file's `git_metadata`: the path is a hook or the git
    directory's): approving an edit the worker then runs as approved "knowing it"
    (`changed_since`) needs the warning to have been on the page the editor read."""
    shown = (approval.presentation or {}).get("git_metadata")
    return bool(shown == (replacement.presentation or {}).get("git_metadata"))


def _same_file_shown(approval: ApprovalRequest, replacement: ApprovalRequest) -> bool:
    """Whether the replacement overwrites nothing the editor was not shown: its diff
    (Tool.changed_since's `sha256_before`) is made against no file, or against the file,
    at the same path and with the same content, the editor's diff was made against."""
    shown = approval.presentation if isinstance(approval.presentation, dict) else {}
    now = replacement.presentation if isinstance(replacement.presentation, dict) else {}
    if bound_before(now) == (None, None):  # nothing there to lose (the worker still checks)
        return True
    return bound_before(shown) == bound_before(now) and shown.get("path") == now.get("path")


def _audit_edit_refused(
    approval: ApprovalRequest, user: AbstractBaseUser, arguments: dict[str, Any], reason: str
) -> None:
    record_event(
        kind=kinds.APPROVAL_EDIT_REFUSED,
        actor=f"user:{user.get_username()}",
        subject=f"call:{approval.call_id}",
        session_id=approval.call.session_id,
        payload={
            "call_id": str(approval.call_id),
            "arguments": canonical_json(arguments),
            "reason": reason,
        },
    )


def already_decided(approval: ApprovalRequest) -> str:
    call = approval.call
    call.refresh_from_db()
    who = call.decided_by.removeprefix("user:") or "the system"
    return f"Already decided by {who}: the call is {call.status.replace('_', ' ')}."


def _audit_mismatch(approval: ApprovalRequest, user: AbstractBaseUser, **seen: str) -> None:
    """approval.digest_mismatch: what the reviewer saw against what was logged (the
    arguments' digest, or the previewed effect's)."""
    record_event(
        kind=kinds.APPROVAL_DIGEST_MISMATCH,
        actor=f"user:{user.get_username()}",
        subject=f"call:{approval.call_id}",
        session_id=approval.call.session_id,
        payload={"call_id": str(approval.call_id), **seen},
    )


def escalate_due(now: datetime | None = None) -> list[int]:
    """Offer every pending ask that no one decided within its agent's team's escalation
    delay (teams.Team.escalation_after) to the next tier as well (Team.escalate_to, or the
    organization's reviewers): recorded on the request (which puts it within that team's
    reach, teams.scope.ASK_TEAMS), audited (approval.escalated), pushed to the next
    tier's queues after commit. Once per ask; an ask already past its expiry is left to
    the expiry. `now`: the clock (tests pass theirs). Returns the escalated requests' ids
    (approvals.asks.escalate_due tells their next tiers through the channels)."""
    now = now or timezone.now()
    candidates = (
        ApprovalRequest.objects.pending()
        .filter(escalated_at__isnull=True, expires_at__gt=now)
        .filter(call__session__team__escalation_after__isnull=False)
        .values_list("pk", "created_at", "call__session__team__escalation_after")
    )
    escalated: list[int] = []
    for approval_id, created_at, after in list(candidates):
        if after is None or created_at + timedelta(seconds=after) > now:
            continue
        with transaction.atomic():
            approval = (
                ApprovalRequest.objects.select_for_update(of=("self",))
                .select_related("call__session__agent", "call__session__team__escalate_to")
                .filter(pk=approval_id, escalated_at__isnull=True)
                .first()
            )
            if approval is None or approval.call.status != Status.PENDING_APPROVAL:
                continue  # decided or escalated meanwhile
            _escalate(approval, now)
        escalated.append(approval_id)
    return escalated


def _escalate(approval: ApprovalRequest, now: datetime) -> None:
    team = approval.call.session.team
    to = team.escalate_to
    approval.escalated_at, approval.escalated_to = now, to
    compiled.save_fields(approval, ["escalated_at", "escalated_to"])
    record_event(
        kind=kinds.APPROVAL_ESCALATED,
        actor="harness",
        subject=f"call:{approval.call_id}",
        session_id=approval.call.session_id,
        payload={
            "call_id": str(approval.call_id),
            "team": team.name,
            "after_seconds": team.escalation_after,
            "to": to.name if to is not None else "organization reviewers",
            "waited_seconds": round((now - approval.created_at).total_seconds(), 3),
        },
    )
    approval_id = approval.pk
    transaction.on_commit(lambda: live.push_escalation(approval_id))


def expire_due() -> int:
    """Close every approval past its expiry, per HARNESS_EXPIRY_ACTION ('deny' or 'keep')."""
    if settings.HARNESS_EXPIRY_ACTION == "keep":
        return 0
    expired = 0
    for approval_id in ApprovalRequest.objects.due(timezone.now()).values_list("pk", flat=True):
        with transaction.atomic():
            approval = (
                ApprovalRequest.objects.select_for_update(of=("self",))
                .select_related("call")
                .get(pk=approval_id)
            )
            expired += _expire(approval)
    return expired


def _expire(approval: ApprovalRequest) -> bool:
    """Expire one pending approval (its row is locked by the caller)."""
    minutes = settings.HARNESS_APPROVAL_TIMEOUT / 60
    if not transitions.expire_call(call_id=approval.call_id, minutes=minutes):
        return False
    approval.decision, approval.decided_at = Decision.EXPIRED, timezone.now()
    approval.save(update_fields=["decision", "decided_at"])
    return True


def record_cancel(*, call_id: str) -> None:
    """The agent cancelled its pending call: close its request (after the call's commit)."""
    ApprovalRequest.objects.filter(call_id=UUID(call_id), decision="").update(
        decision=Decision.CANCELLED, decided_at=timezone.now()
    )
