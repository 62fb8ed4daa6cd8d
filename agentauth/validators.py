"""django-oauth-toolkit's validator with Harness's rules (settings.OAUTH2_PROVIDER):

- every code, device code and access token names the agent the person approved
  (agentauth.models); a token request whose code names none is refused (fail closed);
- a refreshed token inherits its predecessor's agent;
- a token's audience (RFC 8707 resource) is one of this Harness's own resources: its MCP
  endpoint (the default when the client names none) or its hooks API, never both; and one
  its code was granted for (a code granted without a resource is for the default only),
  or its device code was asked for (a device code asked without one is for the hooks API,
  as `harness-hook login` asks it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth import get_user_model
from django.db import connection
from django.http import HttpRequest
from django.urls import reverse
from oauth2_provider.models import DeviceGrant, Grant, RefreshToken, get_application_model
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors

from agentauth.models import AgentToken, DeviceResource, PendingAgent
from agentauth.tokens import HOOKS_PATH
from dispatcher.models import Agent

Application = get_application_model()

MCP_PATH = "/mcp/"


def resources_of(origin: str) -> tuple[str, str]:
    """The audiences a token of this Harness may carry, at `origin` (scheme://host)."""
    return origin + MCP_PATH, origin + HOOKS_PATH


def _origin(request: Any) -> str:
    """This Harness's origin as the token request reached it (django-oauth-toolkit hands
    the oauthlib request the Django request's META as headers; the host is checked
    against ALLOWED_HOSTS by get_host, as for any Django request)."""
    django_request = HttpRequest()
    django_request.META = dict(request.headers)
    secure = request.headers.get("X_DJANGO_OAUTH_TOOLKIT_SECURE")
    return f"{'https' if secure else 'http'}://{django_request.get_host()}"


def _at_authorization_endpoint(request: Any) -> bool:
    """Is the oauthlib `request` one of /oauth/authorize/ (under any script prefix)?"""
    path = urlsplit(str(getattr(request, "uri", "") or "")).path
    return path == reverse("oauth2_provider:authorize")


# The grants Harness serves (settings.OAUTH2_PROVIDER's OAUTH2_GRANT_TYPES_SUPPORTED): each
# names the agent its tokens stand for (a code, a device code, a refresh token).
GRANTS = frozenset(
    ("authorization_code", "refresh_token", "urn:ietf:params:oauth:grant-type:device_code")
)


def _hold_client(request: Any) -> None:
    """Lock the person's row, then the client's, FOR KEY SHARE to the commit (PostgreSQL:
    Django has no spelling of it; the new tokens' foreign keys to them take the same
    locks): a deletion of the client waits for it, and other refreshes do not. The
    person's first, as a consent (agentauth.services.authorize_agent) and a deactivation
    lock it FOR UPDATE before the client's and the agent's: taken at the tokens' writes,
    after the client's and the agent's, a refresh or code exchange and a consent of the
    same person for the same client each held what the other waited for (a deadlock, the
    consent a 500). One statement each."""
    if connection.vendor != "postgresql":  # (SQLite: one writer, no row locks)
        return
    q = connection.ops.quote_name
    user = getattr(request, "user", None)
    rows = [(get_application_model(), request.client.pk)]
    if user is not None and getattr(user, "pk", None) is not None:
        rows.insert(0, (get_user_model(), user.pk))
    with connection.cursor() as cursor:
        for model, pk in rows:
            table, column = q(model._meta.db_table), q(model._meta.pk.column)
            cursor.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR KEY SHARE", [pk])  # noqa: S608


def _agent_id(request: Any) -> Any:
    """The agent a code or token is being made for, as this validator (or the consent
    view's credentials) set it on the oauthlib `request`; never a request parameter:
    oauthlib answers an attribute it lacks with the parameter of that name, so
    getattr(request, "harness_agent_id") read `harness_agent_id=` from the body of a
    grant that sets none."""
    return vars(request).get("harness_agent_id")


class AgentValidator(OAuth2Validator):  # type: ignore[misc]
    def validate_grant_type(
        self, client_id: str, grant_type: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        """Only the grants Harness serves, whatever the client was registered for (an
        admin's client of the client credentials grant has no person behind it)."""
        if grant_type not in GRANTS:
            return False
        return bool(
            super().validate_grant_type(client_id, grant_type, client, request, *args, **kwargs)
        )

    def _load_application(self, client_id: str, request: Any) -> Any:
        """A client metadata document is fetched (and its client stored) on first sight at
        the authorization endpoint only, where a signed-in person is asked to consent: the
        token, revocation and device endpoints take anyone's request, and a client_id URL
        no consent ever fetched names no client there (no request of Harness's to
        wherever it points, no row stored)."""
        if "client" not in vars(request):
            # oauthlib answers request.client with a `client` request parameter while no
            # client is loaded: `client=1` skipped this guard (the document was fetched),
            # and django-oauth-toolkit read the string as a client (a 500).
            request.client = None
        if (
            not request.client
            and "://" in str(client_id)
            and not _at_authorization_endpoint(request)
            and not Application.objects.filter(client_id=client_id).exists()
        ):
            return None
        return super()._load_application(client_id, request)

    def _create_authorization_code(self, request: Any, code: Any, expires: Any = None) -> Any:
        agent_id = _agent_id(request)
        if agent_id is None:
            raise errors.AccessDeniedError(description="No agent was approved.", request=request)
        grant = super()._create_authorization_code(request, code, expires)
        PendingAgent.objects.create(grant=grant, agent_id=agent_id)
        return grant

    def validate_code(
        self, client_id: str, code: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        if not super().validate_code(client_id, code, client, request, *args, **kwargs):
            return False
        agent_id = (
            PendingAgent.objects.filter(grant__code=code, grant__application=client)
            .values_list("agent_id", flat=True)
            .first()
        )
        if agent_id is None:  # (its agent was signed out since it was approved)
            raise errors.InvalidGrantError(description=UNBOUND_CODE, request=request)
        request.harness_agent_id = agent_id
        return True

    def validate_refresh_token(
        self, refresh_token: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        if not super().validate_refresh_token(refresh_token, client, request, *args, **kwargs):
            return False
        previous = request.refresh_token_instance.access_token_id
        # Only for an agent that is still active, of an owner who is still active: a
        # revoked agent or a deactivated person gets no new tokens (they would not
        # authenticate, but would again if the person were reactivated).
        agent_id = (
            AgentToken.objects.filter(
                access_token_id=previous, agent__is_active=True, agent__owner__is_active=True
            )
            .values_list("agent_id", flat=True)
            .first()
        )
        request.harness_agent_id = agent_id
        return agent_id is not None

    def _save_bearer_token(self, token: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        """A refresh token is rotated once. Locked here (save_bearer_token's transaction),
        it must still be unrevoked: django-oauth-toolkit hands a request that validated it
        before a concurrent rotation committed the tokens that rotation made, or, once the
        reuse protection ended the family meanwhile (a third request sent it again), a new
        pair, alive in a family that was ended. Either way such a request gets
        invalid_grant.

        The agent's row is locked first (FOR NO KEY UPDATE, to this commit), as a sign-out
        or a revocation locks it before it deletes the agent's refresh tokens
        (agentauth.services.sign_out_agent). Locked after the refresh token, it was taken
        at the commit (the new token's AgentToken, a foreign key to the agent): the
        refresh held its refresh token and waited for the sign-out's agent row, the
        sign-out held that row and waited for the refresh token (a deadlock, one of them
        a 500). Now a refresh waits for a sign-out under way, then finds its refresh token
        gone (invalid_grant); or it locked first, and the sign-out deletes what it wrote.

        Before the agent's row, the client's, FOR KEY SHARE (`_hold_client`), as a client's
        deletion locks it FOR UPDATE before its agents' rows (services.delete_client):
        taken at the new tokens' writes (their foreign key to the client), after the
        agent's row, a refresh and its client's deletion each held what the other waited
        for (a deadlock, one of them a 500). The person's row before the client's (a
        consent's order: `_hold_client`)."""
        instance = getattr(request, "refresh_token_instance", None)
        if request.grant_type == "refresh_token" and instance is not None:
            _hold_client(request)
            Agent.objects.select_for_update(no_key=True).filter(pk=_agent_id(request)).exists()
            unrevoked = (
                RefreshToken.objects.select_for_update()
                .filter(pk=instance.pk, revoked__isnull=True)
                .exists()
            )
            if not unrevoked:
                raise errors.InvalidGrantError(
                    description="This refresh token was used already (by another request "
                    "at the same moment, or before); sign in again if no tokens came of it.",
                    request=request,
                )
        return super()._save_bearer_token(token, request, *args, **kwargs)

    def _check_and_set_request_resource(self, request: Any) -> None:
        super()._check_and_set_request_resource(request)
        own = resources_of(_origin(request))
        if request.grant_type == "authorization_code":
            _within_code(request, own[0])
        if not request.resource:
            # A device code's token is for what the code was asked for (device_resource
            # checked any resource this request named against it, before the code was used).
            device_resource = vars(request).get("harness_device_resource")
            request.resource = [device_resource or own[0]]
        if len(request.resource) > 1:
            # A token for both would be accepted by both endpoints (audience_matches): one
            # resource per token, as each endpoint refuses a token for the other.
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    "A token is issued for one resource only: ask for "
                    f"{own[0]} (MCP) or {own[1]} (hooks), not both."
                ),
                request=request,
            )
        for resource in request.resource:
            if resource not in own:
                raise errors.CustomOAuth2Error(
                    error="invalid_target",
                    description=(
                        f"The resource '{resource}' is not served by this Harness; "
                        f"ask for {own[0]} (MCP) or {own[1]} (hooks)."
                    ),
                    request=request,
                )

    def _create_access_token(
        self, expires: Any, request: Any, token: Any, source_refresh_token: Any = None
    ) -> Any:
        agent_id = _agent_id(request)
        if agent_id is None:
            raise errors.AccessDeniedError(description="No agent was approved.", request=request)
        if request.grant_type in CODE_GRANTS and not _still_bound(request, agent_id):
            raise errors.InvalidGrantError(description=UNBOUND_CODE, request=request)
        access_token = super()._create_access_token(expires, request, token, source_refresh_token)
        AgentToken.objects.create(access_token=access_token, agent_id=agent_id)
        return access_token

    def validate_device_code(
        self, client_id: str, code: str, request: Any, *args: Any, **kwargs: Any
    ) -> str | None:
        """oauthlib 4 asks the validator for a device code's status (RFC 8628 3.5), which
        django-oauth-toolkit 3.4.1 does not implement (its token view checks the status
        itself first, then oauthlib 4 calls this): the code's status, and the person who
        approved it on the request. None: no such code of this client. An authorized code
        is exchanged once: the exchange marks it expired."""
        grant = DeviceGrant.objects.filter(device_code=code, client_id=client_id).first()
        if grant is None:
            return None
        if grant.status == DeviceGrant.AUTHORIZED and grant.user_id is not None:
            if grant.is_expired():
                return "expired_token"
            # The code is used up by this exchange (a conditional update: of two requests
            # at once one gets the tokens): it is the device's one-time proof of the
            # approval, not a way to mint tokens again until it expires (after the
            # person signed the agent out, say).
            spent = DeviceGrant.objects.filter(pk=grant.pk, status=DeviceGrant.AUTHORIZED)
            if not spent.update(status=DeviceGrant.EXPIRED):
                return "expired_token"
            request.user = grant.user
            request.scopes = grant.scope.split() if grant.scope else []
            return "authorized"
        return {
            DeviceGrant.AUTHORIZATION_PENDING: "authorization_pending",
            DeviceGrant.DENIED: "access_denied",
            DeviceGrant.EXPIRED: "expired_token",
        }.get(grant.status)


# The grants that exchange a code a person approved for an agent (PendingAgent).
CODE_GRANTS = frozenset(("authorization_code", "urn:ietf:params:oauth:grant-type:device_code"))

UNBOUND_CODE = (
    "The agent this code was approved for was signed out since (every token of it and every "
    "code approved for it revoked), or no agent was approved: sign in again."
)


def _still_bound(request: Any, agent_id: Any) -> bool:
    """Whether the code being exchanged still names `agent_id`, read once a sign-out of the
    agent committing now has committed: agentauth.services.sign_out_agent locks the
    agent's row first, then unbinds the agent's codes and deletes its tokens. The code's
    check before this (validate_code, device_agent) may have come just before the
    sign-out; the agent's row locked here, to this exchange's commit (save_bearer_token's
    transaction), a sign-out either locked it first (this waits, then finds the code
    unbound) or waits for the token written here, and deletes it. The client's row is
    held before it, as a refresh holds it (`_hold_client`: a client's deletion locks the
    client, then its agents)."""
    _hold_client(request)
    Agent.objects.select_for_update(no_key=True).filter(pk=agent_id).exists()
    if request.grant_type == "authorization_code":
        codes = PendingAgent.objects.filter(grant__code=request.code)
    else:
        codes = PendingAgent.objects.filter(
            device_grant__device_code=request._params.get("device_code", "")
        )
    return codes.filter(agent_id=agent_id).exists()


def _within_code(request: Any, default: str) -> None:
    """A code names the resources its token may be for: those the client asked for at the
    authorization endpoint (django-oauth-toolkit refuses a token request for another), or,
    when it asked for none, the default one (`default`, the MCP endpoint), which a token
    request naming none gets. A code granted without a resource was exchanged for a token
    of any resource the request then named: the hooks API as well as MCP (RFC 8707: the
    resource of a token request must be one the grant allows)."""
    granted = (
        Grant.objects.filter(code=request.code, application=request.client)
        .values_list("resource", flat=True)
        .first()
    )
    if granted or not request.resource:
        return
    for resource in request.resource:
        if resource != default:
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This code was granted without a resource, so it is for {default} "
                    f"(MCP) only, not '{resource}'. For a token for '{resource}', sign in "
                    "again naming it (resource=) at the authorization endpoint."
                ),
                request=request,
            )


def device_agent(request: Any) -> None:
    """A pre-token step of the device code grant (OAUTH_PRE_TOKEN_VALIDATION): the agent
    the person approved the device code for. Refuses a code approved for none."""
    device_code = request._params.get("device_code", "")
    agent_id = (
        PendingAgent.objects.filter(device_grant__device_code=device_code)
        .values_list("agent_id", flat=True)
        .first()
    )
    if agent_id is None:  # (or its agent was signed out since: sign_out_agent)
        raise errors.AccessDeniedError(description=UNBOUND_CODE, request=request)
    request.harness_agent_id = agent_id


def device_code_resource(origin: str, requested: list[str]) -> str:
    """The resource a device code asked for at the device authorization endpoint is for
    (`requested`: the request's `resource` parameters, blank ones aside), at this Harness's
    `origin`: the one it names, or, when it names none, the hooks API: the device grant is
    `harness-hook login`'s (the device page names it), which asks without a resource. A
    token request for that code may name this resource or none, no other (device_resource).
    Raises ValueError (an invalid_target, saying why) for more than one, or one not of
    this Harness."""
    mcp, hooks = resources_of(origin)
    requested = [r for r in requested if r.strip()]
    if not requested:
        return hooks
    if len(requested) > 1:
        raise ValueError(
            f"A device code is for one resource only: ask for {mcp} (MCP) or {hooks} "
            "(hooks), not both."
        )
    if requested[0] not in (mcp, hooks):
        raise ValueError(
            f"The resource '{requested[0]}' is not served by this Harness; ask for {mcp} "
            f"(MCP) or {hooks} (hooks)."
        )
    return requested[0]


def device_resource(request: Any) -> None:
    """A pre-token step of the device code grant, before the code is used (a refused request
    leaves it for one naming the right resource): the resource the device code was asked
    for, on the request for the token (_check_and_set_request_resource); a request naming
    another is refused (invalid_target), as a code's is (_within_code). A device code that
    names none (asked before Harness kept them) is refused: sign in again."""
    device_code = request._params.get("device_code", "")
    bound = (
        DeviceResource.objects.filter(device_grant__device_code=device_code)
        .values_list("resource", flat=True)
        .first()
    )
    if bound is None:
        raise errors.InvalidGrantError(
            description="This device code names no resource; run `harness-hook login` "
            "(or the client's sign-in) again for a new code.",
            request=request,
        )
    requested = [
        value
        for key, value in (getattr(request, "decoded_body", None) or [])
        if key == "resource" and str(value).strip()
    ]
    for resource in requested:
        if resource != bound:
            raise errors.CustomOAuth2Error(
                error="invalid_target",
                description=(
                    f"This device code was asked for {bound}, so its token is for that "
                    f"resource only, not '{resource}'. For a token for '{resource}', start "
                    "a new sign-in naming it (resource=) at the device authorization "
                    "endpoint."
                ),
                request=request,
            )
    request.harness_device_resource = bound
