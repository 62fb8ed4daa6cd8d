"""Consent and revocation: every change with its audit event (audit.kinds)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.db import transaction
from oauth2_provider.models import AccessToken, RefreshToken, get_application_model

from agentauth.models import AgentClient, PendingAgent, Registration
from audit import kinds
from audit.services import record_event
from dispatcher import agents
from dispatcher.models import Agent
from dispatcher.policy.models import Mode, narrower_mode
from dispatcher.policy.profiles import profile_for
from floor.errors import ServiceError


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


@transaction.atomic
def authorize_agent(*, owner: User, application: Any, mode: str, actor: str) -> Agent:
    """The agent `owner` approves `application` as: their agent for that client (made on
    first consent, reused after; a revoked one is replaced by a new one, revoked is
    final), running under the owner's profile with its mode narrowed to `mode`. Audited
    as agent.authorized. Raises ServiceError for an inactive owner or an unknown mode."""
    if not owner.is_active:
        raise ServiceError("This account is deactivated; it cannot approve agents.")
    if mode not in Mode.values:
        raise ServiceError(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    mode = narrower_mode(mode, profile_for(owner).mode)
    link = (
        AgentClient.objects.select_for_update()
        .select_related("agent")
        .filter(owner=owner, application=application)
        .first()
    )
    if link is None or not link.agent.is_active:
        agent, _token = agents.create_agent(
            owner=owner, name=_free_name(owner, client_name(application)), actor=actor
        )
        if link is None:
            link = AgentClient(owner=owner, application=application, agent=agent)
        link.agent = agent
        link.registered_via = registration_of(application)
    link.mode = mode
    link.save()
    record_event(
        kind=kinds.AGENT_AUTHORIZED,
        actor=actor,
        subject=f"agent:{link.agent.pk}",
        payload={
            "agent": link.agent.name,
            "owner": owner.get_username(),
            "client_id": str(application.client_id),
            "client_name": client_name(application),
            "registered_via": link.registered_via,
            "mode": mode,
        },
    )
    return link.agent


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


@transaction.atomic
def approve_device(*, owner: User, device_grant: Any, mode: str, actor: str) -> Agent:
    """A device code (harness-hook login) approved by `owner`: its agent, as
    authorize_agent makes it, is the one the device's tokens will stand for."""
    application = get_application_model().objects.get(client_id=device_grant.client_id)
    agent = authorize_agent(owner=owner, application=application, mode=mode, actor=actor)
    PendingAgent.objects.update_or_create(device_grant=device_grant, defaults={"agent": agent})
    return agent


@transaction.atomic
def sign_out_agent(*, agent: Agent, actor: str) -> int:
    """Revoke every OAuth token of `agent` at once (access and refresh); the agent stays.
    Returns how many access tokens ended. Audited as agent.signed_out."""
    access = AccessToken.objects.filter(harness__agent=agent)
    RefreshToken.objects.filter(access_token__in=access).delete()
    _, deleted = access.delete()
    count = int(deleted.get(AccessToken._meta.label, 0))
    record_event(
        kind=kinds.AGENT_SIGNED_OUT,
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={"agent": agent.name, "tokens": count},
    )
    return count


@transaction.atomic
def revoke_agent(*, agent: Agent, actor: str) -> None:
    """Revoke the agent (its bearer token and every OAuth token stop at once)."""
    agents.revoke_agent(agent=agent, actor=actor)
    if AccessToken.objects.filter(harness__agent=agent).exists():
        sign_out_agent(agent=agent, actor=actor)
