"""The pages of agent sign-in: consent to a client, approval of a device code, and a
person's own agents; and the protected-resource metadata of the MCP endpoint.

Consent needs a signed-in person (settings.LOGIN_URL; whatever signs people in), names
the client from its metadata document (name, URL, redirect) and asks which profile the
agent runs under; approving makes (or reuses) that person's agent for the client
(agentauth.services). Approving (consent or a device code) needs a sign-in or a
confirmation of who the person is in the last 5 minutes (_confirm_who). Every POST
carries Django's CSRF token.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from allauth.account import app_settings as account_settings
from allauth.account.adapter import get_adapter
from allauth.account.internal.flows import reauthentication
from allauth.core import ratelimit
from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import (
    ImproperlyConfigured,
    MultipleObjectsReturned,
    ObjectDoesNotExist,
    PermissionDenied,
)
from django.db import transaction
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseForbidden,
    JsonResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.csp import CSP
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from oauth2_provider import views as oauth_views
from oauth2_provider.forms import AllowForm
from oauth2_provider.models import AccessToken, DeviceGrant, get_application_model
from oauth2_provider.settings import oauth2_settings
from oauth2_provider.views import AuthorizationView
from oauth2_provider.views.device import DeviceGrantForm
from oauth2_provider.views.dynamic_client_registration import (
    DynamicClientRegistrationManagementView,
    DynamicClientRegistrationView,
)
from oauth2_provider.views.metadata import OAuthProtectedResourceMetadataView

from agentauth import services
from agentauth.cimd import redirect_allowed
from agentauth.models import AgentClient
from agentauth.validators import CODE_GRANTS, MCP_PATH, UNBOUND_CODE, device_code_resource
from audit.roles import HtmxHttpRequest
from dispatcher.models import Agent
from dispatcher.policy.models import Mode, narrower_mode
from dispatcher.policy.profiles import profile_for
from floor.errors import ServiceError
from identity.adapters import client_address
from identity.services import signed_in_recently
from teams.models import Team

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _actor(request: HttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _modes(user: Any) -> list[tuple[str, str]]:
    """The modes a person may give an agent: their own and narrower ones."""
    own = profile_for(user).mode
    return [(m.value, m.label) for m in Mode if narrower_mode(m.value, own) == m.value]


class ConsentForm(AllowForm):  # type: ignore[misc]
    mode = forms.ChoiceField(choices=Mode.choices, required=False)
    team = forms.IntegerField(required=False)


def _team(person: Any, chosen: Any) -> Team:
    """The team the person chose (by id); ServiceError naming the fix when it is none of
    theirs (authorize_agent checks the membership again, in its transaction)."""
    team = Team.objects.filter(pk=int(chosen)).first() if str(chosen).isdigit() else None
    if team is None:
        mine = list(services.teams_for(person).values_list("name", flat=True))
        if not mine:
            raise ServiceError(
                "You are not a member of any team, so you cannot approve an agent. Ask an "
                "admin to add you to a team."
            )
        raise ServiceError(f"Choose the team the agent works for: one of {', '.join(mine)}.")
    return team


# Fields of the consent form that are the person's answer, not the authorization request.
_ANSWER_FIELDS = ("csrfmiddlewaretoken", "allow", "mode", "team")


def _confirm_who(request: HttpRequest, back_to: str | None = None) -> HttpResponse | None:
    """None when the person signed in, or confirmed who they are, in the last 5 minutes
    (identity.services.signed_in_recently); otherwise where they confirm it: allauth's
    reauthentication (password, passkey, TOTP or emailed code, the first the account has),
    which sends them back to `back_to` afterwards, or replays this POST when `back_to` is
    None. An account with none of them (single sign-on only, no passkey) is told to sign
    in again. A session someone took over thus approves no agent: an agent's token acts
    for the person long after the session."""
    if signed_in_recently(request):
        return None
    methods = get_adapter(request).get_reauthentication_methods(request.user)
    if not methods:
        return render(
            request,
            "agentauth/sign_in_again.html",
            {
                "minutes": account_settings.REAUTHENTICATION_TIMEOUT // 60,
                "providers": _sign_in_again_at(request, back_to or request.path),
            },
            status=403,
        )
    if back_to is None:
        suspended: HttpResponse = reauthentication.suspend_request(request, methods[0]["url"])
        return suspended
    request.session.pop(reauthentication.STATE_SESSION_KEY, None)
    return redirect(f"{methods[0]['url']}?{urlencode({'next': back_to})}")


def _sign_in_again_at(request: HttpRequest, back_to: str) -> list[tuple[str, str]]:
    """(name, login URL) of each identity provider the person's account is linked to and
    Harness still offers: signing in there again, then back to `back_to`, is the sign-in
    an account with nothing else to confirm with gives. An OpenID provider is asked to
    make the person sign in again (`prompt=login`) rather than answer from its own
    session; a SAML provider answers as it is set to (docs/identity.md)."""
    from allauth.socialaccount.adapter import get_adapter as social_adapter
    from allauth.socialaccount.models import SocialAccount

    found: list[tuple[str, str]] = []
    linked = SocialAccount.objects.filter(user=request.user).order_by("provider")
    for provider_id in dict.fromkeys(linked.values_list("provider", flat=True)):
        try:
            provider = social_adapter().get_provider(request, provider_id)
        except (ImproperlyConfigured, ObjectDoesNotExist, MultipleObjectsReturned):
            continue  # (a provider no longer offered)
        asked = {"process": "login", "next": back_to}
        if provider.id == "openid_connect":
            asked["auth_params"] = "prompt=login"
        found.append((str(provider.name), provider.get_login_url(request, **asked)))
    return found


class _Refused(Exception):
    def __init__(self, response: HttpResponse) -> None:
        self.response = response


class ConsentView(AuthorizationView):  # type: ignore[misc]
    """/oauth/authorize/: django-oauth-toolkit's authorization endpoint with Harness's
    consent page."""

    template_name = "agentauth/authorize.html"
    form_class = ConsentForm

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        method = request.GET.get("code_challenge_method", "")
        if method and method != "S256":
            return HttpResponseBadRequest(
                "Harness accepts PKCE with code_challenge_method=S256 only; 'plain' and "
                "other methods are refused. Start the sign-in again with S256.",
                content_type="text/plain",
            )
        return super().get(request, *args, **kwargs)  # type: ignore[no-any-return]

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)
        application = context.get("application")
        if application is not None:
            context["client_name"] = services.client_name(application)
            context["client_url"] = str(application.client_id)
            context["client_host"] = urlsplit(str(application.client_id)).hostname or ""
            context["registered_via"] = services.registration_of(application)
        context["modes"] = _modes(self.request.user)
        context["own_mode"] = profile_for(self.request.user).mode
        context["teams"] = list(services.teams_for(self.request.user))
        return context

    def render_to_response(self, context: dict[str, Any], **kwargs: Any) -> HttpResponse:
        """The page, with the form allowed to go on to the client's redirect URI (the
        browser holds a form's redirect to CSP's form-action too); that URI was checked
        against the client's metadata before the page was rendered."""
        response: HttpResponse = super().render_to_response(context, **kwargs)
        target = urlsplit(str(context.get("redirect_uri") or ""))
        if target.scheme in ("http", "https") and target.netloc:
            response._csp_config = {  # type: ignore[attr-defined]
                **settings.SECURE_CSP,
                "form-action": [CSP.SELF, f"{target.scheme}://{target.netloc}"],
            }
        return response

    def form_valid(self, form: Any) -> HttpResponse:
        if not form.cleaned_data.get("allow"):
            return super().form_valid(form)  # type: ignore[no-any-return]
        # Back to this consent page, not a replay of the POST: the approval redirects to
        # the client, which the reauthentication page's CSP (form-action) would block.
        asked = self.request.GET.copy()
        for field, values in self.request.POST.lists():
            if field not in _ANSWER_FIELDS:
                asked.setlist(field, values)
        confirm = _confirm_who(self.request, f"{self.request.path}?{asked.urlencode()}")
        if confirm is not None:
            return confirm
        application = (
            get_application_model().objects.filter(client_id=form.cleaned_data["client_id"]).first()
        )
        if application is None:  # deleted since the page was shown
            return HttpResponseBadRequest(
                "This client no longer exists (it was deleted since this page was shown), "
                "so nothing was approved. Start the sign-in again from the client.",
                content_type="text/plain",
            )
        try:
            with transaction.atomic():
                agent = services.authorize_agent(
                    owner=self.request.user,
                    application=application,
                    team=_team(self.request.user, form.cleaned_data.get("team")),
                    mode=form.cleaned_data.get("mode") or profile_for(self.request.user).mode,
                    actor=_actor(self.request),
                )
                self.harness_agent_id = agent.pk
                self.harness_refused = False
                response: HttpResponse = super().form_valid(form)
                if self.harness_refused:
                    raise _Refused(response)  # nothing approved stays
        except _Refused as refused:
            return refused.response
        except ServiceError as error:
            return HttpResponseForbidden(str(error), content_type="text/plain")
        return response

    def create_authorization_response(
        self, request: HttpRequest, scopes: Any, credentials: dict[str, Any], allow: bool
    ) -> Any:
        if allow:
            credentials["harness_agent_id"] = getattr(self, "harness_agent_id", None)
        return super().create_authorization_response(request, scopes, credentials, allow)

    def error_response(self, error: Any, application: Any, **kwargs: Any) -> HttpResponse:
        self.harness_refused = True
        return super().error_response(error, application, **kwargs)  # type: ignore[no-any-return]


consent = login_required(ConsentView.as_view())


# Wrong codes are counted per person (settings.HARNESS_DEVICE_CODE_ATTEMPTS in
# HARNESS_DEVICE_CODE_WINDOW) by allauth's rate limiter: every code refused (unknown,
# expired, used) counts, so the answers cannot be told apart by guessing past the limit.
DEVICE_CODE_ACTION = "harness_device_code"


def _locked_message() -> str:
    return (
        f"Too many wrong codes: {settings.HARNESS_DEVICE_CODE_ATTEMPTS} in "
        f"{settings.HARNESS_DEVICE_CODE_WINDOW // 60} minutes. Device sign-in is paused for "
        "your account, even with the right code, until that long after the first of them. "
        "Then run `harness-hook login` again and type the code it shows."
    )


def _device_locked(request: HtmxHttpRequest) -> bool:
    """Has the person typed as many wrong device codes as the window allows?"""
    return not ratelimit.consume(request, action=DEVICE_CODE_ACTION, dry_run=True)


@login_required
@require_http_methods(["GET", "POST"])
@never_cache
def device(request: HtmxHttpRequest) -> HttpResponse:
    """/oauth/device/: a signed-in person types the code `harness-hook login` showed, is
    shown what it is for (action "review": the client, the resource, the scopes, the
    agent) and approves the device as their agent, with the profile it runs under."""
    modes = _modes(request.user)
    context: dict[str, Any] = {
        "modes": modes,
        "own_mode": profile_for(request.user).mode,
        "teams": list(services.teams_for(request.user)),
    }
    if request.method == "GET":
        # A code in the link is not filled in (RFC 8628 5.4, remote phishing): the person
        # types the one their own terminal showed, so a link someone sent them with the
        # sender's code approves nothing at one press.
        context["user_code"] = ""
        return render(request, "agentauth/device.html", context)
    context["user_code"] = request.POST.get("user_code", "")
    if _device_locked(request):
        context["error"] = _locked_message()
        return render(request, "agentauth/device.html", context, status=429)
    form = DeviceGrantForm(request.POST)
    if not form.is_valid():
        context["error"] = " ".join(e for errs in form.errors.values() for e in errs)
        ratelimit.consume(request, action=DEVICE_CODE_ACTION)
        if _device_locked(request):
            services.record_device_lockout(
                person=request.user,
                attempts=settings.HARNESS_DEVICE_CODE_ATTEMPTS,
                window=settings.HARNESS_DEVICE_CODE_WINDOW,
            )
            context["error"] = _locked_message()
            return render(request, "agentauth/device.html", context, status=429)
        return render(request, "agentauth/device.html", context, status=400)
    grant: DeviceGrant = form.cleaned_data["device_grant"]
    # What the code is for, shown before anything is approved (and after): the client,
    # the one resource its token will be for, its scopes, the agent it will act as.
    application = get_application_model().objects.filter(client_id=grant.client_id).first()
    bound = getattr(grant, "harness_resource", None)  # (none: asked before they were kept)
    resource = bound.resource if bound is not None else ""
    path = urlsplit(resource).path
    context["asked"] = {
        "client": services.client_name(application) if application else grant.client_id,
        "client_id": grant.client_id,
        "resource": resource,
        "resource_kind": (
            "the MCP endpoint"
            if path == MCP_PATH
            else "the hooks API"
            if path.endswith("/hooks/")
            else ""
        ),
        "scopes": (grant.scope or "").split(),
    }
    made = {
        link.team_id: link.agent.name
        for link in AgentClient.objects.filter(
            owner=request.user, application=application, agent__is_active=True
        ).select_related("agent")
    }
    # Per team: the agent it will act as there (one made before for this client and
    # team is reused; else a new one, named after the client).
    context["asked"]["agents"] = [(team, made.get(team.pk, "")) for team in context["teams"]]
    context["chosen_team"] = request.POST.get("team", "")
    context["chosen_mode"] = request.POST.get("mode") or context["own_mode"]
    if request.POST.get("action") == "review":
        return render(request, "agentauth/device.html", context)
    if request.POST.get("action") != "accept":
        pending = DeviceGrant.objects.filter(pk=grant.pk, status=DeviceGrant.AUTHORIZATION_PENDING)
        pending.update(status=DeviceGrant.DENIED)  # (an approval that won meanwhile stays)
        context["denied"] = True
        return render(request, "agentauth/device.html", context)
    confirm = _confirm_who(request)  # approved after it, by replaying this POST
    if confirm is not None:
        return confirm
    mode = request.POST.get("mode") or profile_for(request.user).mode
    try:
        with transaction.atomic():
            agent = services.approve_device(
                owner=request.user,
                device_grant=grant,
                team=_team(request.user, request.POST.get("team")),
                mode=mode,
                actor=_actor(request),
            )
    except ServiceError as error:
        context["error"] = str(error)
        return render(request, "agentauth/device.html", context, status=403)
    context["approved"] = agent
    return render(request, "agentauth/device.html", context)


@login_required
@require_http_methods(["GET"])
@never_cache
def my_agents(request: HtmxHttpRequest) -> HttpResponse:
    """/account/agents/: the signed-in person's own agents, how each was made, and the
    OAuth tokens alive for each."""
    agents = list(
        Agent.objects.filter(owner=request.user)
        .select_related("team")
        .order_by("-is_active", "name")
    )
    links = {
        link.agent_id: link
        for link in AgentClient.objects.filter(owner=request.user).select_related("application")
    }
    now = timezone.now()
    live: dict[int, int] = {}
    for agent_id in AccessToken.objects.filter(
        harness__agent__owner=request.user, expires__gt=now
    ).values_list("harness__agent_id", flat=True):
        live[agent_id] = live.get(agent_id, 0) + 1
    rows = [
        {
            "agent": agent,
            "link": links.get(agent.pk),
            "client": services.client_name(links[agent.pk].application)
            if agent.pk in links
            else "",
            "tokens": live.get(agent.pk, 0),
        }
        for agent in agents
    ]
    return render(request, "agentauth/mine.html", {"rows": rows})


def _own_agent(request: HtmxHttpRequest, agent_id: int) -> Agent:
    return get_object_or_404(Agent, pk=agent_id, owner=request.user)


@login_required
@require_POST
def sign_out(request: HtmxHttpRequest, agent_id: int) -> HttpResponse:
    agent = _own_agent(request, agent_id)
    count = services.sign_out_agent(agent=agent, actor=_actor(request))
    messages.success(request, f"Signed '{agent.name}' out: {count} token(s) revoked.")
    return redirect("agentauth:mine")


@login_required
@require_POST
def revoke(request: HtmxHttpRequest, agent_id: int) -> HttpResponse:
    agent = _own_agent(request, agent_id)
    services.revoke_agent(agent=agent, actor=_actor(request))
    messages.success(request, f"Agent '{agent.name}' revoked: none of its tokens works now.")
    return redirect("agentauth:mine")


class ResourceMetadataView(OAuthProtectedResourceMetadataView):  # type: ignore[misc]
    """RFC 9728 metadata of the MCP endpoint, at /.well-known/oauth-protected-resource
    and /.well-known/oauth-protected-resource/mcp/ (where MCP clients look)."""

    def get_resource(self, request: HttpRequest) -> str:
        return request.build_absolute_uri(MCP_PATH)


resource_metadata = ResourceMetadataView.as_view()


# Device codes asked for, counted per address by allauth's rate limiter (settings:
# HARNESS_DEVICE_AUTHORIZATIONS in HARNESS_DEVICE_AUTHORIZATION_WINDOW seconds; the address
# as HARNESS_TRUSTED_PROXY_COUNT or HARNESS_TRUSTED_CLIENT_IP_HEADER says to read it), and
# per network (HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK over a code's life).
DEVICE_AUTHORIZATION_ACTION = "harness_device_authorization"
DEVICE_NETWORK_ACTION = "harness_device_authorization_network"
NETWORK_PREFIX = {4: 24, 6: 48}
AGGREGATE_PREFIX = {4: 16, 6: 32}


def device_network(address: str) -> str:
    """The network `address` is counted in for device codes: an IPv4 address's /24, an
    IPv6 address's /48 (one site's usual assignment: its /64s are allauth's addresses).
    An address that is not an IP address is its own network; one that carries an IPv4
    client's (NAT64, 6to4, Teredo, ::ffff:) is in that IPv4 address's network."""
    return _block(address, NETWORK_PREFIX)


def device_aggregate(address: str) -> str:
    """The wider block `address`'s network is in, whose share of a client's pending device
    codes is counted too (_pending_full): an IPv4 address's /16, an IPv6 address's /32 (a
    provider's usual allocation, 65,536 /48s). One holder of many /48s (a /32 of their
    own, or a cloud's addresses) stayed within each /48's share and filled the client's
    places all the same. Read as device_network reads the address."""
    return _block(address, AGGREGATE_PREFIX)


def _block(address: str, prefixes: dict[int, int]) -> str:
    try:
        parsed = ipaddress.ip_address(client_address(address))
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{parsed}/{prefixes[parsed.version]}", strict=False))


def _try_again_later(description: str, retry_after: int) -> JsonResponse:
    """A refused request for a device code: 429 with an OAuth error body (RFC 6749 5.2's
    shape; `slow_down` is the token endpoint's) and the seconds to wait in Retry-After."""
    return JsonResponse(
        {"error": "too_many_requests", "error_description": description},
        status=429,
        headers={"Retry-After": str(max(retry_after, 1)), "Cache-Control": "no-store"},
    )


def _address_refused(request: HttpRequest) -> JsonResponse | None:
    """The answer to a request from an address, or a network, that asked for too many
    device codes in the window (the request is counted otherwise), or from one Harness
    cannot read: the proxy settings name a header or more X-Forwarded-For entries than the
    request has (allauth raises; a request that did not come through the proxy), a 400
    saying so. The network is looked at first (without counting), so a request it refuses
    does not count against the address."""
    try:
        network = device_network(str(get_adapter(request).get_client_ip(request)))
        network_full = not ratelimit.consume(
            request, action=DEVICE_NETWORK_ACTION, key=network, dry_run=True
        )
        allowed = not network_full and ratelimit.consume(
            request, action=DEVICE_AUTHORIZATION_ACTION
        )
    except (ImproperlyConfigured, PermissionDenied):
        return JsonResponse(
            {
                "error": "invalid_request",
                "error_description": "Harness cannot tell this request's address: it is set "
                "to read it from a reverse proxy (HARNESS_TRUSTED_PROXY_COUNT or "
                "HARNESS_TRUSTED_CLIENT_IP_HEADER), and this request does not carry what "
                "that proxy adds. Use Harness's address through the proxy.",
            },
            status=400,
        )
    if allowed and ratelimit.consume(request, action=DEVICE_NETWORK_ACTION, key=network):
        return None
    life = settings.HARNESS_DEVICE_CODE_LIFE // 60
    window = settings.HARNESS_DEVICE_AUTHORIZATION_WINDOW
    if not allowed and not network_full:
        return _try_again_later(
            f"Too many device codes asked for from this address: at most "
            f"{settings.HARNESS_DEVICE_AUTHORIZATIONS} in {window} seconds and "
            f"{settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_LIFE} in {life} minutes (a code's "
            f"life). Try again in {window} seconds (after the second limit, up to {life} "
            "minutes), or approve or deny the codes this address already has.",
            window,
        )
    return _try_again_later(
        f"Too many device codes asked for from this network ({network}): at most "
        f"{settings.HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK} in {life} minutes (a code's "
        f"life) from all its addresses together. Try again in {window} seconds (up to "
        f"{life} minutes), or approve or deny the codes this network already has.",
        window,
    )


def _holds_nul(request: HttpRequest) -> JsonResponse | None:
    """A 400 for a request whose form fields or HTTP Basic credentials hold a NUL character
    (`client_id=a%00b`), which PostgreSQL refuses in any lookup: a 500 otherwise, on
    endpoints open to anyone."""
    fields = [v for _, values in (*request.GET.lists(), *request.POST.lists()) for v in values]
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic":
        # (not Basic credentials, a ValueError: django-oauth-toolkit answers them)
        with contextlib.suppress(ValueError):
            fields.append(unquote(base64.b64decode(credentials).decode("utf-8", "replace")))
    if not any("\x00" in field for field in fields):
        return None
    return JsonResponse(
        {
            "error": "invalid_request",
            "error_description": "A parameter holds a NUL character (%00); no client, code "
            "or token has one.",
        },
        status=400,
        headers={"Cache-Control": "no-store"},
    )


def _pending_full(client_id: str, network: str, aggregate: str) -> JsonResponse | None:
    """The answer when the client's device codes waiting for approval (not expired, not yet
    approved or denied) leave no place for one more from `network`, in the wider block
    `aggregate`: either there are HARNESS_DEVICE_PENDING_MAX of them, from any number of
    networks (a guard of the table's size), or half that many and `network` holds
    HARNESS_DEVICE_PENDING_SHARE of them, or its block holds
    HARNESS_DEVICE_PENDING_AGGREGATE_SHARE. harness-hook's client is everyone's, so one
    cap over all networks let a few of them (each within its
    HARNESS_DEVICE_AUTHORIZATIONS_PER_NETWORK) keep it full, and nobody's `harness-hook
    login` got a code: now the networks holding many are refused first, and the second
    half of the places stays for those that hold few; and one holder of many networks
    (an IPv6 /32's 65,536 /48s) is refused once its block holds its share. Counted with
    a LIMIT, over DeviceGrant's client_id index: requests at the same moment may each pass
    the count, so the cap may be passed by the requests in flight."""
    cap = settings.HARNESS_DEVICE_PENDING_MAX
    if not cap:
        return None
    pending = DeviceGrant.objects.filter(
        client_id=client_id,
        status=DeviceGrant.AUTHORIZATION_PENDING,
        expires__gt=timezone.now(),
    )
    held = pending[:cap].count()
    if held < cap // 2:
        return None
    if held < cap:
        shares = (
            ("network", network, settings.HARNESS_DEVICE_PENDING_SHARE, "network"),
            (
                "aggregate",
                aggregate,
                settings.HARNESS_DEVICE_PENDING_AGGREGATE_SHARE,
                "block of networks",
            ),
        )
        for field, block, share, noun in shares:
            of_block = pending.filter(**{f"harness_resource__{field}": block})
            if of_block[:share].count() >= share:
                return _share_taken(of_block, (held, cap), share, noun, block)
        return None
    wait = _seconds_until_oldest_expires(pending)
    return _try_again_later(
        f"Too many device codes of this client are waiting for approval: {cap} at once. "
        f"Try again in {wait} seconds, when the oldest expires (or sooner, once one of them "
        "is approved or denied).",
        wait,
    )


def _share_taken(
    of_block: Any, held: tuple[int, int], share: int, noun: str, block: str
) -> JsonResponse:
    """The 429 for a network (or a block of networks, `noun`) that holds its `share` of the
    client's pending codes while half of them are taken (`held`: how many, of the cap):
    it waits for its own oldest code."""
    wait = _seconds_until_oldest_expires(of_block)
    return _try_again_later(
        f"Too many device codes of this client are waiting for approval ({held[0]}, of at "
        f"most {held[1]}), and this {noun} ({block}) holds {share} of them: while half the "
        f"client's places are taken, a {noun} holding {share} gets no "
        f"more, so that other networks can still sign in. Try again in "
        f"{wait} seconds, when this {noun}'s oldest code expires (or sooner, once one "
        "of them is approved or denied).",
        wait,
    )


def _seconds_until_oldest_expires(pending: Any) -> int:
    oldest = pending.order_by("expires").values_list("expires", flat=True).first()
    return int((oldest - timezone.now()).total_seconds()) + 1 if oldest else 1


class DeviceAuthorizationView(oauth_views.DeviceAuthorizationView):  # type: ignore[misc]
    """/oauth/device-authorization/ (RFC 8628), django-oauth-toolkit's, made to work with
    oauthlib 4: oauthlib 4.0 adds `scope` to the device authorization response, which
    django-oauth-toolkit 3.4.1's DeviceCodeResponse does not take (a TypeError, a 500, on
    every request). The scope is not an RFC 8628 field; the grant keeps the requested or
    default scope either way.

    No one is signed in here and every code is a row pending for 30 minutes, so codes are
    bounded per address and per network (allauth's rate limiter, in the cache) and per
    client in the database (_pending_full: HARNESS_DEVICE_PENDING_MAX pending at once, and
    once half of them are, HARNESS_DEVICE_PENDING_SHARE per network and
    HARNESS_DEVICE_PENDING_AGGREGATE_SHARE per block of networks).

    Each code is stored with the resource (RFC 8707) it was asked for, the hooks API when
    none (agentauth.validators.device_code_resource): its token is for that one only."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """Only a client registered for the device grant (harness-hook's, or one an admin
        made) gets device codes: the device page names `harness-hook login`, and a client
        whose metadata document registered it for authorization codes would have its own
        name approved there. Looked up without fetching any document (no one is signed in
        here)."""
        refused = _address_refused(request) or _holds_nul(request)
        if refused is not None:
            return refused
        client_id = request.POST.get("client_id", "")
        grant_type = (
            get_application_model()
            .objects.filter(client_id=client_id)
            .values_list("authorization_grant_type", flat=True)
            .first()
            if client_id
            else None
        )
        if grant_type is None:
            return JsonResponse(
                {"error": "invalid_client", "error_description": "Unknown client_id."},
                status=401,
            )
        if grant_type != DEVICE_CODE_GRANT:
            return JsonResponse(
                {
                    "error": "unauthorized_client",
                    "error_description": "This client is not registered for the device "
                    "authorization grant.",
                },
                status=400,
            )
        # (cut to DeviceResource.network's length: an address read from a header may be
        # anything, and is counted as stored)
        address = str(get_adapter(request).get_client_ip(request))
        network, aggregate = device_network(address)[:64], device_aggregate(address)[:64]
        full = _pending_full(client_id, network, aggregate)
        if full is not None:
            return full
        origin = f"{'https' if request.is_secure() else 'http'}://{request.get_host()}"
        try:
            resource = device_code_resource(origin, request.POST.getlist("resource"))
        except ValueError as refused:
            answer = {"error": "invalid_target", "error_description": str(refused)}
            return JsonResponse(answer, status=400)
        with transaction.atomic():  # the code is stored with its resource, or not at all
            response: HttpResponse = super().post(request, *args, **kwargs)
            if response.status_code == 200:
                device_code = json.loads(response.content)["device_code"]
                services.bind_device_resource(
                    device_code=device_code,
                    resource=resource,
                    network=network,
                    aggregate=aggregate,
                )
        return response

    def create_device_authorization_response(self, request: HttpRequest) -> Any:
        headers, response, status = super().create_device_authorization_response(request)
        if status == 200 and isinstance(response, dict):
            response.pop("scope", None)
        return headers, response, status


device_authorization = DeviceAuthorizationView.as_view()


# A device's polls of a pending code one second short of the interval are let through
# (a device that waits the interval reaches Harness a little after it).
POLL_SLACK = timedelta(seconds=1)


def _polled_too_soon(device_code: str) -> bool:
    """Whether the device polls its pending code sooner than DEVICE_FLOW_INTERVAL after its
    last poll (or the code's issue): RFC 8628 3.5's slow_down, which django-oauth-toolkit
    leaves to do. A poll let through is the new mark (a conditional update: of polls at
    the same moment one passes); a refused one is not, so a device that waits as told gets
    through. An approved code is never slowed: its exchange is the device's last poll."""
    interval = timedelta(seconds=oauth2_settings.DEVICE_FLOW_INTERVAL)
    now = timezone.now()
    pending = DeviceGrant.objects.filter(
        device_code=device_code, status=DeviceGrant.AUTHORIZATION_PENDING
    )
    if pending.filter(last_checked__lte=now - interval + POLL_SLACK).update(last_checked=now):
        return False
    return bool(pending.exists())


class TokenView(oauth_views.TokenView):  # type: ignore[misc]
    """/oauth/token/, django-oauth-toolkit's, with a device code grant request that names
    no device code answered as the invalid request it is (django-oauth-toolkit 3.4.1 reads
    the parameter unguarded: a KeyError, a 500), and a refresh token another request
    rotated at the same moment answered invalid_grant: django-oauth-toolkit answers such a
    request with the winner's tokens as stored, which are hashed at rest (RFC 9700), then
    looks the hashed value up as a token (a DoesNotExist, a 500)."""

    def authorization_flow_token_response(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        try:
            response: HttpResponse = super().authorization_flow_token_response(
                request, *args, **kwargs
            )
        except AccessToken.DoesNotExist:
            # A code's token deleted as it was written: its agent's sign-out committed
            # just after it (agentauth.validators._still_bound).
            why = (
                UNBOUND_CODE
                if request.POST.get("grant_type") in CODE_GRANTS
                else (
                    "This refresh token was used by another request at the same moment; use "
                    "the tokens that request got."
                )
            )
            return JsonResponse({"error": "invalid_grant", "error_description": why}, status=400)
        if response.status_code >= 400 and response.content.startswith(b"{"):
            # An error the validator raised while saving the tokens comes without
            # oauthlib's JSON headers (the refresh token rotated by another request).
            response["Content-Type"] = "application/json"
            response["Cache-Control"] = "no-store"
        return response

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _holds_nul(request)  # (PostgreSQL refuses it in a lookup: a 500)
        if refused is not None:
            return refused
        if request.POST.get("grant_type") == DEVICE_CODE_GRANT:
            if not request.POST.get("device_code"):
                return JsonResponse(
                    {"error": "invalid_request", "error_description": "Missing device_code."},
                    status=400,
                )
            if _polled_too_soon(request.POST["device_code"]):
                return JsonResponse(
                    {
                        "error": "slow_down",
                        "error_description": "Polled sooner than the interval the device "
                        f"authorization answered ({oauth2_settings.DEVICE_FLOW_INTERVAL} "
                        "seconds): wait 5 seconds more between polls from now on.",
                    },
                    status=400,
                    headers={"Cache-Control": "no-store"},
                )
        return super().post(request, *args, **kwargs)  # type: ignore[no-any-return]


token = TokenView.as_view()


class RevokeTokenView(oauth_views.RevokeTokenView):  # type: ignore[misc]
    """/oauth/revoke/ (RFC 7009), django-oauth-toolkit's, with a NUL character in a
    parameter answered 400 (PostgreSQL refuses it in the client's lookup: a 500)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = _holds_nul(request)
        if refused is not None:
            return refused
        return super().post(request, *args, **kwargs)  # type: ignore[no-any-return]


revoke_token = RevokeTokenView.as_view()


# Clients registered (RFC 7591, with HARNESS_OAUTH_DYNAMIC_REGISTRATION), counted per person
# by allauth's rate limiter (settings: HARNESS_OAUTH_REGISTRATIONS_PER_HOUR).
CLIENT_REGISTRATION_ACTION = "harness_client_registration"
_REGISTRABLE_GRANTS = {"authorization_code", "refresh_token"}


def _metadata_refused(error: str, description: str) -> JsonResponse:
    return JsonResponse(
        {"error": error, "error_description": description},
        status=400,
        headers={"Cache-Control": "no-store"},
    )


def _unservable(body: bytes) -> JsonResponse | None:
    """The 400 for client metadata Harness would not serve as a metadata document's client
    (agentauth.cimd): a confidential client (the token endpoint checks no secret, `none`
    only), a grant other than the authorization code's (client credentials have no person
    behind them; the device grant is harness-hook's), a redirect in plain http off the
    loopback interface. None otherwise (django-oauth-toolkit checks the rest)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("token_endpoint_auth_method") != "none":
        return _metadata_refused(
            "invalid_client_metadata",
            'Harness registers public clients only: send "token_endpoint_auth_method": '
            '"none" (the sign-in uses PKCE; no client secret is issued or checked).',
        )
    grants = data.get("grant_types", ["authorization_code"])
    if not isinstance(grants, list) or not set(map(str, grants)) <= _REGISTRABLE_GRANTS:
        return _metadata_refused(
            "invalid_client_metadata",
            "Harness registers clients of the authorization_code grant (with refresh_token) "
            "only: a person consents to each sign-in. Devices sign in with `harness-hook "
            "login`.",
        )
    uris = data.get("redirect_uris")
    for uri in uris if isinstance(uris, list) else []:
        if isinstance(uri, str) and not redirect_allowed(uri):
            return _metadata_refused(
                "invalid_redirect_uri",
                f"The redirect URI {uri[:200]!r} is refused: a redirect must be https, or "
                "http on the loopback interface (127.0.0.1, [::1], localhost).",
            )
    return None


class ClientRegistrationView(DynamicClientRegistrationView):  # type: ignore[misc]
    """/oauth/register/ (RFC 7591), django-oauth-toolkit's, for signed-in people (its
    IsAuthenticatedDCRPermission, with the CSRF check for a session): only a client
    Harness serves (_unservable), and at most HARNESS_OAUTH_REGISTRATIONS_PER_HOUR per
    person (each one a row, with a registration token that never expires)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return super().post(request, *args, **kwargs)  # type: ignore[no-any-return]
        refused = _unservable(request.body)
        if refused is not None:
            return refused
        # The person's row locked from the check to the count: registrations sent at once
        # each passed the check before any was counted (16 at once: 15 stored).
        with transaction.atomic():
            locked = get_user_model().objects.select_for_update().filter(pk=request.user.pk)
            list(locked.values_list("pk", flat=True))
            return self._register_within_bound(request, *args, **kwargs)

    def _register_within_bound(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        if not ratelimit.consume(request, action=CLIENT_REGISTRATION_ACTION, dry_run=True):
            return _try_again_later(
                f"Too many clients registered: at most "
                f"{settings.HARNESS_OAUTH_REGISTRATIONS_PER_HOUR} clients an hour per person. "
                "Use a client you registered already, or try again in an hour.",
                3600,
            )
        response: HttpResponse = super().post(request, *args, **kwargs)
        if response.status_code == 201:  # (a request refused, or cross-site, counts none)
            ratelimit.consume(request, action=CLIENT_REGISTRATION_ACTION)
        return response


client_registration = ClientRegistrationView.as_view()


class ClientConfigurationView(DynamicClientRegistrationManagementView):  # type: ignore[misc]
    """/oauth/register/<client_id>/ (RFC 7592) with its registration token: read or
    delete the client. Its metadata is not rewritten (PUT, 405): a change would skip the
    checks registration makes; register the client again instead."""

    http_method_names = ["get", "delete", "options"]

    def delete(self, request: HttpRequest, client_id: str, *args: Any, **kwargs: Any) -> Any:
        """The client deleted, and each agent a person approved for it revoked
        (services.delete_client), by the person whose registration token this is."""
        auth = self._authenticate_registration_request(request, client_id)
        if isinstance(auth, HttpResponse):
            return auth
        user = getattr(getattr(auth, "registration_token", None), "user", None)
        actor = f"user:{user.get_username()}" if user is not None else f"client:{client_id}"
        services.delete_client(application=auth.application, actor=actor)
        return HttpResponse(status=204)


client_configuration = ClientConfigurationView.as_view()
