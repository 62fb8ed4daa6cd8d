"""/agents/: agents and their tokens, for admins: an organization admin's every agent, a
team admin's their teams' agents only (the reach `role_required` read, teams.scope).

Every change goes through `dispatcher.agents` (the service the management commands call),
which writes its audit event. A token is shown once, in the answer to the POST that made
it (never stored, never put in a redirect or the session), with `Cache-Control: no-store`.
"""

from __future__ import annotations

import shlex
from typing import Any

from django.apps import apps
from django.contrib import messages
from django.contrib.auth.models import User
from django.db import IntegrityError
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet, Subquery
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from audit.roles import ADMIN, HtmxHttpRequest, role_required
from dispatcher import agents
from dispatcher.models import Agent, AgentSession, ToolCall
from dispatcher.policy.profiles import profile_for
from dispatcher.tools._paths import unsafe_character
from floor.errors import ServiceError
from teams.models import Team
from teams.scope import wholly_within

RECENT_SESSIONS = 20
MAX_NAME = 100


def _actor(request: HtmxHttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _owners() -> list[User]:
    return list(User.objects.filter(is_active=True).order_by("username"))


def _agents(request: HtmxHttpRequest) -> Any:
    """The agents this admin manages (another team's agent is not found, 404)."""
    return request.reach.filter(Agent.objects.all(), "team_id")


def _with_sign_in(rows: QuerySet[Agent]) -> Any:
    """`rows` with how a client's signed-in agent is signed in, which the pages show in place
    of its token prefix (templates/components/agent_token.html): its bearer token is one
    nobody was shown, and after "Sign out" its prefix starts with SIGNED_OUT_PREFIX.
    `via_client`: signed in by its owner's client (OAuth consent, `harness-hook login`);
    `holds_oauth`: an OAuth token of it is left. (agentauth's rows, by name: that app is
    above this one.)"""
    link = apps.get_model("agentauth", "AgentClient")._default_manager
    token = apps.get_model("agentauth", "AgentToken")._default_manager
    return rows.annotate(
        via_client=Exists(link.filter(agent=OuterRef("pk"))),
        holds_oauth=Exists(token.filter(agent=OuterRef("pk"))),
    )


def _teams(request: HtmxHttpRequest) -> list[Team]:
    """The teams this admin may make agents for."""
    return list(request.reach.filter(Team.objects.all(), "pk"))


def _default_team(request: HtmxHttpRequest) -> Team | None:
    """The team a form names by default: the default team when this admin reaches it,
    else their only team (None: they must choose)."""
    if request.reach.everything:
        return Team.objects.default()
    teams = _teams(request)
    default = next((t for t in teams if t.is_default), None)
    return default or (teams[0] if len(teams) == 1 else None)


@role_required(ADMIN)
@require_http_methods(["GET", "POST"])
@never_cache
def agent_list(request: HtmxHttpRequest) -> HttpResponse:
    """GET: every agent with its owner, sessions and state. POST: create one (its token
    shown once on the answer), or re-render with what to fix (400)."""
    default = _default_team(request)
    form = {
        "name": "",
        "owner": request.user.get_username(),
        "workspace": "",
        "team": default.name if default else "",
    }
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form}
        form["team"] = form["team"] or (default.name if default else "")
        agent, token, error = _create(request, form)
        if agent is not None:
            return _detail(request, agent, token=token)
        return _list(request, form, error=error, status=400)
    return _list(request, form)


def _create(request: HtmxHttpRequest, form: dict[str, str]) -> tuple[Agent | None, str, str]:
    if not form["name"] or len(form["name"]) > MAX_NAME:
        return None, "", f"Give the agent a name of 1 to {MAX_NAME} characters."
    owner = User.objects.filter(username=form["owner"], is_active=True).first()
    if owner is None:
        return None, "", "Choose the user who owns the agent (an active user)."
    team = next((t for t in _teams(request) if t.name == form["team"]), None)
    if team is None:
        return None, "", "Choose the agent's team (one of the teams you administer)."
    if not wholly_within(request.reach, owner):
        # The agent would run under that person's rules, which no team admin manages.
        return (
            None,
            "",
            (
                f"{owner.get_username()} is also in another team or holds an organization role: "
                "only an organization admin makes agents they own. Choose a person of your teams."
            ),
        )
    if form["workspace"] and not request.reach.everything:
        # A fixed workspace is a directory on the host, handed to the sandbox and written
        # by previews' applies: where it may be is the organization's to choose.
        return (
            None,
            "",
            "Only an organization admin gives an agent a fixed workspace: leave it empty "
            "(each session gets a fresh one).",
        )
    if Agent.objects.filter(owner=owner, name=form["name"]).exists():
        return None, "", f"{owner.get_username()} already has an agent named '{form['name']}'."
    try:
        agent, token = agents.create_agent(
            owner=owner,
            name=form["name"],
            workspace=form["workspace"],
            actor=_actor(request),
            team=team,
            shown_to=request.user,
        )
    except IntegrityError:
        return None, "", f"{owner.get_username()} already has an agent named '{form['name']}'."
    except ServiceError as refused:
        return None, "", str(refused)
    except OSError as problem:
        return None, "", f"The workspace cannot be used: {problem.strerror or problem}."
    return agent, token, ""


def _list(
    request: HtmxHttpRequest, form: dict[str, str], *, error: str = "", status: int = 200
) -> HttpResponse:
    # Counted over the sessions of the teams this admin reaches: an agent moved here from
    # another team ran its earlier sessions for that team (AgentSession.team), whose
    # number and times are that team's to know, as on the agent's page (`_detail`).
    reached = (
        None
        if request.reach.everything
        else Q(sessions__team_id__in=sorted(request.reach.team_ids))
    )
    rows = (
        _with_sign_in(_agents(request))
        .select_related("owner", "team")
        .annotate(
            session_count=Count("sessions", filter=reached),
            last_session=Max("sessions__created_at", filter=reached),
        )
        .order_by("-is_active", "owner__username", "name")
    )
    context = {
        "agents": rows,
        "form": form,
        "error": error,
        "owners": _owners(),
        "teams": _teams(request),
    }
    return render(request, "agents/index.html", context, status=status)


def shell_word(text: str) -> str:
    """`text` as one word for the shell command a person copies from the page. A name with
    a control, format or line-separator character (an OAuth client names its agents: a
    right-to-left override reversed the command shown) is written in bash's $'...' with
    each such character as an escape, so the command shows what it runs and runs as is."""
    if unsafe_character(text) is None:
        return shlex.quote(text)
    escaped = "".join(_escaped(char) for char in text)
    return f"$'{escaped}'"


def _escaped(char: str) -> str:
    """One character of a bash $'...' word."""
    if char in "\\'":
        return "\\" + char
    if unsafe_character(char) is None:
        return char
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


@role_required(ADMIN)
@require_GET
@never_cache
def agent_detail(request: HtmxHttpRequest, agent_id: int) -> HttpResponse:
    agent = get_object_or_404(_agents(request).select_related("owner", "team"), pk=agent_id)
    return _detail(request, agent)


def _detail(request: HtmxHttpRequest, agent: Agent, *, token: str = "") -> HttpResponse:
    """The agent's page: state, owner's mode, its newest sessions with their last call,
    and how to connect. `token` (just made) is shown once."""
    last_call = ToolCall.objects.filter(session=OuterRef("pk")).order_by("-created_at")
    # Sessions of the teams this admin reaches: those the agent ran for a team it has left
    # are that team's (AgentSession.team), titles included.
    own = request.reach.filter(AgentSession.objects.filter(agent=agent), "team_id")
    latest = own.annotate(last_call=Subquery(last_call.values("created_at")[:1]))
    sessions = list(latest.order_by("-created_at")[:RECENT_SESSIONS])
    # Counted for these sessions only, on the (session, created_at) index.
    counts = dict(
        ToolCall.objects.filter(session__in=[s.pk for s in sessions])
        .order_by()
        .values_list("session")
        .annotate(n=Count("id"))
    )
    for session in sessions:
        session.call_count = counts.get(session.pk, 0)  # type: ignore[attr-defined]
    activity = [s.last_call or s.created_at for s in sessions]
    base = request.build_absolute_uri("/").rstrip("/")
    signed_in = _with_sign_in(Agent.objects.filter(pk=agent.pk)).values("via_client", "holds_oauth")
    for flag, value in (signed_in.first() or {}).items():
        setattr(agent, flag, value)
    context: dict[str, Any] = {
        "agent": agent,
        "token": token,
        "sessions": sessions,
        "session_total": own.count(),
        "last_activity": max(activity, default=None),
        # A person's mode is part of their rules: read by the admins who manage them only
        # (a team admin, for an owner wholly inside their teams; policy.views).
        "owner_mode": profile_for(agent.owner).mode
        if wholly_within(request.reach, agent.owner)
        else "",
        "base_url": base,
        "agent_arg": shell_word(agent.name),
    }
    response = render(request, "agents/detail.html", context)
    response["Cache-Control"] = "no-store"
    return response


@role_required(ADMIN)
@require_POST
def agent_rotate(request: HtmxHttpRequest, agent_id: int) -> HttpResponse:
    """A new token for the agent, shown once; the old one stops working now. A team admin
    rotates the tokens only of agents whose owner is wholly inside their teams, the people
    they make agents for (a new token is a new credential acting as that person's agent)."""
    agent = get_object_or_404(_agents(request).select_related("owner", "team"), pk=agent_id)
    if not wholly_within(request.reach, agent.owner):
        return HttpResponseForbidden(
            f"{agent.owner.get_username()} is also in another team or holds an organization "
            "role: only an organization admin makes a token for an agent they own.",
            content_type="text/plain; charset=utf-8",
        )
    try:
        token = agents.rotate_token(agent=agent, actor=_actor(request), shown_to=request.user)
    except ServiceError as problem:
        messages.error(request, str(problem))
        return redirect("agents:detail", agent_id=agent.pk)
    return _detail(request, agent, token=token)


@role_required(ADMIN)
@require_POST
def agent_revoke(request: HtmxHttpRequest, agent_id: int) -> HttpResponse:
    agent = get_object_or_404(_agents(request), pk=agent_id)
    agents.revoke_agent(agent=agent, actor=_actor(request))
    messages.success(request, f"Revoked agent '{agent.name}': its token no longer works.")
    return redirect("agents:detail", agent_id=agent.pk)
