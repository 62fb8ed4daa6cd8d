"""/teams/: the teams, their members and agents, for admins.

An organization admin sees every team, makes teams and changes any team's members; a
team's admin sees their teams only and changes their members (teams.scope, read with the
role by `role_required` as `request.reach`). Another team is not found (404). Every
change goes through `teams.services`, the one write path the commands use, with its
audit event; each form is a CSRF-protected POST.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from audit.roles import ADMIN, HtmxHttpRequest, role_required

from . import services
from .models import Membership, Team, TeamRole

ONLY_ORG_ADMINS = "Only organization admins make teams."
NOT_YOURSELF = (
    "You cannot give yourself a role in your team: an organization admin gives a team's "
    "admins their roles (you would otherwise review or audit the agents you manage)."
)


def _actor(request: HtmxHttpRequest) -> str:
    return f"user:{request.user.get_username()}"


def _teams(request: HtmxHttpRequest) -> object:
    members = Membership.objects.select_related("user").order_by("user__username", "role")
    return (
        request.reach.filter(Team.objects.all(), "pk")
        .prefetch_related(Prefetch("memberships", queryset=members))
        .order_by("name")
    )


@role_required(ADMIN)
@require_GET
def index(request: HtmxHttpRequest) -> HttpResponse:
    context = {
        "teams": _teams(request),
        "may_create": request.reach.everything,
        "team_roles": TeamRole.values,
    }
    return render(request, "teams/index.html", context)


@role_required(ADMIN)
@require_POST
def create(request: HtmxHttpRequest) -> HttpResponse:
    if not request.reach.everything:
        raise PermissionDenied(ONLY_ORG_ADMINS)
    name = request.POST.get("name", "").strip()
    try:
        team = services.create_team(name=name, actor=_actor(request))
    except services.TeamError as problem:
        messages.error(request, str(problem))
        return redirect("teams:index")
    messages.success(request, f"Created team '{team.name}'.")
    return redirect("teams:detail", team_id=team.pk)


def _team(request: HtmxHttpRequest, team_id: int) -> Team:
    team: Team = get_object_or_404(request.reach.filter(Team.objects.all(), "pk"), pk=team_id)
    return team


@role_required(ADMIN)
@require_GET
def detail(request: HtmxHttpRequest, team_id: int) -> HttpResponse:
    team = _team(request, team_id)
    context = {
        "team": team,
        "members": team.memberships.select_related("user").order_by("user__username", "role"),
        "agents": team.agents.select_related("owner").order_by("name"),
        "team_roles": TeamRole.values,
        "escalation": services.escalation_text(team),
        "users": User.objects.filter(is_active=True).order_by("username"),
    }
    return render(request, "teams/detail.html", context)


def _member_change(request: HtmxHttpRequest, team_id: int, *, add: bool) -> HttpResponse:
    team = _team(request, team_id)
    username = request.POST.get("user", "").strip()
    role = request.POST.get("role", "").strip()
    user = User.objects.filter(username=username).first()
    if user is None:
        messages.error(request, f"No user named '{username[:150]}'.")
        return redirect("teams:detail", team_id=team.pk)
    if add and user.pk == request.user.pk and not request.reach.everything:
        return HttpResponseForbidden(NOT_YOURSELF, content_type="text/plain; charset=utf-8")
    change = services.add_member if add else services.remove_member
    try:
        changed = change(team=team, user=user, role=role, actor=_actor(request))
    except services.TeamError as problem:
        messages.error(request, str(problem))
        return redirect("teams:detail", team_id=team.pk)
    who = user.get_username()
    if add:
        text = (
            f"{who} is now {role} of team '{team.name}'."
            if changed
            else f"{who} is already {role} of team '{team.name}'."
        )
    else:
        text = (
            f"{who} is no longer {role} of team '{team.name}'."
            if changed
            else f"{who} was not {role} of team '{team.name}'."
        )
    messages.success(request, text)
    return redirect("teams:detail", team_id=team.pk)


@role_required(ADMIN)
@require_POST
def add_member(request: HtmxHttpRequest, team_id: int) -> HttpResponse:
    return _member_change(request, team_id, add=True)


@role_required(ADMIN)
@require_POST
def remove_member(request: HtmxHttpRequest, team_id: int) -> HttpResponse:
    return _member_change(request, team_id, add=False)
