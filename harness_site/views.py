"""The landing page: the overview of what agents did lately, for anyone holding a role."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from audit.roles import ROLES
from teams.scope import scope_of_any

from . import charts
from .overview import OUTCOMES, Series, overview

# Buckets are cut in UTC by the database ("YYYY-MM-DD HH:00:00"); the captions say so.


def _hour(bucket: str) -> str:
    return bucket[11:16]


def _day(bucket: str) -> str:
    return datetime.fromisoformat(bucket).strftime("%a %d")


def _hour_of_day(bucket: str) -> str:
    return f"{_day(bucket)} {_hour(bucket)}"


def _midnight(bucket: str) -> bool:
    return bucket.endswith(" 00:00:00")


def _per_day(week: Series) -> list[tuple[str, list[int], int]]:
    """The week's hourly counts summed per day, for the table beside the chart."""
    days: dict[str, list[int]] = {}
    for bucket, counts, _total in week.rows():
        row = days.setdefault(bucket[:10], [0] * len(OUTCOMES))
        for i, n in enumerate(counts):
            row[i] += n
    return [(day, row, sum(row)) for day, row in days.items()]


def _share(rows: list[tuple[str, int]]) -> list[dict[str, Any]]:
    top = max((n for _, n in rows), default=0)
    return [
        {"name": name, "n": n, "width": round(100 * n / top, 1) if top else 0} for name, n in rows
    ]


@never_cache  # (the figures of the person's teams: kept nowhere, as the role pages)
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Signed-in users with a role see the overview of the teams their roles reach (every
    team's for an organization role); others are sent to sign in."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    reach = scope_of_any(request.user, sorted(ROLES))
    if reach.empty:
        return render(request, "overview/index.html", {"no_role": True})
    figures = overview(reach=reach)
    week, day = figures["week"], figures["day"]
    values = week.counts.get
    decisions = figures["decisions"]
    days = [d.day + " 00:00:00" for d in decisions]
    context = {
        **figures,
        # The checkpoint's count of signed heads is every team's sessions: org roles only.
        "organization": reach.everything,
        "outcomes": OUTCOMES,
        "day_chart": charts.stacked(
            day.buckets,
            lambda b: values(b, {}),
            list(OUTCOMES),
            label=_hour,
            ticks=charts.bar_ticks(day.buckets, _hour, every=4),
        ),
        "week_chart": charts.stacked(
            week.buckets,
            lambda b: values(b, {}),
            list(OUTCOMES),
            label=_hour_of_day,
            ticks=charts.boundary_ticks(week.buckets, _midnight, _day),
        ),
        "day_total": sum(day.totals().values()),
        "day_legend": [(k, label, day.totals()[k]) for k, label in OUTCOMES.items()],
        "day_rows": day.rows(),
        "week_rows": _per_day(week),
        "decision_chart": charts.paired(
            days,
            [d.p50 for d in decisions],
            [d.p90 for d in decisions],
            label=_day,
            ticks=charts.bar_ticks(days, _day, every=2),
        ),
        "agents": _share(figures["busiest"]["agents"]),
        "tools": _share(figures["busiest"]["tools"]),
    }
    return render(request, "overview/index.html", context)
