"""/permissions/: users' modes and rules, history, simulator, backtest and session grants.

Admins only (superuser, the "admin" group, or a team's admins), by Django session. Agent
bearer tokens are never looked at here, so an agent reaches these URLs as an anonymous
user. A team's admin reaches the people of their teams (members, and owners of the
teams' agents), those teams' agents, calls and grants, and nothing of another team
(`request.reach`, read with the role; teams.scope): another team's person, session or
grant is not found (404).
"""

from __future__ import annotations

import functools
import json
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.db.models import Q
from django.http import Http404, HttpResponse, HttpResponseForbidden, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from audit.roles import ADMIN, HtmxHttpRequest, role_required
from dispatcher import analytics, simulation
from dispatcher.models import Agent, AgentSession, ToolCall
from dispatcher.policy import editor, grants, managed, profiles
from dispatcher.policy.context import Profile
from dispatcher.policy.models import Mode, PolicyLayer, ProfileVersion, SessionGrant
from dispatcher.policy.profiles import profile_for
from dispatcher.tools.base import Tool
from dispatcher.tools.registry import all_tools
from floor.errors import ServiceError
from teams.scope import Scope, org_holds, wholly_within, wholly_within_people

PAGE = "permissions/user.html"
RECENT_CALLS = 50


def preview(arguments: Any, limit: int = 120) -> str:
    """Arguments as one line of ASCII JSON: invisible and bidi characters stay visible."""
    text = json.dumps(arguments, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diff_lines(diff: dict[str, Any]) -> list[tuple[str, str]]:
    """A version's diff as (sign, text) lines for the history table."""
    lines: list[tuple[str, str]] = []
    if "mode" in diff:
        lines.append(("~", f"mode: {diff['mode'][0]} → {diff['mode'][1]}"))
    for name in profiles.LISTS:
        change = diff.get(name) or {}
        lines += [("+", f"{name}: {profiles.entry_line(r)}") for r in change.get("added", [])]
        lines += [("-", f"{name}: {profiles.entry_line(r)}") for r in change.get("removed", [])]
        if change.get("order"):
            lines.append(("~", f"{name}: reordered"))
    return lines


# --- Reach ------------------------------------------------------------------------------


def _people(reach: Scope) -> Any:
    """The people whose rules this admin manages: their teams' members and the owners of
    their teams' agents (everyone for an organization admin)."""
    return reach.filter_any(User.objects.all(), "team_memberships__team_id", "agents__team_id")


def _subject(request: HtmxHttpRequest, user_id: int | str) -> User:
    if not str(user_id).isdigit():  # (a form's `user` that names no one: 404, not a 500)
        raise Http404("No such person.")
    subject: User = get_object_or_404(_people(request.reach), pk=user_id)
    return subject


OTHER_TEAMS = (
    "{name} is also in another team (a member, or the owner of its agents) or holds an "
    "organization role, and their rules govern all of their agents: only an organization "
    "admin reads and changes them."
)


def _refusal_to_change(request: HtmxHttpRequest, subject: User) -> str:
    """Why this admin may not read or change `subject`'s rules ("" when they may): a team
    admin reads and changes those of people wholly inside their teams only
    (teams.scope.wholly_within), since a person's rules govern all of their agents (and
    say what another team runs, allows and watches for)."""
    if wholly_within(request.reach, subject):
        return ""
    return OTHER_TEAMS.format(name=subject.get_username())


def _tools(reach: Scope) -> tuple[Tool, ...]:
    """The tools this admin's people may be given rules for: a team admin does not see the
    names of another team's MCP servers' tools."""
    if reach.everything:
        return all_tools()
    by_name = {t.name: t for team in sorted(reach.team_ids) for t in all_tools(team)}
    return tuple(by_name.values())


def _checked_against(
    reach: Scope, tools: tuple[Tool, ...] | None = None
) -> tuple[Tool, ...] | None:
    """The tools a team admin's rules are checked against: their teams' (a rule naming
    another team's server's tool is refused as naming no tool, never listed among the known
    ones); None, the registry, for an organization admin. `tools`: `_tools(reach)` when
    the caller built it already."""
    if reach.everything:
        return None
    return tools if tools is not None else _tools(reach)


def _team_agents(reach: Scope) -> Any:
    return reach.filter(Agent.objects.all(), "team_id")


def _team_grants(reach: Scope) -> Any:
    return reach.filter(SessionGrant.objects.all(), "session__team_id")


# --- Index ------------------------------------------------------------------------------


@role_required(ADMIN)
@require_GET
def index(request: HtmxHttpRequest) -> HttpResponse:
    users = _people(request.reach).order_by("username").select_related("permission_profile")
    agents: dict[int, list[Agent]] = {}
    for agent in _team_agents(request.reach).order_by("name"):
        agents.setdefault(agent.owner_id, []).append(agent)
    managed = set(wholly_within_people(request.reach, users).values_list("pk", flat=True))
    rows: list[dict[str, Any]] = []
    for user in users:
        if user.pk not in managed:  # named with their agents here, their rules not shown
            rows.append({"user": user, "agents": agents.get(user.pk, [])})
            continue
        profile = profile_for(user)
        rows.append(
            {
                "user": user,
                "profile": profile,
                "counts": {n: len(getattr(profile, n)) for n in profiles.LISTS},
                "agents": agents.get(user.pk, []),
            }
        )
    return render(
        request,
        "permissions/index.html",
        {
            "rows": rows,
            "grants": _grants(_team_grants(request.reach).active()),
            "next": request.path,
        },
    )


def _grants(queryset: Any) -> list[SessionGrant]:
    return list(queryset.select_related("session__agent__owner", "granted_by", "revoked_by"))


# --- One user's profile -----------------------------------------------------------------


def _form_from_post(data: QueryDict) -> dict[str, str]:
    """The text form (mode, one rule per line per list, version). A post from the rows
    editor (`rows` set) fills the lists from its rows."""
    form = {name: data.get(name, "") for name in ("mode", *profiles.LISTS)}
    form["version"] = data.get("version", "")
    if data.get("rows"):
        lists = editor.lists_from_rows(editor.rows_from_post(data))
        form |= {n: "\n".join(editor.rule_text(e) for e in lists[n]) for n in profiles.LISTS}
    return form


def _form_from_profile(profile: Profile) -> dict[str, str]:
    # Objects (quorum, log-only) as one line of JSON each, as clean_rules reads them back.
    form = {
        n: "\n".join(profiles.entry_line(e) for e in editor.profile_entries(profile, n))
        for n in profiles.LISTS
    }
    return form | {"mode": profile.mode, "version": str(profile.version)}


def _lists(data: QueryDict, form: dict[str, str]) -> dict[str, list[Any]]:
    """The posted lists: the rows' entries (objects kept whole), or the text's lines."""
    if data.get("rows"):
        return editor.lists_from_rows(editor.rows_from_post(data))
    return {name: form[name].splitlines() for name in profiles.LISTS}


def _proposed(subject: User, form: dict[str, str], data: QueryDict | None, reach: Scope) -> Profile:
    """InvalidProfile when the form's rules do not validate (a team admin's against their
    teams' tools, as when saved: `_checked_against`)."""
    lists = (
        _lists(data, form)
        if data is not None
        else {name: form[name].splitlines() for name in profiles.LISTS}
    )
    return profiles.proposed_profile(subject, form["mode"], **lists, tools=_checked_against(reach))


def _same(a: Profile, b: Profile) -> bool:
    return all(getattr(a, n) == getattr(b, n) for n in ("mode", "quorum", "trial", *profiles.LISTS))


def _page(
    request: HtmxHttpRequest,
    subject: User,
    form: dict[str, str] | None = None,
    status: int = 200,
    rows: list[editor.Row] | None = None,
    **extra: Any,
) -> HttpResponse:
    profile = profile_for(subject)
    if rows is None:
        rows = editor.rows_from_profile(profile)
    rows = rows + [editor.Row("allow", "") for _ in range(editor.BLANK_ROWS)]
    history = ProfileVersion.objects.filter(user=subject).select_related("changed_by")
    tools = _tools(request.reach)
    calls = (
        request.reach.filter(ToolCall.objects.all(), "session__team_id")
        .filter(session__agent__owner=subject)
        .exclude(arguments__isnull=True)
        .order_by("-created_at")[:RECENT_CALLS]
    )
    context = {
        "subject": subject,
        "profile": profile,
        "form": form or _form_from_profile(profile),
        "modes": Mode.choices,
        "history": [(v, diff_lines(v.diff)) for v in history],
        "agents": _team_agents(request.reach).filter(owner=subject).order_by("name"),
        "grants": _grants(
            _team_grants(request.reach).active().filter(session__agent__owner=subject)
        ),
        "calls": [(c, preview(c.arguments, 60)) for c in calls],
        "tools": [tool.name for tool in tools],
        "rows": rows,
        "actions": editor.ACTIONS,
        "tool_choices": editor.tool_choices(rows, tools),
        "next": request.path,
        **extra,
    }
    return render(request, PAGE, context, status=status)


@role_required(ADMIN)
@require_http_methods(["GET", "POST"])
def user_profile(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """GET the editor; POST saves (PRG), or re-renders with each bad pattern named (400/409)."""
    actor = request.user
    subject = _subject(request, user_id)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    if request.method == "GET":
        return _page(request, subject)
    form = _form_from_post(request.POST)
    rows = editor.rows_from_post(request.POST) if request.POST.get("rows") else None
    # Errors in the text form open it again; errors in the rows show on their rows.
    where: dict[str, Any] = {"rows": rows} if rows is not None else {"text_open": True}
    if rows is not None and any(row.problems for row in rows):
        problems = [p for row in rows for p in row.problems]
        return _page(request, subject, form, status=400, errors=problems, **where)
    try:
        expected = int(form["version"]) if form["version"] else None
        profile = profiles.update_profile(
            user=subject,
            mode=form["mode"],
            actor=actor,
            expected_version=expected,
            tools=_checked_against(request.reach),
            **_lists(request.POST, form),
        )
    except profiles.InvalidProfile as invalid:
        if rows is not None:
            editor.check_rows(rows, _checked_against(request.reach))
        return _page(request, subject, form, status=400, errors=invalid.problems, **where)
    except (profiles.StaleProfile, ValueError) as stale:
        return _page(request, subject, form, status=409, errors=[str(stale)], **where)
    messages.success(request, f"Saved {subject.get_username()}'s profile as v{profile.version}.")
    return redirect("permissions:user", user_id=subject.pk)


def _partial_or_page(
    request: HtmxHttpRequest, subject: User, form: dict[str, str], partial: str, **extra: Any
) -> HttpResponse:
    if request.htmx:
        return render(request, f"{PAGE}#{partial}", {"subject": subject, **extra})
    return _page(request, subject, form, **extra)


@role_required(ADMIN)
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets a fragment
def simulate(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """Decide one call (typed, or a past call of this user) under the saved rules and, when
    the form's rules differ, under those too. Stores nothing."""
    subject = _subject(request, user_id)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    form = _form_from_post(request.POST)
    extra: dict[str, Any] = {
        "sim_tool": request.POST.get("tool", ""),
        "sim_arguments": request.POST.get("arguments", ""),
    }
    try:
        extra |= _simulations(subject, request.POST, form, request.reach)
    except (ServiceError, ValueError) as problem:
        extra["sim_errors"] = getattr(problem, "problems", None) or [str(problem)]
    return _partial_or_page(request, subject, form, "simulation", **extra)


def _simulations(
    subject: User, data: QueryDict, form: dict[str, str], reach: Scope
) -> dict[str, Any]:
    saved = profile_for(subject)
    proposed = _proposed(subject, form, data, reach) if form["mode"] else saved
    call_id = data.get("call", "").strip()
    if call_id:
        call = _call_of(subject, call_id, reach)
        run = functools.partial(simulation.simulate_call, call)
        what = f"past call {call.name} {preview(call.arguments)} ({call.pk})"
    else:
        tool = data.get("tool", "").strip()
        try:
            arguments = json.loads(data.get("arguments") or "{}")
        except json.JSONDecodeError as error:
            raise ServiceError(f"The arguments are not valid JSON: {error}.") from None
        run = functools.partial(_simulate_typed, subject, tool, arguments, _team_of(subject, reach))
        what = f"{tool} {preview(arguments)}"
    results = [("saved rules", f"v{saved.version}", run(saved))]
    if not _same(saved, proposed):
        results.append(("rules in the form (unsaved)", f"v{proposed.version}", run(proposed)))
    return {"simulated": what, "results": results}


def _simulate_typed(
    subject: User, tool: str, arguments: Any, team_id: int | None, profile: Profile
) -> simulation.Simulation:
    return simulation.simulate(
        user=subject, tool=tool, arguments=arguments, profile=profile, team_id=team_id
    )


def _team_of(subject: User, reach: Scope) -> int | None:
    """The team a typed simulation is decided in, for a team admin one they reach (None:
    simulation.team_of's choice, for an organization admin): the team of the person's
    newest agent there, else one of their teams there. A team admin's simulation reads
    neither another team's layer (the default team's, for a person who owns no agent) nor
    its MCP servers' tools."""
    if reach.everything:
        return None
    ids = sorted(reach.team_ids)
    newest = (
        Agent.objects.filter(owner=subject, team_id__in=ids)
        .order_by("-created_at")
        .values_list("team_id", flat=True)
        .first()
    )
    if newest is not None:
        return int(newest)
    member = (
        subject.team_memberships.filter(team_id__in=ids)
        .order_by("team_id")
        .values_list("team_id", flat=True)
        .first()
    )
    return int(member) if member is not None else ids[0]


def _call_of(subject: User, call_id: str, reach: Scope) -> ToolCall:
    try:
        uuid = UUID(call_id)
    except ValueError:
        raise ServiceError(f"'{call_id}' is not a call id.") from None
    call = (
        reach.filter(ToolCall.objects.all(), "session__team_id")
        .filter(pk=uuid, session__agent__owner=subject)
        .select_related("session__agent__owner")
        .first()
    )
    if call is None:
        raise ServiceError(f"No call {call_id} of {subject.get_username()}'s agents.")
    return call


@role_required(ADMIN)
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets a fragment
def backtest(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """The past calls whose decision would change under the form's (unsaved) rules."""
    subject = _subject(request, user_id)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    form = _form_from_post(request.POST)
    extra: dict[str, Any] = {}
    try:
        result = simulation.backtest(
            user=subject,
            proposed=_proposed(subject, form, request.POST, request.reach),
            reach=request.reach,
        )
        extra["backtest"] = result
        extra["changes"] = [(c, preview(c.call.arguments)) for c in result.changes]
    except profiles.InvalidProfile as invalid:
        extra["backtest_errors"] = invalid.problems
    return _partial_or_page(request, subject, form, "backtest", **extra)


@role_required(ADMIN)
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets a fragment
def check_rules(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """Check the editor's rows as saving would, each on its own row (the rule named as the
    server names it), with the examples for each row's tool. Stores nothing."""
    subject = _subject(request, user_id)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    tools = _tools(request.reach)
    rows = editor.check_rows(
        editor.rows_from_post(request.POST), _checked_against(request.reach, tools)
    )
    choices = {c["name"]: c for c in editor.tool_choices(rows, tools)}
    context = {"subject": subject, "rows": rows, "choices": choices}
    if request.htmx:
        return render(request, f"{PAGE}#checks", context)
    form = _form_from_post(request.POST)
    problems = [p for row in rows for p in row.problems]
    return _page(request, subject, form, rows=rows, errors=problems or None)


@role_required(ADMIN)
@require_GET
@vary_on_headers("HX-Request")  # an htmx request gets a fragment
def blank_row(request: HtmxHttpRequest, user_id: int) -> HttpResponse:
    """One empty rule row for the editor (htmx); a page load goes to the editor."""
    subject = _subject(request, user_id)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    if not request.htmx:
        return redirect("permissions:user", user_id=subject.pk)
    action = request.GET.get("action", "allow")
    row = editor.Row(action if action in editor.ACTIONS else "allow", "")
    context = {
        "subject": subject,
        "row": row,
        "actions": editor.ACTIONS,
        "tool_choices": editor.tool_choices([], _tools(request.reach)),
    }
    return render(request, f"{PAGE}#rule_row", context)


# --- Approval analytics -----------------------------------------------------------------


@role_required(ADMIN)
@require_GET
def approval_analytics(request: HtmxHttpRequest) -> HttpResponse:
    """What reviewers decided lately, the rules that would spare them (with backtests, one
    click to apply) and reviewers whose decisions look like rubber stamping."""
    context = analytics.report(reach=request.reach)
    context["fast_seconds"] = analytics.FAST_SECONDS
    context["suggestion_rows"] = [
        (s, [(c, preview(c.call.arguments)) for c in s.backtest.changes[:10]])
        for s in context["suggestions"]
    ]
    return render(request, "permissions/analytics.html", context)


@role_required(ADMIN)
@require_POST
def apply_suggestion(request: HtmxHttpRequest) -> HttpResponse:
    """Add a suggested rule to its owner's profile (a new version, audited); refused with
    the reason when the rule is bad or the profile changed since the page was drawn."""
    actor = request.user
    subject = _subject(request, request.POST.get("user", "").strip() or 0)
    if refusal := _refusal_to_change(request, subject):
        return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    rule, action = request.POST.get("rule", ""), request.POST.get("action", "")
    try:
        version = int(request.POST.get("version", ""))
        profile = analytics.apply_suggestion(
            user=subject,
            action=action,
            rule=rule,
            actor=actor,
            expected_version=version,
            tools=_checked_against(request.reach),
        )
    except profiles.InvalidProfile as invalid:
        messages.error(request, " ".join(invalid.problems))
    except (profiles.StaleProfile, ValueError) as stale:
        messages.error(request, str(stale) or "Reload the page and try again.")
    else:
        messages.success(
            request,
            f"Added {action} rule '{rule}' to {subject.get_username()}'s profile "
            f"(now v{profile.version}).",
        )
    return redirect("permissions:analytics")


# --- Grants -----------------------------------------------------------------------------


@role_required(ADMIN)
@require_POST
@vary_on_headers("HX-Request")  # an htmx request gets a fragment
def revoke(request: HtmxHttpRequest, grant_id: int) -> HttpResponse:
    actor = request.user
    if not _team_grants(request.reach).filter(pk=grant_id).exists():
        return HttpResponse("No such grant.", status=404, content_type="text/plain")
    try:
        grants.revoke_grant(grant_id=grant_id, actor=actor)
    except ServiceError as problem:
        return HttpResponse(str(problem), status=404, content_type="text/plain")
    grant = _grants(SessionGrant.objects.filter(pk=grant_id))[0]
    if request.htmx:
        return render(request, "permissions/index.html#grant_row", {"grant": grant})
    messages.success(request, f"Revoked '{grant.rule}'.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("permissions:index")
    return redirect(target)


@role_required(ADMIN)
@require_GET
def session_grants(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Every grant of one session, active and revoked."""
    sessions = request.reach.filter(AgentSession.objects.all(), "team_id")
    session = get_object_or_404(sessions.select_related("agent__owner"), pk=session_id)
    grants = _grants(SessionGrant.objects.filter(session=session))
    return render(
        request,
        "permissions/session.html",
        {"session": session, "grants": grants, "next": request.path},
    )


# --- Managed layers: the organization's and the teams' policy, proposals, log-only ------


@role_required(ADMIN)
@require_GET
def policy_layers(request: HtmxHttpRequest) -> HttpResponse:
    """The organization's layer and each reached team's (rules as code: set_rules
    --org/--team), their history, and the organization's changes waiting for a second
    admin. Another team's layer is not shown: it says what that team's agents run and
    allow, as its people's rules do (_refusal_to_change)."""
    rows = PolicyLayer.objects.select_related("team").prefetch_related("versions")
    if not request.reach.everything:
        rows = rows.filter(Q(team__isnull=True) | Q(team_id__in=sorted(request.reach.team_ids)))
    layers = sorted(rows, key=lambda r: (r.kind != "org", r.team.name if r.team else ""))
    return render(
        request,
        "permissions/policy.html",
        {
            "layers": [
                (row, json.dumps(managed.layer_document(row.team), indent=2), row.versions.all())
                for row in layers
            ],
            "proposals": managed.pending_proposals(),
            "two_person": settings.HARNESS_POLICY_TWO_PERSON,
            "is_org_admin": org_holds(request.user, ADMIN),
        },
    )


@role_required(ADMIN)
@require_POST
def accept_proposal(request: HtmxHttpRequest, proposal_id: int) -> HttpResponse:
    """A second org admin accepts a proposed change to the organization's policy."""
    try:
        layer = managed.accept_proposal(proposal_id=proposal_id, user=request.user)
    except ServiceError as refused:
        messages.error(request, str(refused))
    else:
        messages.success(
            request,
            f"Accepted proposal {proposal_id}: the organization's policy is now v{layer.version}.",
        )
    return redirect("permissions:policy")


@role_required(ADMIN)
@require_POST
def activate_rule(request: HtmxHttpRequest) -> HttpResponse:
    """Make a log-only rule active (a new, audited version of its layer; for the
    organization's under HARNESS_POLICY_TWO_PERSON, a proposal). A person's rules only as
    their rules are changed anywhere (`_subject`, `_refusal_to_change`): someone this admin
    does not reach is not found, whether or not they exist; the layers check their own."""
    layer = request.POST.get("layer", "")
    action, rule = request.POST.get("action", ""), request.POST.get("rule", "")
    kind, _, name = layer.partition(":")
    if kind == "user":
        subject = get_object_or_404(_people(request.reach), username=name)
        if refusal := _refusal_to_change(request, subject):
            return HttpResponseForbidden(refusal, content_type="text/plain; charset=utf-8")
    try:
        outcome = managed.activate_rule(layer=layer, action=action, rule=rule, actor=request.user)
    except profiles.InvalidProfile as invalid:
        messages.error(request, " ".join(invalid.problems))
    except ServiceError as refused:
        messages.error(request, str(refused) or "Reload the page and try again.")
    else:
        if outcome.proposal is not None:
            messages.success(
                request,
                f"Proposed making {action} rule '{rule}' active (proposal "
                f"{outcome.proposal.pk}); another org admin must accept it.",
            )
        else:
            messages.success(request, f"The {action} rule '{rule}' of {layer} is now active.")
    return redirect("permissions:analytics")
