"""OAuth access tokens as agent credentials: their form, and the one read that turns a
token into its loaded agent (and session) on the MCP path.

Harness's access tokens start with `hro_` (agent bearer tokens with `hrn_`), so a request
costs one read whichever it carries: the token's hash, its expiry, its audience, its
agent and the agent's owner (both active) are all checked in the same statement that
loads what admission needs.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from dispatcher import agents
from dispatcher.models import Agent, AgentSession
from dispatcher.policy.models import SessionGrant
from floor.compiled import Compiled

HOOKS_PATH = "/api/v1/hooks/"
ACCESS_PREFIX = "hro_"
REFRESH_PREFIX = "hrr_"


def new_access_token(request: Any) -> str:
    """django-oauth-toolkit's ACCESS_TOKEN_GENERATOR."""
    return ACCESS_PREFIX + secrets.token_urlsafe(32)


def new_refresh_token(request: Any) -> str:
    """django-oauth-toolkit's REFRESH_TOKEN_GENERATOR."""
    return REFRESH_PREFIX + secrets.token_urlsafe(32)


def is_access_token(token: str) -> bool:
    return token.startswith(ACCESS_PREFIX)


def checksum(token: str) -> str:
    """How django-oauth-toolkit stores a token (SHA-256, hex)."""
    return hashlib.sha256(token.encode()).hexdigest()


def audience_matches(resources: Any, audience: str) -> bool:
    """Whether a token's resource indicators (RFC 8707) name `audience` (a trailing slash
    aside). A token without one names no audience and matches none: fail closed."""
    if not isinstance(resources, list):
        return False
    wanted = audience.rstrip("/")
    return any(isinstance(r, str) and r.rstrip("/") == wanted for r in resources)


_TOKEN = "oauth_tokens__access_token__"


def _valid(prefix: str, digest: str, now: Any) -> dict[str, Any]:
    return {
        f"{prefix}{_TOKEN}token_checksum": digest,
        f"{prefix}{_TOKEN}expires__gt": now,
        f"{prefix}is_active": True,
        f"{prefix}owner__is_active": True,
    }


_SESSION = Compiled(
    lambda digest, now, client, external_id: (
        AgentSession.objects.select_related("agent__owner__permission_profile")
        .filter(
            client=client,
            external_id=external_id,
            left_at__isnull=True,  # (a signed-in agent never moves: none is left)
            **_valid("agent__", digest, now),
        )
        .annotate(
            has_grants=Exists(SessionGrant.objects.active().filter(session=OuterRef("pk"))),
            token_audience=F(f"agent__{_TOKEN}resource"),
            mode_ceiling=F("agent__oauth_client__mode"),
            sign_in=F(f"agent__{_TOKEN}refresh_token__token_family"),
        )
        .order_by("pk")[:1]
    )
)
_AGENT = Compiled(
    lambda digest, now: (
        Agent.objects.select_related("owner")
        .filter(**_valid("", digest, now))
        .annotate(
            token_audience=F(f"{_TOKEN}resource"),
            mode_ceiling=F("oauth_client__mode"),
            sign_in=F(f"{_TOKEN}refresh_token__token_family"),
        )[:1]
    )
)


def loaded_session(token: str, client: str, external_id: str, audience: str) -> Any:
    """The client session `external_id` of the agent an unexpired access token for
    `audience` was issued to (agent and owner active), read with what admission needs in
    one query, as dispatcher.agents.loaded_client_session reads it for a bearer token.
    None otherwise."""
    session = _SESSION.first(checksum(token), timezone.now(), client, external_id)
    if session is None or not audience_matches(session.token_audience, audience):
        return None
    session.agent.mode_ceiling = session.mode_ceiling  # type: ignore[attr-defined]
    session.agent.sign_in = session.sign_in  # type: ignore[attr-defined]
    return session


def agent_for(token: str, audience: str) -> Agent | None:
    """The active agent (with its owner) an unexpired access token for `audience` was
    issued to, or None."""
    agent = _AGENT.first(checksum(token), timezone.now())
    if agent is None or not audience_matches(agent.token_audience, audience):
        return None
    return agent


def client_session_for_token(
    *, token: str, audience: str, client: str, external_id: str, project_dir: str
) -> AgentSession | None:
    """The hooks' read for an access token, as dispatcher.agents.client_session_for_token
    is for a bearer token: the client session `external_id` (started on first sight) of
    the agent the token for `audience` was issued to. None for a bad token."""
    session = loaded_session(token, client, external_id, audience)
    if session is not None:
        return session  # type: ignore[no-any-return]
    agent = agent_for(token, audience)
    if agent is None:
        return None
    return agents.client_session(
        agent=agent,
        client=client,
        external_id=external_id,
        project_dir=project_dir,
        mode=getattr(agent, "mode_ceiling", None),
    )
