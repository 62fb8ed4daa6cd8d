"""Consent and revocation: every change with its audit event (audit.kinds)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from oauth2_provider.models import (
    AccessToken,
    DeviceGrant,
    RefreshToken,
    get_application_model,
)

from agentauth.models import AgentClient, DeviceResource, PendingAgent, Registration
from audit import kinds
from audit.models import AuditEvent
from audit.roles import ADMIN
from audit.services import record_event
from dispatcher import agents
from dispatcher.models import Agent, AgentSession
from dispatcher.policy.models import MODE_ORDER, Mode, narrower_mode
from dispatcher.policy.profiles import profile_for
from floor.errors import ServiceError
from teams.models import Team
from teams.scope import org_holds


def client_name(application: Any) -> str:
    """What a person is shown for a client: its metadata document's name, else its host."""
    name = str(application.name or "").strip()
    if name:
        return name[:80]
    return urlsplit(str(application.client_id)).hostname or str(application.client_id)[:80]


def registration_of(application: Any) -> str:
    source = str(getattr(application, "registration_source", "") or "")
    if source == "cimd":
        return Registration.CIMD
    if source == "dcr":
        return Registration.DYNAMIC
    if application.authorization_grant_type == "urn:ietf:params:oauth:grant-type:device_code":
        return Registration.DEVICE
    return Registration.MANUAL


def teams_for(person: User) -> QuerySet[Team]:
    """The teams `person` may approve an agent for: those they are a member of (any
    role); every team for a superuser or an organization-wide admin."""
    if person.is_superuser or org_holds(person, ADMIN):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=person).distinct()


@transaction.atomic
def authorize_agent(*, owner: User, application: Any, team: Team, mode: str, actor: str) -> Agent:
    """The agent `owner` approves `application` as: their agent for that client in
    `team` (made on first consent, reused after for the same person, client and team; a
    revoked one is replaced by a new one, revoked is final, at most so many an hour:
    _within_hourly_bound), running under the owner's
    profile with its mode narrowed to `mode`. Audited as agent.authorized. Raises
    ServiceError for an inactive owner, a team the owner is not in, or an unknown mode."""
    # The person's row first (deactivation's and the leaving steps' lock order), then the
    # rows that give them reach over the team (_lock_reach), then the signed-in cap's count.
    locked = User.objects.select_for_update().filter(pk=owner.pk, is_active=True)
    if not owner.is_active or not list(locked.values_list("pk", flat=True)):
        raise ServiceError("This account is deactivated; it cannot approve agents.")
    # (its organization admin role or membership locked: a consent racing the person's
    # removal from the team waits for it, or its leaving step finds the agent made)
    if not agents.lock_reach(owner, team.pk):
        raise ServiceError(
            f"You are not a member of team '{team.name}', so you cannot approve an agent "
            "for it. Choose one of your teams, or ask an admin to add you to it."
        )
    if mode not in Mode.values:
        raise ServiceError(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    mode = narrower_mode(mode, profile_for(owner).mode)
    _lock_client(application)
    link = (
        AgentClient.objects.select_for_update()
        .select_related("agent")
        .filter(owner=owner, application=application, team=team)
        .first()
    )
    if link is None or not link.agent.is_active:
        _within_signed_in_cap(owner)
        _within_hourly_bound(owner)
        agent, _token = agents.create_agent(
            owner=owner, name=_free_name(owner, client_name(application)), team=team, actor=actor
        )
        if link is None:
            link = AgentClient(owner=owner, application=application, team=team, agent=agent)
        link.agent = agent
        link.registered_via = registration_of(application)
    link.mode = mode
    link.save()
    _narrow_sessions(link.agent, mode)
    record_event(
        kind=kinds.AGENT_AUTHORIZED,
        actor=actor,
        subject=f"agent:{link.agent.pk}",
        payload={
            "agent": link.agent.name,
            "owner": owner.get_username(),
            "client_id": str(application.client_id),
            "client_name": client_name(application),
            "team": team.name,
            "registered_via": link.registered_via,
            "mode": mode,
        },
    )
    return link.agent


def _narrow_sessions(agent: Agent, mode: str) -> None:
    """The agent's sessions still open narrowed to `mode`, the profile its person just
    chose for it: a session it started under a wider one (a Claude Code session id, an
    MCP run) runs under the narrower one from now on, with any of its tokens (a mode
    chosen at consent was applied only to sessions started after it). A wider mode
    widens none: a session keeps the narrowest it had."""
    wider = MODE_ORDER[MODE_ORDER.index(Mode(mode)) + 1 :]
    AgentSession.objects.filter(agent=agent, left_at__isnull=True, mode__in=wider).update(mode=mode)


def _within_signed_in_cap(owner: User) -> None:
    """ServiceError when `owner` holds HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON active agents
    made by consent already. Every client (a metadata document's URL, a registration)
    made a new agent, so one person could hold any number, each with its own share of the
    execution queue, rate and wait slots. Counted under a lock of the person's row, so
    consents given at once cannot each pass the count (authorize_agent locked it)."""
    limit = settings.HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON
    if limit == 0:  # no cap (a negative value is refused at start-up: settings.py)
        return
    held = AgentClient.objects.filter(owner=owner, agent__is_active=True).count()
    if held >= limit:
        raise ServiceError(
            f"You already have {held} agents signed in through clients, the most one person "
            f"may have (HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON is {limit}). Revoke one you "
            "no longer use on your Agents page (/account/agents/), then approve this client "
            "again, or ask an admin to raise the limit."
        )


def _within_hourly_bound(owner: User) -> None:
    """ServiceError when consent made `owner` twice HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON
    new agents in the last hour already (every place of the cap filled, and each replaced
    once after a revocation). A revoked agent is never made active again (its sessions and
    audit stay its own), so each approval after a revocation made a new row: approving,
    revoking and approving again grew the agents table without bound, the signed-in cap
    counting active agents only. Counted under the lock of the person's row, as the cap."""
    limit = settings.HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON
    if limit == 0:
        return
    since = timezone.now() - timedelta(hours=1)
    recent = Agent.objects.filter(owner=owner, created_at__gte=since).values_list("pk", flat=True)
    made = (
        AuditEvent.objects.filter(
            kind=kinds.AGENT_AUTHORIZED, subject__in=[f"agent:{pk}" for pk in recent]
        )
        .values("subject")
        .distinct()
        .count()
    )
    if made >= 2 * limit:
        raise ServiceError(
            f"You were given {made} new agents through clients in the last hour, the most "
            f"one person may be given in an hour (twice HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON, "
            f"which is {limit}). Approve this client again in an hour; an agent still active "
            "is reused without this count."
        )


def _free_name(owner: User, wanted: str) -> str:
    taken = set(
        Agent.objects.filter(owner=owner, name__startswith=wanted[:90]).values_list(
            "name", flat=True
        )
    )
    name, n = wanted[:90], 2
    while name in taken:
        name, n = f"{wanted[:90]} ({n})", n + 1
    return name


def _lock_client(application: Any) -> None:
    """Lock the client's row for a consent's transaction; ServiceError when it is gone. A
    client deleted since the consent page was shown (or at the same moment: the lock waits
    for that deletion) made the agent's link name no client, refused at commit (a foreign
    key error, a 500)."""
    model = get_application_model()
    if not model.objects.select_for_update().filter(pk=application.pk).exists():
        raise ServiceError(
            f"The client '{client_name(application)}' no longer exists (it was deleted "
            "since this page was shown), so it was not approved. Start the sign-in again "
            "from the client."
        )


@transaction.atomic
def approve_device(*, owner: User, device_grant: Any, team: Team, mode: str, actor: str) -> Agent:
    """A device code (harness-hook login) approved by `owner` for `team`: its agent, as
    authorize_agent makes it, is the one the device's tokens will stand for. The code
    moves from pending to authorized by a conditional update, so of two people approving
    the same code at once one wins and the other gets ServiceError (nothing changes)."""
    pending = DeviceGrant.objects.filter(
        pk=device_grant.pk, status=DeviceGrant.AUTHORIZATION_PENDING
    )
    if not pending.update(status=DeviceGrant.AUTHORIZED, user=owner):
        raise ServiceError(
            "This code was approved or denied already. Run `harness-hook login` again for "
            "a new code."
        )
    application = get_application_model().objects.filter(client_id=device_grant.client_id).first()
    if application is None:  # deleted since the code was read (its codes go with it)
        raise ServiceError(
            "The client this code was for was deleted, so it approves nothing. Run "
            "`harness-hook login` (or the client's sign-in) again for a new code."
        )
    agent = authorize_agent(owner=owner, application=application, team=team, mode=mode, actor=actor)
    PendingAgent.objects.update_or_create(device_grant=device_grant, defaults={"agent": agent})
    return agent


@transaction.atomic
def bind_device_resource(
    *, device_code: str, resource: str, network: str = "", aggregate: str = ""
) -> None:
    """The device code `device_code`, just issued, is for `resource` (RFC 8707; the rule is
    agentauth.validators.device_code_resource): its token may be for that one only. It was
    asked from `network` (agentauth.views.device_network), in the wider block `aggregate`
    (device_aggregate), whose shares it counts in."""
    grant = DeviceGrant.objects.get(device_code=device_code)
    DeviceResource.objects.create(
        device_grant=grant, resource=resource, network=network[:64], aggregate=aggregate[:64]
    )


@transaction.atomic
def record_device_lockout(*, person: User, attempts: int, window: int) -> None:
    """`person` typed `attempts` wrong device codes within `window` seconds: device sign-in
    is refused for them until the window passes (agentauth.views.device)."""
    record_event(
        kind=kinds.DEVICE_CODES_LOCKED,
        actor=f"user:{person.get_username()}",
        subject=f"user:{person.get_username()}",
        payload={"user": person.get_username(), "attempts": attempts, "window": window},
    )


@transaction.atomic
def sign_out_agent(*, agent: Agent, actor: str) -> int:
    """Revoke every OAuth token of `agent` at once (access and refresh); the agent stays.
    Returns how many access tokens ended. Audited as agent.signed_out. For an agent a
    client signed in for (its tokens are its only credential), the calls sent with them
    and not yet run end too (agents.end_calls_of_signed_out): those waiting for a reviewer
    cancelled, those queued denied. An agent an admin made keeps its bearer token and its
    calls. A code approved for the agent and not yet exchanged (an authorization code, a
    device code: a sign-in under way, perhaps the lost device's) is unbound from it, so
    its exchange gives no token (agentauth.validators)."""
    # The agent's row first (as a revocation's, which signs the agent out after writing
    # it: revoke_agent): a code's exchange locks it while it writes its token
    # (agentauth.validators._still_bound), so the token of one that checked its code
    # before the codes are unbound below is deleted below, and a later one waits for this
    # commit, then finds its code unbound. Then its client link, held to the commit: a
    # decision about to release a call of the agent waits for it, then reads the agent's
    # new sign-in (agents.signed_in_now). The decision locks the link before the call's
    # row and its session's audit chain, which the sign-out takes after it (cancelling
    # the calls waiting): locked last, a decision holding it and the sign-out holding the
    # chain of another call of that session waited for each other (a deadlock, one of
    # them a 500).
    Agent.objects.select_for_update(of=("self",)).filter(pk=agent.pk).exists()
    agents.lock_sign_in(agent)
    PendingAgent.objects.filter(agent=agent).delete()
    count = _delete_tokens(agent)
    # (A revoked agent's calls: agents.revoke_agent denied those queued, and the guards
    # deny its asks at release.)
    if AgentClient.objects.filter(agent=agent, agent__is_active=True).exists():
        agents.end_calls_of_signed_out(agent, actor)
    record_event(
        kind=kinds.AGENT_SIGNED_OUT,
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={"agent": agent.name, "tokens": count},
    )
    return count


def _delete_tokens(agent: Agent) -> int:
    """Delete every OAuth token of `agent` (access and refresh); how many access tokens."""
    access = AccessToken.objects.filter(harness__agent=agent)
    RefreshToken.objects.filter(access_token__in=access).delete()
    _, deleted = access.delete()
    return int(deleted.get(AccessToken._meta.label, 0))


def stop_agents_of_leaver(*, team: Team, user: User, actor: str) -> dict[str, Any]:
    """A step of teams.services.remove_member (settings.HARNESS_TEAM_LEFT_STEPS, inside its
    transaction) when `user` holds no role in `team` any more: each of their agents in it
    that a client signed in for (OAuth consent or `harness-hook login`'s device code) acted
    for them in that team, so it is revoked (its tokens refused from the commit on). An
    agent an admin made (create_agent's bearer token, its sponsor accountable) stays, and
    so does everything while they may still approve agents for the team (an org admin)."""
    if teams_for(user).filter(pk=team.pk).exists():
        return {}
    signed_in = (
        Agent.objects.select_for_update(of=("self",))
        .filter(owner=user, team=team, is_active=True, oauth_client__isnull=False)
        .order_by("pk")
    )
    revoked: list[str] = []
    for agent in signed_in:
        revoke_agent(agent=agent, actor=actor)
        revoked.append(agent.name)
    return {"agents_revoked": revoked} if revoked else {}


def stop_signed_in_agents_of(
    *, user: User, actor: str, sponsor: User | None = None
) -> dict[str, Any]:
    """A deactivation step (settings.HARNESS_DEACTIVATION_STEPS, inside audit.roles.
    deactivate's transaction, before the agents are handed over): each active agent a
    client signed in for `user` (OAuth consent or `harness-hook login`'s device code;
    whoever owns it now) is revoked, its tokens deleted. Its tokens are in the leaver's
    client: handed to a sponsor, they would go on acting under the sponsor's rules."""
    signed_in = (
        Agent.objects.select_for_update(of=("self",))
        .filter(oauth_client__owner=user, is_active=True)
        .order_by("pk")
    )
    revoked: list[str] = []
    for agent in signed_in:
        revoke_agent(agent=agent, actor=actor)
        revoked.append(agent.name)
    return {"signed_in_agents_revoked": revoked} if revoked else {}


@transaction.atomic
def delete_client(*, application: Any, actor: str) -> list[str]:
    """Delete an OAuth client (django-oauth-toolkit's Application: its codes and tokens
    go with it), each agent a person approved for it revoked first, in the same
    transaction, by `actor` (revoke_agents_of_client). The one write path of the RFC 7592
    DELETE and the admin; any other deletion is caught by agentauth.signals. The names of
    the agents revoked. The client's row is locked first, as a consent locks it
    (_lock_client): a consent at the same moment commits its agent before the deletion
    finds the client's agents, or finds the client gone."""
    get_application_model().objects.select_for_update().filter(pk=application.pk).exists()
    revoked = revoke_agents_of_client(application=application, actor=actor)
    application.delete()
    return revoked


def revoke_agents_of_client(*, application: Any, actor: str) -> list[str]:
    """Revoke each active agent a person approved `application` for (revoke_agent: every
    token of it stops from the commit on, audited as agent.revoked). Its links and tokens
    go when the client is deleted, so the agent was left active, linked to nothing: out
    of the signed-in cap's count and of the leaving steps' reach, its bearer token open to
    rotation. Idempotent. Its device codes are deleted (pending or approved). The names
    of the agents revoked."""
    signed_in = (
        Agent.objects.select_for_update(of=("self",))
        .filter(oauth_client__application_id=application.pk, is_active=True)
        .order_by("pk")
    )
    revoked: list[str] = []
    for agent in signed_in:
        revoke_agent(agent=agent, actor=actor)
        revoked.append(agent.name)
    # Its device codes too: they name their client by client_id, not by a relation, so
    # none went with it; a pending one stayed pending, and typing it on the device page
    # answered 500 (approve_device found no client), or, once a client of the same
    # client_id was registered again (harness-hook's is made on demand), approved it.
    DeviceGrant.objects.filter(client_id=application.client_id).delete()
    return revoked


@transaction.atomic
def revoke_agent(*, agent: Agent, actor: str) -> None:
    """Revoke the agent (its bearer token and every OAuth token stop at once)."""
    agents.revoke_agent(agent=agent, actor=actor)
    if AccessToken.objects.filter(harness__agent=agent).exists():
        sign_out_agent(agent=agent, actor=actor)


# How long an expired device code is kept: a `harness-hook login` still polling it is told
# "expired_token" (what RFC 8628 says), not that no such code exists.
DEVICE_CODES_KEPT_AFTER_EXPIRY = timedelta(hours=1)


def clear_device_codes(now: datetime | None = None) -> int:
    """Delete the device codes expired for over DEVICE_CODES_KEPT_AFTER_EXPIRY, whatever
    their status (django-oauth-toolkit's cleartokens leaves them: every `harness-hook
    login`, and every unauthenticated request to the device authorization endpoint, left a
    row for ever). The number deleted."""
    cutoff = (now or timezone.now()) - DEVICE_CODES_KEPT_AFTER_EXPIRY
    deleted, _ = DeviceGrant.objects.filter(expires__lt=cutoff).delete()
    return int(deleted)
