"""Agents, their tokens, and sessions: every change with its audit event.

Tokens are stored hashed (SHA-256) with a visible prefix; a token is shown once, when it
is made. A session's mode may only narrow its owner's; its workspace is never the agent's
choice.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import current_app
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from audit import kinds
from audit.roles import ADMIN
from audit.services import record_event
from dispatcher import limits, transitions
from dispatcher.models import SIGNED_OUT_PREFIX, Agent, AgentSession, Status, ToolCall
from dispatcher.policy import layers
from dispatcher.policy.context import Profile
from dispatcher.policy.models import Mode, PermissionProfile, SessionGrant, narrower_mode
from dispatcher.policy.profiles import default_profile, profile_for
from dispatcher.policy.stages import GuardDenial
from dispatcher.tools import messages, sandbox
from floor.compiled import Compiled
from floor.errors import ServiceError
from teams.models import Membership, Team
from teams.scope import org_holds

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "hrn"


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _new_token() -> tuple[str, str]:
    """A fresh token and its visible prefix."""
    prefix = secrets.token_hex(4)
    return f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}", prefix


@transaction.atomic
def create_agent(
    *,
    owner: User,
    name: str,
    workspace: str = "",
    actor: str,
    team: Team | None = None,
    sponsor: User | None = None,
    shown_to: User | None = None,
) -> tuple[Agent, str]:
    """Create an agent of `team` (the default team when none is named) and return it with
    its token. The token is never stored or shown again. `shown_to`: the person who is
    shown it (the dashboard's user), who can act as the agent from then on."""
    if workspace:
        path = Path(workspace).expanduser().resolve()
        reason = sandbox.exposed_state(path)
        if reason is not None:  # refused before anything is made there
            raise ServiceError(
                f"The workspace {path} {reason}, so it cannot be an agent's workspace. "
                "Choose a directory of its own (a project directory), or none: each session "
                "then gets a fresh one."
            )
        path.mkdir(parents=True, exist_ok=True)
        workspace = str(path)
    team = team or Team.objects.default()
    _lock_active(shown_to, team.pk)
    token, prefix = _new_token()
    agent = Agent.objects.create(
        owner=owner,
        team=team,
        sponsor=sponsor,
        name=name,
        token_prefix=prefix,
        token_hash=_hash_token(token),
        token_holders=[shown_to.pk] if shown_to is not None else [],
        workspace=workspace,
    )
    PermissionProfile.objects.get_or_create(user=owner, defaults=default_profile())
    record_event(
        kind=kinds.AGENT_CREATED,
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={
            "name": name,
            "owner": owner.get_username(),
            "team": team.name,
            "sponsor": sponsor.get_username() if sponsor else None,
            "token_prefix": prefix,
            "workspace": workspace,
        },
    )
    return agent, token


@transaction.atomic
def transfer_agent(
    *,
    agent: Agent,
    actor: str,
    owner: User | None = None,
    team: Team | None = None,
    sponsor: User | None = None,
    clear_sponsor: bool = False,
) -> bool:
    """Change who owns `agent`, which team it works for, or who sponsors it; False (and no
    event) when nothing changes. The event names the before and after of each. Moved to
    another team, its bearer token is voided when someone it was shown to does not reach
    that team (`_holders_outside`), as their leaving the team would void it. An agent a
    client signed in for (OAuth consent, `harness-hook login`) is that person's in that
    team: its owner and team never change (ServiceError; revoke it and sign in again).

    Its sessions stay with the team they were started under (AgentSession.team), with
    their calls: moved to another team, they are left for good (AgentSession.left_at), its
    calls still waiting in them are cancelled or denied (`_close_former_team_calls`) and
    its next call starts a session of its new team."""
    moving = (owner is not None and owner != agent.owner) or (
        team is not None and team != agent.team
    )
    if moving and Agent.objects.filter(pk=agent.pk, oauth_client__isnull=False).exists():
        raise ServiceError(
            f"Agent {agent.name!r} was signed in by its owner for its team: it cannot change "
            "owner or team. Revoke it; the new owner signs in for the team they choose."
        )
    before = {
        "owner": agent.owner.get_username(),
        "team": agent.team.name,
        "sponsor": agent.sponsor.get_username() if agent.sponsor else None,
    }
    if owner is not None:
        agent.owner = owner
        PermissionProfile.objects.get_or_create(user=owner, defaults=default_profile())
    if team is not None:
        agent.team = team
    if sponsor is not None:
        agent.sponsor = sponsor
    elif clear_sponsor:
        agent.sponsor = None
    after = {
        "owner": agent.owner.get_username(),
        "team": agent.team.name,
        "sponsor": agent.sponsor.get_username() if agent.sponsor else None,
    }
    if after == before:
        return False
    if after["team"] != before["team"]:  # (FOR UPDATE: a claim in flight, live_credential_sql)
        Agent.objects.select_for_update(of=("self",)).filter(pk=agent.pk).exists()
    agent.save(update_fields=["owner", "team", "sponsor"])
    record_event(
        kind=kinds.AGENT_TRANSFERRED,
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={"name": agent.name, "before": before, "after": after},
    )
    outside = _holders_outside(agent, agent.team) if after["team"] != before["team"] else None
    if outside is not None:  # its token voided as their leaving the team would void it
        _void_held_by(
            user=outside,
            actor=actor,
            agents=Agent.objects.filter(pk=agent.pk),
            reason=(
                f"{outside.get_username()}, who was shown this token, is not in the team "
                f"{agent.team.name} the agent moved to"
            ),
        )
    if after["team"] != before["team"]:  # (after the void: its reason says more)
        _close_former_team_calls(agent, actor, str(before["team"]), agent.team.name)
    return True


def _close_former_team_calls(agent: Agent, actor: str, former: str, team: str) -> None:
    """An agent moved to another team leaves its sessions with the team they were started
    under (AgentSession.team): that team's auditors keep reading them, the new team's never
    do, and no later call joins them, even once the agent is back in that team: they are
    marked left now (AgentSession.left_at), and `_loaded_sessions` and the client-session
    reads find only sessions of the agent's team not left (a client's next call starts a
    new one). Moved back, an agent's old sessions took calls again, under the grants a
    reviewer gave "for this session" before the move. Its calls
    still waiting in them are ended here, in the transfer's transaction: those waiting for
    a reviewer are cancelled and those queued for a worker denied, unrun (the team whose
    reviewers and rules let them through is not the agent's any more, and its new team
    must not decide them on a record it cannot read). A call already running finishes
    in its session. `token_refusal` refuses any that a decision or a worker read before
    this commits."""
    reason = moved_team(former, team)
    AgentSession.objects.filter(agent=agent, left_at__isnull=True).exclude(
        team_id=agent.team_id
    ).update(left_at=timezone.now())
    _cancel_waiting(agent, actor, reason, why=f"{reason}; send it again")
    _deny_queued(agent, reason, guard=TEAM_GUARD)


# The guard a call of a session of a team its agent has left is denied by.
TEAM_GUARD = "team"


def moved_team(former: str, team: str) -> str:
    return (
        f"the agent moved from the team {former} to the team {team} before this call ran: "
        "the calls of the sessions it started for its former team run no more (those "
        "sessions are that team's record), and its next call starts a new session"
    )


def moved_team_refusal() -> str:
    return (
        "The agent moved to another team before this call ran: the calls of the sessions "
        "it started for its former team run no more (those sessions are that team's "
        "record), so it was not run. Send it again: it starts a new session."
    )


def _holders_outside(agent: Agent, team: Team) -> User | None:
    """The first active person shown a token of `agent` (token_holders) who does not reach
    `team`, its new team: no organization admin role, no superuser, no membership of it.
    (Someone no longer active holds no working token: their deactivation voided the one
    they were shown, and none is shown to them since.) None when everyone reaches it: a
    team admin who made the agent must not take a working token of it to a team they are
    not in, which leaving the team would have voided (void_tokens_of_team_leaver)."""
    holders = list(agent.token_holders or [])
    if not holders or Agent.objects.filter(pk=agent.pk, oauth_client__isnull=False).exists():
        return None
    for person in User.objects.filter(pk__in=holders, is_active=True).order_by("pk"):
        if person.is_superuser or org_holds(person, ADMIN):
            continue
        if not Membership.objects.filter(team=team, user=person).exists():
            return person
    return None


def token_prefix(token: str) -> str | None:
    """The visible prefix of a well-formed agent token (None: not an agent token)."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    return parts[1]


def authenticate_token(token: str) -> Agent | None:
    """The active agent holding `token`, or None. Constant-time comparison of the hash."""
    prefix = token_prefix(token)
    if prefix is None:
        return None
    agent = (
        Agent.objects.select_related("owner").filter(token_prefix=prefix, is_active=True).first()
    )
    if agent is None or not _token_matches(agent, token):
        return None
    return agent


def _token_matches(agent: Agent, token: str) -> bool:
    return hmac.compare_digest(agent.token_hash, _hash_token(token))


def _loaded_sessions(prefix: str, digest: str) -> QuerySet[AgentSession]:
    """Sessions of the active agent whose token has `prefix` and hashes to `digest`, read
    with what admission needs: agent, owner, the owner's profile, and whether the session
    holds any grant, and the revisions of the organization's and the team's policy layers
    (dispatcher.policy.layers: parsed layers are kept by revision, so none is read here).

    The hash is part of the read, so a bad token finds no session whether or not the
    session it names exists: its request then costs the same (this read, then
    authenticate_token's) either way, and its timing tells nothing about the session id.
    The callers still compare the hash in constant time."""
    return (
        AgentSession.objects.select_related("agent__owner__permission_profile")
        .annotate(
            has_grants=Exists(SessionGrant.objects.active().filter(session=OuterRef("pk"))),
            **layers.session_revisions("agent__team_id"),
        )
        .filter(
            agent__token_prefix=prefix,
            agent__token_hash=digest,
            agent__is_active=True,
            team_id=F("agent__team_id"),  # a session of a team it left takes no call,
            left_at__isnull=True,  # even once it is back in that team
        )
    )


# The two reads every agent call starts with, compiled once (floor.compiled).
_SESSION_BY_ID = Compiled(
    lambda prefix, digest, pk: _loaded_sessions(prefix, digest).filter(pk=pk)[:1]
)
_SESSION_BY_CLIENT_ID = Compiled(
    lambda prefix, digest, client, external_id: (
        _loaded_sessions(prefix, digest)
        .filter(client=client, external_id=external_id)
        .order_by("pk")[:1]
    )
)


def session_for_token(token: str, session_id: uuid.UUID) -> AgentSession | None:
    """The session `session_id` if `token` is its active agent's, read with what admission
    needs (agent, owner, the owner's profile, whether it holds any grant) in one query:
    the agent API's submit path authenticates and loads in one read. None otherwise
    (unknown or foreign session, or a bad token: the caller tells them apart)."""
    prefix = token_prefix(token)
    if prefix is None:
        return None
    session = _SESSION_BY_ID.first(prefix, _hash_token(token), session_id)
    if session is None or not _token_matches(session.agent, token):
        return None
    return session


@transaction.atomic
def revoke_agent(*, agent: Agent, actor: str) -> None:
    """Revoke the agent: its token refused from the commit on, audited as agent.revoked,
    and its calls queued for a worker denied in the same commit, as a void denies them
    (_deny_queued: the worker's own re-check, the mode guard, denies those it reads later;
    this denies those it read before). Idempotent. The agent's row is locked FOR UPDATE
    first: a worker's claim in flight holds it FOR KEY SHARE (transitions.
    live_credential_sql), and runs its call before this commits, or waits and refuses it."""
    Agent.objects.select_for_update(of=("self",)).filter(pk=agent.pk).exists()
    if Agent.objects.filter(pk=agent.pk, is_active=True).update(
        is_active=False, revoked_at=timezone.now()
    ):
        record_event(
            kind=kinds.AGENT_REVOKED,
            actor=actor,
            subject=f"agent:{agent.pk}",
            payload={"name": agent.name},
        )
        _deny_queued(agent, sent_by_revoked(agent.name))


@transaction.atomic
def hand_over_agent(*, agent: Agent, to: User, actor: str) -> str:
    """Give an active agent to another owner (its token keeps working, now answering to
    `to`'s mode and rules); its name, suffixed if `to` has one like it. Returns the name."""
    name = agent.name
    if Agent.objects.filter(owner=to, name=name).exclude(pk=agent.pk).exists():
        name = f"{agent.name[:80]}-from-{agent.owner.get_username()[:15]}"
    previous = agent.owner.get_username()
    Agent.objects.filter(pk=agent.pk).update(owner=to, name=name)
    PermissionProfile.objects.get_or_create(user=to, defaults=default_profile())
    record_event(
        kind=kinds.AGENT_HANDED_OVER,
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={"name": name, "from": previous, "to": to.get_username()},
    )
    agent.owner, agent.name = to, name
    return name


def lock_agents_of(*, user: User, actor: str, sponsor: User | None = None) -> dict[str, Any]:
    """The first deactivation step (settings.HARNESS_DEACTIVATION_STEPS, inside audit.roles.
    deactivate's transaction): every active agent the later steps may revoke, hand over or
    void (`user` owns it, signed it in, or was shown its token) locked FOR UPDATE, in
    primary-key order, before anything else is written. A worker's claim holds its agent's
    row FOR KEY SHARE, then writes to its session's audit chain
    (transitions.live_credential_sql); the deactivation voided the leaver's votes (writing
    to those chains) before it locked the agents, and the two deadlocked. Now it takes the
    agent first, as every killing step does. Returns nothing to audit."""
    held = [
        pk
        for pk, holders in Agent.objects.filter(is_active=True).values_list("pk", "token_holders")
        if user.pk in (holders or [])
    ]
    mine = Q(owner=user) | Q(oauth_client__owner=user) | Q(pk__in=held)
    list(
        Agent.objects.select_for_update(of=("self",))
        .filter(mine, is_active=True)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return {}


def release_agents_of(*, user: User, actor: str, sponsor: User | None = None) -> dict[str, Any]:
    """A deactivation step (settings.HARNESS_DEACTIVATION_STEPS, inside audit.roles.
    deactivate's transaction): each active agent `user` owns is handed to `sponsor`, else
    to the agent's own sponsor (Agent.sponsor) when that person is active, else revoked
    (its token refused from the commit on)."""
    agents = list(
        Agent.objects.select_for_update(of=("self",))
        .select_related("sponsor")
        .filter(owner=user, is_active=True)
        .order_by("pk")
    )
    handed: list[str] = []
    revoked: list[str] = []
    for agent in agents:
        to = sponsor if sponsor is not None and sponsor.is_active else agent.sponsor
        if to is not None and to.is_active and to.pk != user.pk:
            handed.append(hand_over_agent(agent=agent, to=to, actor=actor))
        else:
            revoke_agent(agent=agent, actor=actor)
            revoked.append(agent.name)
    return {"agents_revoked": revoked, **({"agents_handed_over": handed} if handed else {})}


@transaction.atomic
def rotate_token(*, agent: Agent, actor: str, shown_to: User | None = None) -> str:
    """Give an active agent a new token and return it (shown once to `shown_to`, who can
    act as the agent from then on); the old one stops working at once, and the calls it
    sent that are queued for a worker are denied, unrun (a rotation is what an admin does
    when a token may have leaked: `token_refusal`; calls waiting for a reviewer still wait,
    and are denied by the worker if approved). Raises ServiceError for a revoked agent
    (revoked is final), and for
    an agent a client signed in for its owner (OAuth consent, `harness-hook login`): its
    credentials are the tokens only that person's client holds, in the mode they
    consented to; a bearer token would act for them beside it, in their own mode."""
    _lock_active(shown_to, agent.team_id)
    old = Agent.objects.select_for_update().filter(pk=agent.pk, is_active=True).first()
    if old is None:
        raise ServiceError(f"Agent '{agent.name}' is revoked; create a new agent instead.")
    token, prefix = _new_token()
    while prefix == old.token_prefix:  # the prefix names the token a call was sent with
        token, prefix = _new_token()
    if Agent.objects.filter(pk=agent.pk, oauth_client__isnull=False).exists():
        raise ServiceError(
            f"Agent '{agent.name}' was signed in by its owner through their client: it has "
            "no token to rotate. Sign it out or revoke it; its owner signs in again."
        )
    # Everyone shown a token of it stays listed, whether or not they are still active:
    # separation of duties counts them behind the calls made with their copy, which may
    # still wait, also if they come back (approvals.services.people_behind).
    holders = list(old.token_holders or [])
    if shown_to is not None and shown_to.pk not in holders:
        holders.append(shown_to.pk)
    Agent.objects.filter(pk=agent.pk).update(
        token_prefix=prefix,
        token_hash=_hash_token(token),
        token_holders=holders,
        token_voided_because="",
        token_voided_at=None,
        voided_token_hash="",
    )
    payload = {"name": agent.name, "old_token_prefix": old.token_prefix, "token_prefix": prefix}
    if old.token_voided_because:
        payload["voided_because"] = old.token_voided_because
    record_event(
        kind=kinds.AGENT_TOKEN_ROTATED, actor=actor, subject=f"agent:{agent.pk}", payload=payload
    )
    _deny_queued(agent, sent_with_rotated())
    agent.token_prefix, agent.token_hash = prefix, _hash_token(token)
    agent.token_holders = holders
    agent.token_voided_because, agent.token_voided_at, agent.voided_token_hash = "", None, ""
    return token


def _lock_active(person: User | None, team_id: int) -> None:
    """Lock the row of the person a token is about to be shown to, and refuse one who is
    no longer active (ServiceError). Taken before the agent's row, in the order a
    deactivation takes them (the person, then their agents): a deactivation that commits
    first is seen here, and one that comes after waits for this token to be recorded as
    theirs, then voids it (void_tokens_shown_to).

    Then the row that lets them reach the agent's team, locked too, or refused when there
    is none: their organization admin role, else a membership of the team (a superuser
    needs neither). Leaving the team deletes that row before it voids the tokens of the
    team's agents they were shown (void_tokens_of_team_leaver), which it finds by an
    unlocked read: without this lock, a rotation whose page checked their reach just
    before they left recorded them as a holder after that read, and they left the team
    with a working token of its agent."""
    if person is None:
        return
    if not User.objects.select_for_update().filter(pk=person.pk, is_active=True).exists():
        raise ServiceError(f"{person.get_username()} is deactivated: no token is shown to them.")
    if not lock_reach(person, team_id):
        raise ServiceError(
            f"{person.get_username()} is not in the agent's team (any more): no token of its "
            "agents is shown to them."
        )


def lock_reach(person: User, team_id: int) -> bool:
    """Whether `person` reaches the team `team_id` (teams_for: a superuser, an organization
    admin, a member), with the row that lets them locked: their organization admin role,
    else their membership of the team (a superuser needs neither). Removing it
    (teams.services.remove_member, audit.roles.remove_role) then waits for the caller's
    transaction, whose work its leaving steps then find; or it came first, and this finds
    no row. Taken after the person's own row (deactivation's order)."""
    if person.is_superuser:
        return True
    org_admin = User.groups.through.objects.select_for_update(of=("self",)).filter(
        user_id=person.pk, group__name=ADMIN
    )
    if org_admin.exists():
        return True
    return Membership.objects.select_for_update().filter(team_id=team_id, user=person).exists()


def void_tokens_shown_to(*, user: User, actor: str, sponsor: User | None = None) -> dict[str, Any]:
    """A deactivation step (settings.HARNESS_DEACTIVATION_STEPS, inside audit.roles.
    deactivate's transaction, after the leaver's own agents were handed over or revoked):
    every active agent whose bearer token `user` was shown (Agent.token_holders: they
    created it or rotated its token in the dashboard, and may have kept a copy) has that
    token voided. Its stored hash becomes the hash of a random secret nobody is shown, so
    the token is refused from the commit on (401, saying why: `voided_refusal`); the
    agent stays, with its sessions, owner and team, until someone rotates its token
    (rotate_token, which clears the mark). Each is audited (agent.token_voided, naming
    the leaver) and its owner is told after commit. Returns the agents' names."""
    voided = _void_held_by(
        user=user,
        actor=actor,
        agents=Agent.objects.all(),
        reason=f"{user.get_username()}, who was shown this token, was deactivated",
    )
    return {"agent_tokens_voided": voided} if voided else {}


def void_tokens_of_team_leaver(*, team: Team, user: User, actor: str) -> dict[str, Any]:
    """A team-left step (settings.HARNESS_TEAM_LEFT_STEPS, inside teams.services.
    remove_member's transaction, when `user` holds no role in `team` any more): every
    active agent of `team` whose bearer token `user` was shown (a team admin who created
    it or rotated its token, and may have kept a copy) has that token voided, as a
    deactivation voids it (void_tokens_shown_to). Someone who left the team acts for none
    of its agents; an organization admin or a superuser, who reaches every team's agents
    (and may rotate their tokens) whatever teams they are in, keeps them."""
    if org_holds(user, ADMIN):
        return {}
    voided = _void_held_by(
        user=user,
        actor=actor,
        agents=Agent.objects.filter(team=team),
        reason=f"{user.get_username()}, who was shown this token, left the team {team.name}",
    )
    return {"agent_tokens_voided": voided} if voided else {}


def _void_held_by(*, user: User, actor: str, agents: QuerySet[Agent], reason: str) -> list[str]:
    """Void the token of each active agent of `agents` whose token_holders name `user`
    (their stored hash becomes the hash of a random secret nobody is shown; the token is
    refused from the commit on, 401 saying why: `voided_refusal`), audit each
    (agent.token_voided, `reason`) and tell its owner after commit. Their names."""
    candidates = [
        pk
        for pk, holders in agents.filter(is_active=True, token_voided_at__isnull=True)
        .order_by("pk")
        .values_list("pk", "token_holders")
        if user.pk in (holders or [])
    ]
    held = (
        Agent.objects.select_for_update(of=("self",))
        .select_related("owner", "team")
        .filter(pk__in=candidates, is_active=True, token_voided_at__isnull=True)
        .order_by("pk")
    )
    voided: list[str] = []
    now = timezone.now()
    leaver = user.get_username()
    for agent in held:
        Agent.objects.filter(pk=agent.pk).update(
            token_hash=_hash_token(secrets.token_urlsafe(32)),  # nobody is shown it
            voided_token_hash=agent.token_hash,
            token_voided_because=leaver,
            token_voided_at=now,
        )
        event = record_event(
            kind=kinds.AGENT_TOKEN_VOIDED,
            actor=actor,
            subject=f"agent:{agent.pk}",
            payload={
                "name": agent.name,
                "owner": agent.owner.get_username(),
                "team": agent.team.name,  # (a notice's route may name `team/name`)
                "token_prefix": agent.token_prefix,
                "because": leaver,
                "reason": reason,
            },
        )
        transaction.on_commit(functools.partial(_send_task, NOTIFY_VOIDED_TASK, str(event.pk)))
        _cancel_waiting(agent, actor, reason)
        _deny_queued(agent, sent_with_voided(leaver))
        voided.append(agent.name)
    return voided


def _cancel_waiting(agent: Agent, actor: str, reason: str, why: str = "") -> None:
    """Cancel the agent's calls still waiting for a reviewer: Harness cannot tell which
    holder of the token sent each, so a call the leaver asked just before leaving would
    otherwise still be approved and run as the agent. The owner's agent resends them once
    the token is rotated (the model is told so).

    Every waiting call's row is locked first, in one statement, before any cancel takes
    its session chain's lock (as `_deny_queued`): a reviewer's decision takes its call's
    row, then the chain's, so locking the rows one by one between cancels (a move,
    `transfer_agent`; a void) held the chain a decision waited for while waiting for the
    row that decision held (a deadlock, the reviewer's approval a 500). A call a decision
    moves on meanwhile is no longer waiting once its row is free: it is left to it (and,
    queued, to `_deny_queued`)."""
    lock_sign_in(agent)
    waiting = (
        ToolCall.objects.filter(session__agent=agent, status=Status.PENDING_APPROVAL)
        .select_for_update(of=("self",))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    why = why or (
        f"the agent's token was voided ({reason}), and this call, sent with it, waited for a "
        "reviewer; resend it once the agent's token is rotated"
    )
    for call_id in list(waiting):
        transitions.cancel_call(call_id=call_id, actor=actor, reason=why)


def _deny_queued(agent: Agent, why: str, guard: str = "") -> None:
    """Deny the agent's calls allowed or approved and queued for a worker, not yet claimed:
    all of them were sent with the token just voided or replaced (the new one is not
    shown before this commits). The worker's own check (`token_refusal`) denies those it
    reads later; this denies, in the same commit, those it read before, which its claim
    (conditional on the call still being queued) then leaves alone."""
    lock_sign_in(agent)
    # Every queued call's row locked first, in one statement, before any denial takes its
    # session chain's lock: a worker's claim takes its call's row, then the chain's, so
    # locking the rows one by one between denials deadlocked with it (review). A row a
    # worker is claiming at this moment is skipped: that call starts as the rotation
    # commits (as one a moment earlier would have: its claim's statement read the token
    # live), or its claim fails and the worker denies it (execution.refuse_dead_credential).
    queued = ToolCall.objects.filter(session__agent=agent, status=Status.QUEUED)
    ids = list(
        queued.select_for_update(skip_locked=True, of=("self",))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    denial = GuardDenial(((guard or TOKEN_GUARD, why),))
    locked = ToolCall.objects.select_related("session").filter(pk__in=ids)
    for call in locked.order_by("created_at", "batch_index"):
        transitions.deny_before_run(call, denial)


# The guard a call sent with a token that is no longer the agent's is denied by.
TOKEN_GUARD = transitions.TOKEN_GUARD


def end_calls_of_signed_out(agent: Agent, actor: str) -> None:
    """Every OAuth token of `agent`, a client's signed-in agent, was just revoked (its
    owner's "Sign out", agentauth.services.sign_out_agent): its calls still waiting for a
    reviewer are cancelled and those queued for a worker denied, in the same commit. All
    were sent with those tokens (such an agent has no other credential), and the owner
    signs out when a device holding them is lost: an approval would otherwise answer
    "allow" to the signed-out client's hook still waiting, which then ran the tool.

    The agent is given a new sign-in first (`_new_sign_in`): a call whose token was
    checked before this commits, and written after the sweep below looked, is not
    ended here, but it carries the sign-in it was admitted under (its provenance's
    "token"), so the decision and the worker refuse it (`token_refusal`), and so does
    the worker's claim, whatever the worker read before this committed, and the write of
    a call allowed at once (both conditional on it: transitions.live_credential_sql)."""
    _new_sign_in(agent)
    why = signed_out(agent.name)
    _cancel_waiting(agent, actor, why, why=why)
    _deny_queued(agent, why)


# (SIGNED_OUT_PREFIX, dispatcher.models: `token_refusal` tells a sign-out from a rotation
# by it, and the pages show such an agent as signed out, not its prefix.)


def _new_sign_in(agent: Agent) -> None:
    """Give a client's signed-in agent, being signed out, a new bearer token that is never
    shown (as the one create_agent made for it at consent never was: its OAuth tokens are
    its only credentials). Its prefix is the sign-in a call is admitted under: admission
    records the prefix read with the token it checked, in the same statement, so every
    call sent with the tokens revoked now names the old one, and `token_refusal` refuses
    it, however late it was written. No statement more at admission or at the worker."""
    token, prefix = _new_token()
    prefix = SIGNED_OUT_PREFIX + prefix
    Agent.objects.filter(pk=agent.pk).update(token_prefix=prefix, token_hash=_hash_token(token))
    agent.token_prefix = prefix


def signed_out(name: str) -> str:
    return (
        f"The agent '{name}' was signed out (every token of it revoked) before this call "
        "ran, so it was not run. Sign in again, then send it again."
    )


def sent_with_voided(because: str) -> str:
    return (
        f"The agent token this call was sent with was voided because {because}, who was "
        "shown it, left (Harness, or the agent's team), before a worker ran the call: "
        "Harness cannot tell whether they "
        "sent it, so it was not run. Resend it once an admin of the agent's team has "
        "rotated the agent's token, with the new token."
    )


def sent_by_revoked(name: str) -> str:
    return (
        f"The agent '{name}' was revoked before a worker ran this call; none of its calls "
        "run any more."
    )


def sent_with_rotated() -> str:
    return (
        "The agent token this call was sent with was rotated (replaced by a new one) "
        "before a worker ran the call: nothing an old token sent runs once it is replaced "
        "(it may have leaked), so it was not run. Resend it with the agent's new token."
    )


def token_refusal(call: ToolCall, agent: Agent) -> GuardDenial | None:
    """Why the worker must not claim `call` of `agent`, or None when it may: the token that
    sent it is no longer the agent's valid token. The agent row is the one the worker read
    with the call (no statement of its own). Admission records the verified token's
    prefix on the call (provenance "token"); a rotation gives the agent another, and a
    void marks it (token_voided_at) until the rotation that clears the mark. A call
    admitted before Harness kept the record is refused only while the token is voided.
    And a call of a session of a team the agent has left (transfer_agent, committed after
    this call was read to be decided or claimed): the session's team and whether the
    agent left it are on the row read (guard `team`; the others `token`)."""
    if call.session.team_id != agent.team_id or call.session.left_at is not None:
        return GuardDenial(((TEAM_GUARD, moved_team_refusal()),))
    if agent.token_voided_at is not None:
        why = sent_with_voided(agent.token_voided_because or "someone")
        return GuardDenial(((TOKEN_GUARD, why),))
    sent_with = (call.provenance or {}).get("token")
    if sent_with is not None and sent_with != agent.token_prefix:
        if agent.signed_out:  # (_new_sign_in)
            return GuardDenial(((TOKEN_GUARD, signed_out(agent.name)),))
        return GuardDenial(((TOKEN_GUARD, sent_with_rotated()),))
    return None


def credential_refusal(call: ToolCall, agent: Agent) -> GuardDenial | None:
    """`token_refusal`, and a revoked agent's refusal (the guards' `agent_active` refuses
    it at admission and at the worker's re-check): why `call` must not start now that a
    claim conditional on its credential (transitions.live_credential_sql) found it dead,
    with `agent` read after that claim. None when it is live."""
    refused = token_refusal(call, agent)
    if refused is None and not agent.is_active:
        refused = GuardDenial(((TOKEN_GUARD, sent_by_revoked(agent.name)),))
    if refused is None and sign_in_ended(call):
        refused = GuardDenial(((TOKEN_GUARD, sent_with_revoked_token(agent.name)),))
    return refused


def sign_in_ended(call: ToolCall) -> bool:
    """Whether the OAuth sign-in `call` was sent under (provenance "sign_in": its access
    token's refresh-token family, which a refresh keeps) holds no unrevoked refresh token
    bound to an access token any more: that token was revoked (RFC 7009, an admin), or
    the family ended. False for a call sent with a bearer token. One statement."""
    sign_in = (call.provenance or {}).get("sign_in")
    if sign_in is None:
        return False
    tokens = apps.get_model(settings.OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL)  # (an app above)
    live = tokens._default_manager.filter(
        token_family=sign_in, revoked__isnull=True, access_token__isnull=False
    )
    return not live.exists()


def sent_with_revoked_token(name: str) -> str:
    return (
        f"The OAuth token this call was sent with (a sign-in of the agent '{name}') was "
        "revoked before the call ran, so it was not run. Sign in again, then send it again."
    )


def refusal_since(session: AgentSession) -> GuardDenial:
    """Why calls sent with the credential `session` was read with (its agent's token
    prefix as read then) are refused now that a write conditional on it found it dead
    (dispatcher.admission): `credential_refusal` with the session and its agent read
    again (one statement). Never None: the write saw it dead, so it is refused even if
    nothing read here says why."""
    fresh = AgentSession.objects.select_related("agent").get(pk=session.pk)
    provenance = {"token": session.agent.token_prefix}
    sign_in = getattr(session.agent, "sign_in", None)  # (agentauth.tokens)
    if sign_in is not None:  # (its one token revoked: said so)
        provenance["sign_in"] = str(sign_in)
    probe = ToolCall(session=fresh, provenance=provenance)
    refused = credential_refusal(probe, fresh.agent)
    if refused is None:
        refused = GuardDenial(((TOKEN_GUARD, messages.credential_gone(fresh.agent.name)),))
    return refused


def signed_in_now(agent: Agent) -> None:
    """Before a decision releases a call of `agent` (its `oauth_client` read with it):
    for a client's signed-in agent, wait for a sign-out committing now (a revocation's
    too: it signs the agent out), and read the agent's sign-in again (`read_sign_in`:
    `token_refusal` and the guards read it). A call written after the sign-out's sweep
    is visible to a reviewer before the sign-out commits; without this its approval,
    reading the sign-in as it was, could release it as the sign-out ends. The sign-out
    locks the same row first (`lock_sign_in`), after the agent's and before the calls
    and audit chains it writes, which a decision takes after this, so the two never wait
    for each other both ways. Two statements, for a signed-in agent's approval only;
    none for any other agent."""
    if getattr(agent, "oauth_client", None) is None:  # (selected with the agent)
        return
    lock_sign_in(agent)
    read_sign_in(agent)


def lock_sign_in(agent: Agent) -> str | None:
    """Lock `agent`'s client link (agentauth's AgentClient), the row every change of a
    signed-in agent's sign-in holds to its commit: a sign-out takes it after the agent's
    row (agentauth.services.sign_out_agent), a void, a move, a rotation or a revocation
    before the calls or the sessions' chains it writes (`_cancel_waiting`,
    `_deny_queued`), a decision before its call's row (`signed_in_now`), and an edit
    after the agent's row (approvals.services). One order for all: the agent's row, this
    link, then calls and chains. A revocation denied the agent's queued calls (their
    sessions' chains locked), then signed it out (the link): a decision holding the link
    and waiting for such a chain waited for it both ways (deadlock detected, one of them
    a 500). One statement (FOR NO KEY UPDATE: no row refers to the link, so it excludes
    as FOR UPDATE would); no row for an agent no client signed in for. Returns the mode
    the link holds (the person's consent: `_lock_for_a_session`), None without a link."""
    link = Agent._meta.get_field("oauth_client").related_model  # (an app above this one)
    rows = link._default_manager.select_for_update(no_key=True).filter(agent_id=agent.pk)
    mode: str | None = rows.values_list("mode", flat=True).first()
    return mode


# What a sign-out, a revocation, a void, a rotation or a move changes of an agent's row
# that a decision or an edit reads again once it waited for them (`read_sign_in`): what
# `token_refusal`, admission and the guards (`agent_active`) read.
SIGN_IN_FIELDS = (
    "token_prefix",
    "token_hash",
    "is_active",
    "revoked_at",
    "token_voided_at",
    "token_voided_because",
    "team_id",
)


def read_sign_in(agent: Agent, *, lock_row: bool = False) -> None:
    """Read `agent`'s SIGN_IN_FIELDS again into `agent`, its row locked when `lock_row`
    (FOR NO KEY UPDATE: it waits for a sign-out's FOR UPDATE, and a sign-out for it, but
    not for a decision's FOR KEY SHARE, taken before the approval's row an edit holds
    here: approvals.services._agent_held; taken before `lock_sign_in`). One statement."""
    rows = Agent.objects.filter(pk=agent.pk)
    if lock_row:
        rows = rows.select_for_update(of=("self",), no_key=True)
    for field, value in (rows.values(*SIGN_IN_FIELDS).first() or {}).items():
        setattr(agent, field, value)


# (identity.tasks: the notice goes through the notification channels, an app above this one)
NOTIFY_VOIDED_TASK = "identity.tasks.notify_token_voided"


def _send_task(name: str, argument: Any) -> None:
    """One Celery message, never retried here: a broker that is down costs the owner's
    notice (logged; the audit event and the agent's page still say it), never the
    deactivation."""
    try:
        current_app.send_task(name, args=(argument,), retry=False)
    except Exception:
        logger.warning("could not enqueue %s(%s)", name, argument, exc_info=True)


def voided_refusal(token: str) -> str:
    """Why `token`, which authenticates no agent, is refused, when it is a token that a
    holder's leaving voided (void_tokens_shown_to): a sentence for the 401 that tells
    whoever still sends it what happened and what to do. "" for any other token (a
    guess, a typo, a revoked agent's): they keep the plain answer. The comparison is
    with the voided token's hash, in constant time, so only its holder learns anything."""
    prefix = token_prefix(token)
    if prefix is None:
        return ""
    row = (
        Agent.objects.filter(token_prefix=prefix, is_active=True)
        .exclude(voided_token_hash="")
        .values_list("voided_token_hash", "token_voided_because", "token_voided_at")
        .first()
    )
    if row is None or not hmac.compare_digest(row[0], _hash_token(token)):
        return ""
    _, because, when = row
    day = f" on {when:%Y-%m-%d}" if when is not None else ""
    return (
        f"This agent token was voided{day} because {because}, who was shown it, left "
        "(their Harness account was deactivated, or they left the agent's team, or the agent "
        "moved to a team they are not in). It will not "
        "work again: ask an admin of the agent's team to rotate the agent's token on its "
        "page in the dashboard, and use the new token."
    )


@transaction.atomic
def start_session(
    *,
    agent: Agent,
    title: str = "",
    mode: str | None = None,
    client: str = "api",
    external_id: str = "",
) -> AgentSession:
    """Start a session. Its mode may only narrow the owner's; its workspace is never the agent's choice.

    `client` and `external_id` name the way it came in and the client's own id for it
    (an MCP session id): one client session is one Harness session. Raises
    TooManySessions (nothing started) past HARNESS_MAX_SESSIONS_PER_MINUTE."""
    limits.count_new_session(agent)
    if mode is not None and mode not in Mode.values:
        raise ServiceError(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    ceiling = _lock_for_a_session(agent, mode or None)
    owner_mode = layers.effective_mode(Mode.TRUSTED, layers.policy_for(agent.owner, agent.team_id))
    effective = narrower_mode(ceiling, owner_mode) if ceiling else owner_mode
    session_id = uuid.uuid4()
    if agent.workspace:
        workspace = Path(agent.workspace)
    else:
        workspace = Path(settings.HARNESS_WORKSPACE_ROOT).resolve() / str(session_id)
    workspace.mkdir(parents=True, exist_ok=True)
    session = AgentSession.objects.create(
        id=session_id,
        agent=agent,
        team_id=agent.team_id,  # the agent's row, read already: no statement
        title=title[:200],
        mode=effective,
        workspace=str(workspace),
        client=client,
        external_id=external_id,
    )
    _record_started(session, requested_mode=mode)
    return session


def _lock_for_a_session(agent: Agent, ceiling: str | None = None) -> str | None:
    """Before a session of `agent` is written (start_session, a client's first call): lock
    the agent's row and read its team and owner again, so the session is started in the
    team the agent works for when it commits. A move (transfer_agent) writes that row,
    then marks the sessions of the team the agent left (AgentSession.left_at), in one
    transaction. A request that read the agent before the move, and started its session
    after the move's marking read the sessions, started it in the former team, not left:
    once the agent was moved back, that session took calls again. Now the session waits
    for the move's commit here and starts in the new team; or it locked first, and the
    move's marking, which waits for this commit, finds it.

    With a mode `ceiling` (an OAuth agent's chosen profile, read with its token, or a
    mode asked for), the agent's client link is locked and read too, and the narrower of
    the two is returned: a consent narrowing the mode (agentauth.services.authorize_agent)
    holds the link to its commit and narrows the open sessions then, so a session started
    with the mode read before that commit waits for it here and starts narrowed; or it
    locked first, and the consent's narrowing, which waits for this commit, finds it.
    (Without the read, such a session kept the wider mode for good.) None: no ceiling.

    One statement per session started, two with a ceiling (FOR NO KEY UPDATE: a call's
    admission takes no lock of either row), taken first in the session's transaction, as
    a move takes the row before the sessions, calls and audit chains it writes, and in
    `lock_sign_in`'s order (the agent's row, then the link)."""
    fresh = (
        Agent.objects.select_for_update(no_key=True)
        .filter(pk=agent.pk)
        .values_list("team_id", "owner_id")
        .first()
    )
    if fresh is not None and fresh != (agent.team_id, agent.owner_id):
        agent.refresh_from_db(fields=["team", "owner", "sponsor"])
    if ceiling is None:
        return None
    chosen = lock_sign_in(agent)
    return narrower_mode(ceiling, chosen) if chosen in Mode.values else ceiling


def mode_and_profile(
    session: AgentSession, *, preloaded: bool = False, revisions: Any = None
) -> tuple[str, Profile]:
    """The owner's profile with the managed layers of the agent's team (one read; none
    when `preloaded`: see profile_for, with the layers' revisions read alongside the
    session or given as `revisions`), and the session's mode narrowed further by the
    owner's mode and every layer's ceiling (dispatcher.policy.layers.effective_mode)."""
    agent = session.agent
    if preloaded:
        profile = layers.with_layers(
            profile_for(agent.owner, preloaded=True),
            agent.team_id,
            revisions if revisions is not None else layers.revisions_of(session),
        )
    else:
        profile = layers.policy_for(agent.owner, agent.team_id)
    return layers.effective_mode(session.mode, profile), profile


def client_session(
    *, agent: Agent, client: str, external_id: str, project_dir: str, mode: str | None = None
) -> AgentSession:
    """The Harness session of one client session (a Claude Code session_id), started on
    first sight: titled and confined by the client's project directory, which is on the
    client's disk (never created or resolved here). Later calls with the same id get the
    same session, whatever directory they name (the first one confines it). A new
    session's mode is the owner's, narrowed to `mode` when given (an OAuth agent's
    chosen profile).

    Idempotent under concurrent first requests (one row per agent, client and id).
    """
    found = _client_session(agent, client, external_id)
    if found is not None:
        return found
    try:
        return _start_client_session(agent, client, external_id, project_dir, mode)
    except IntegrityError:
        # A concurrent first request of the same session won; use its row.
        found = _client_session(agent, client, external_id)
        if found is None:
            raise
        return found


def client_session_for_token(
    *, token: str, client: str, external_id: str, project_dir: str
) -> AgentSession | None:
    """The client session `external_id` of the active agent holding `token` (started on
    first sight, as client_session does), read with what admission needs (agent, owner,
    the owner's profile, whether it holds any grant) in one query once it exists: the hook
    path authenticates and loads in one read. None for a bad token."""
    session = loaded_client_session(token, client, external_id)
    if session is not None:
        return session
    agent = authenticate_token(token)
    if agent is None:
        return None
    return client_session(
        agent=agent, client=client, external_id=external_id, project_dir=project_dir
    )


def loaded_client_session(token: str, client: str, external_id: str) -> AgentSession | None:
    """The existing client session `external_id` of the active agent holding `token`, read
    with what admission needs (agent, owner, the owner's profile, whether it holds any
    grant) in one query; None for a bad token or no such session of that agent (the
    caller tells them apart with authenticate_token). Starts nothing."""
    prefix = token_prefix(token)
    if prefix is None:
        return None
    session = _SESSION_BY_CLIENT_ID.first(prefix, _hash_token(token), client, external_id)
    if session is None or not _token_matches(session.agent, token):
        return None
    return session


def _client_session(agent: Agent, client: str, external_id: str) -> AgentSession | None:
    session = (
        AgentSession.objects.annotate(
            has_grants=Exists(SessionGrant.objects.active().filter(session=OuterRef("pk")))
        )
        .filter(
            agent=agent,
            team_id=agent.team_id,
            left_at__isnull=True,
            client=client,
            external_id=external_id,
        )
        .first()
    )
    if session is not None:
        session.agent = agent
    return session


@transaction.atomic
def _start_client_session(
    agent: Agent, client: str, external_id: str, project_dir: str, ceiling: str | None = None
) -> AgentSession:
    limits.count_new_session(agent)  # raises TooManySessions: nothing started
    ceiling = _lock_for_a_session(agent, ceiling)
    mode = layers.effective_mode(Mode.TRUSTED, layers.policy_for(agent.owner, agent.team_id))
    if ceiling is not None:
        mode = narrower_mode(ceiling, mode)
    session = AgentSession.objects.create(
        agent=agent,
        team_id=agent.team_id,
        title=project_dir[:200],
        mode=mode,
        workspace=project_dir,
        client=client,
        external_id=external_id,
    )
    session.has_grants = False  # type: ignore[attr-defined]
    _record_started(session, requested_mode=None)
    return session


def join_run(
    *, agent: Agent, client: str, title: str, key: str = "", idle: float, mode: str | None = None
) -> tuple[AgentSession, bool]:
    """The Harness session of a run whose client keeps no transport session for all of
    it: one that opens a new one per call, or speaks a revision without sessions; and
    whether it started now.

    With a run `key` the client chose (the same for every request of one run), the
    agent's session of that key, started on first sight. Without one, the agent's latest
    session of `client` titled `title` (the same client program) that was joined within
    `idle` seconds; else a new one (its mode narrowed to `mode` when given: an OAuth
    agent's chosen profile). Joining marks the session used now. Raises
    TooManySessions (nothing started) past HARNESS_MAX_SESSIONS_PER_MINUTE."""
    if key:
        external_id = f"run:{key}"
        found = AgentSession.objects.filter(
            agent=agent,
            team_id=agent.team_id,
            left_at__isnull=True,
            client=client,
            external_id=external_id,
        ).first()
        if found is None:
            try:
                return start_session(
                    agent=agent, title=title, client=client, external_id=external_id, mode=mode
                ), True
            except IntegrityError:  # a concurrent first request of the same run won
                found = AgentSession.objects.get(
                    agent=agent,
                    team_id=agent.team_id,
                    left_at__isnull=True,
                    client=client,
                    external_id=external_id,
                )
    elif idle > 0:
        since = timezone.now() - timedelta(seconds=idle)
        found = (
            AgentSession.objects.filter(
                agent=agent,
                team_id=agent.team_id,
                left_at__isnull=True,
                client=client,
                title=title[:200],
                updated_at__gte=since,
            )
            .order_by("-updated_at")
            .first()
        )
    else:
        found = None
    if found is None:
        return start_session(
            agent=agent,
            title=title,
            client=client,
            external_id=secrets.token_hex(16),
            mode=mode,
        ), True
    AgentSession.objects.filter(pk=found.pk).update(updated_at=timezone.now())
    found.agent = agent
    return found, False


@transaction.atomic
def record_client_event(
    *, session: AgentSession, kind: str, payload: dict[str, Any], subject: str = ""
) -> None:
    """What a client tells about its session besides tool calls (a prompt, a stop, a
    report no call takes), in the session's audit chain, for the timeline. `kind` is one
    of the client.* kinds; `subject` defaults to the session (a call's, to show on it)."""
    record_event(
        kind=kind,
        actor=f"agent:{session.agent.name}",
        session_id=session.pk,
        subject=subject or f"session:{session.pk}",
        payload=payload,
    )


def _record_started(session: AgentSession, *, requested_mode: str | None) -> None:
    """The session's first event (its chain's genesis): who, which mode, where, which client."""
    agent = session.agent
    payload: dict[str, Any] = {
        "agent": agent.name,
        "owner": agent.owner.get_username(),
        "title": session.title,
        "requested_mode": requested_mode,
        "mode": session.mode,
        "workspace": session.workspace,
        "client": session.client,
    }
    if session.external_id:
        payload["external_id"] = session.external_id
    record_event(
        kind=kinds.SESSION_STARTED,
        actor=f"agent:{agent.name}",
        session_id=session.pk,
        subject=f"session:{session.pk}",
        payload=payload,
    )
