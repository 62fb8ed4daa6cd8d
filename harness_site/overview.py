"""The overview's figures: what the agents did lately, aggregated in the database.

Every figure is one GROUP BY over an indexed range (calls by `created_at`, decisions by
`decided_at`), so the page costs a handful of queries whatever the history's length:
hours are cut by the database itself (PostgreSQL's date_trunc, SQLite's strftime, never
a Python function per row), outcomes are a CASE, percentiles a window function. Reads
only; nothing here writes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    FloatField,
    Func,
    Min,
    Q,
    Value,
    When,
)
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit import checkpoints, kinds
from audit.models import AuditEvent
from dispatcher.models import AgentSession, Status, ToolCall
from teams.scope import EVERYTHING, Scope

# The path from a call to its session's team (teams.scope filters by it).
CALL_TEAM = "session__team_id"

# The outcome series, in stacking order, with how each reads.
OUTCOMES = {
    "mode": "allowed by mode",
    "rule": "allowed by rule",
    "grant": "allowed by grant",
    "approved": "approved",
    "denied": "denied",
    "edited": "edited",
    "rejected": "rejected",
    "error": "errors",
    "other": "waiting or cancelled",
}
ERRORED = [Status.TIMED_OUT, Status.OUTCOME_UNKNOWN, Status.UNREPORTED]
RAN = [Status.COMPLETED, Status.REPORTED]
STOPPED = [Status.DENIED, Status.EXPIRED]
BUSIEST = 5
DECISION_DAYS = 14


def outcome_case() -> Case:
    """A call's outcome series as SQL: what ended it first, else who let it through."""
    return Case(
        When(status=Status.REJECTED, then=Value("rejected")),
        When(status=Status.EDITED, then=Value("edited")),
        When(Q(status__in=ERRORED) | Q(status__in=RAN, is_error=True), then=Value("error")),
        When(status__in=STOPPED, then=Value("denied")),
        When(decided_by__startswith="user:", decision="allow", then=Value("approved")),
        When(decided_by__startswith="grant:", then=Value("grant")),
        When(decided_by__startswith="rule:", then=Value("rule")),
        When(decided_by__startswith="mode:", then=Value("mode")),
        default=Value("other"),
        output_field=CharField(),
    )


class Trunc(Func):
    """The start of the hour or day of a timestamp, cut by the database itself (the
    connection's time zone is UTC): PostgreSQL's date_trunc (a datetime), SQLite's
    strftime (text, "2026-12-01 14:00:00"); `bucket_key` makes either a bucket key."""

    output_field = CharField()
    # Doubled twice: once for the template, once for the SQL (a literal % beside params).
    FORMATS = {"hour": "%%%%Y-%%%%m-%%%%d %%%%H:00:00", "day": "%%%%Y-%%%%m-%%%%d 00:00:00"}

    def __init__(self, expression: str, unit: str) -> None:
        self.unit, self.sqlite = unit, self.FORMATS[unit]
        super().__init__(F(expression))

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = f"date_trunc('{self.unit}', %(expressions)s)"
        return self.as_sql(compiler, connection, template=template, **extra_context)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = f"strftime('{self.sqlite}', %(expressions)s)"
        return self.as_sql(compiler, connection, template=template, **extra_context)


def bucket_key(value: str | datetime, unit: str) -> str:
    """A Trunc value as the bucket key: "YYYY-MM-DD HH:00:00" (UTC)."""
    return value if isinstance(value, str) else _bucket(value, unit)


def _bucket(when: datetime, unit: str) -> str:
    when = when.astimezone(UTC)
    if unit == "hour":
        return when.strftime("%Y-%m-%d %H:00:00")
    return when.strftime("%Y-%m-%d 00:00:00")


@dataclass
class Series:
    """Counts per bucket (oldest first) and per outcome: the chart and its table."""

    buckets: list[str]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # bucket -> outcome -> n

    def total(self, bucket: str) -> int:
        return sum(self.counts.get(bucket, {}).values())

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for per in self.counts.values():
            for outcome, n in per.items():
                out[outcome] = out.get(outcome, 0) + n
        return out

    def rows(self) -> list[tuple[str, list[int], int]]:
        """(bucket, counts in OUTCOMES order, total) for each bucket, for the table."""
        return [
            (b, [self.counts.get(b, {}).get(o, 0) for o in OUTCOMES], self.total(b))
            for b in self.buckets
        ]


def calls_by_hour(now: datetime, hours: int, reach: Scope = EVERYTHING) -> Series:
    """Calls received in the last `hours` hours, per hour and outcome: one GROUP BY."""
    since = (now - timedelta(hours=hours - 1)).replace(minute=0, second=0, microsecond=0)
    buckets = [_bucket(since + timedelta(hours=i), "hour") for i in range(hours)]
    rows = (
        reach.filter(ToolCall.objects.all(), CALL_TEAM)
        .filter(created_at__gte=since, created_at__lte=now)
        .annotate(bucket=Trunc("created_at", "hour"), outcome=outcome_case())
        .values_list("bucket", "outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    series = Series(buckets=buckets)
    for bucket, outcome, n in rows:
        series.counts.setdefault(bucket_key(bucket, "hour"), {})[outcome] = n
    return series


def day_of(series: Series) -> Series:
    """The last 24 hours of an hourly series (no second query)."""
    day = series.buckets[-24:]
    return Series(buckets=day, counts={b: series.counts[b] for b in day if b in series.counts})


@dataclass
class DecisionTimes:
    day: str
    decisions: int
    p50: float
    p90: float


def decision_times(
    now: datetime, days: int = DECISION_DAYS, reach: Scope = EVERYTHING
) -> list[DecisionTimes]:
    """Seconds from ask to a reviewer's decision, p50 and p90 per day (of the decision).

    One query: a window function ranks each day's waits (CUME_DIST), the outer GROUP BY
    takes the first wait at or past 0.5 and 0.9. Expiries are not decisions.
    """
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    inner = (
        reach.filter(ApprovalRequest.objects.all(), "call__" + CALL_TEAM)
        .filter(
            decided_at__gte=since,
            decided_at__lte=now,
            decision__in=["approved", "denied"],
            decided_by__isnull=False,
        )
        .annotate(day=Trunc("decided_at", "day"), wait=SecondsBetween("created_at", "decided_at"))
        .values("day", "wait")
        .order_by()
    )
    sql, params = inner.query.sql_with_params()
    # The inner query is Django's own SQL with its parameters kept apart: nothing typed
    # by anyone is formatted into this text.
    query = f"""
        SELECT day, COUNT(*),
               MIN(CASE WHEN cd >= 0.5 THEN wait END),
               MIN(CASE WHEN cd >= 0.9 THEN wait END)
        FROM (SELECT day, wait, CUME_DIST() OVER (PARTITION BY day ORDER BY wait) AS cd
              FROM ({sql}) AS waits) AS ranked
        GROUP BY day ORDER BY day
    """  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        found = {bucket_key(d, "day"): (n, p50, p90) for d, n, p50, p90 in cursor.fetchall()}
    out = []
    for i in range(days):
        day = _bucket(since + timedelta(days=i), "day")
        n, p50, p90 = found.get(day, (0, 0.0, 0.0))
        out.append(DecisionTimes(day[:10], int(n), float(p50 or 0), float(p90 or 0)))
    return out


class SecondsBetween(Func):
    """`end - start` in seconds (a float), as the database computes it."""

    output_field = FloatField()

    def __init__(self, start: str, end: str) -> None:
        super().__init__(F(end), F(start))

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = "EXTRACT(EPOCH FROM (%(expressions)s))::float8"
        return self.as_sql(compiler, connection, template=template, arg_joiner=" - ")

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        template = "(julianday(%(expressions)s)) * 86400.0"  # julianday(end) - julianday(start)
        return self.as_sql(compiler, connection, template=template, arg_joiner=") - julianday(")


def busiest(
    now: datetime, days: int = 7, reach: Scope = EVERYTHING
) -> dict[str, list[tuple[str, int]]]:
    """The agents and the tools with the most calls in the last `days` days."""
    recent = (
        reach.filter(ToolCall.objects.all(), CALL_TEAM)
        .filter(created_at__gte=now - timedelta(days=days), created_at__lte=now)
        .order_by()
    )
    tools = recent.values_list("name").annotate(n=Count("id")).order_by("-n", "name")[:BUSIEST]
    agents = (
        recent.values_list("session__agent__name")
        .annotate(n=Count("id"))
        .order_by("-n", "session__agent__name")[:BUSIEST]
    )
    return {"agents": list(agents), "tools": list(tools)}


def pending(now: datetime, reach: Scope = EVERYTHING) -> dict[str, Any]:
    """Asks waiting now and how long the oldest has waited: one read of the status index."""
    found = reach.filter(ToolCall.objects.awaiting_approval(), CALL_TEAM).aggregate(
        n=Count("id"), oldest=Min("created_at")
    )
    oldest = found["oldest"]
    return {"count": found["n"], "oldest": oldest, "waited": (now - oldest) if oldest else None}


def client_reports(now: datetime, days: int = 7, reach: Scope = EVERYTHING) -> dict[str, int]:
    """Reports of clients that run their own tools, last `days` days, that do not match:
    of other input than the call was allowed, and matching no call. One read of the two
    kinds' rows (the audit log's kind index: only client sessions write them), counted."""
    reports = reach.filter_via(
        AuditEvent.objects.filter(
            kind__in=[kinds.CALL_REPORTED, kinds.CLIENT_REPORT_ORPHANED],
            created_at__gte=now - timedelta(days=days),
        ),
        "session_id",
        AgentSession.objects.all(),
        "team_id",
    )
    counts = reports.aggregate(
        mismatched=Count("id", filter=Q(kind=kinds.CALL_REPORTED, payload__input_matches=False)),
        orphaned=Count("id", filter=Q(kind=kinds.CLIENT_REPORT_ORPHANED)),
    )
    return {"mismatched": counts["mismatched"], "orphaned": counts["orphaned"], "days": days}


def sandbox_status() -> dict[str, Any]:
    """What the sandbox setting asks for and whether this host has it."""
    kind = str(getattr(settings, "HARNESS_SANDBOX", "") or "none")
    found = shutil.which(kind) if kind not in ("none", "off", "") else None
    return {
        "kind": kind,
        "enabled": kind not in ("none", "off", ""),
        "found": found,
        "network": bool(getattr(settings, "HARNESS_SANDBOX_NETWORK", False)),
    }


def checkpoint_status() -> dict[str, Any]:
    """Signed audit checkpoints as configured, and the last run to the configured file
    (audit.checkpoints): where they go, how often beat writes them, when the last run
    finished and whether it succeeded, and the newest checkpoint in the file."""
    url = str(settings.HARNESS_CHECKPOINT_URL or "")
    parts = urlsplit(url) if url else None
    interval = float(settings.HARNESS_CHECKPOINT_INTERVAL)
    last = checkpoints.last_run()
    # Beat runs it every `interval`: three intervals without a run means no beat is running.
    late = (
        last is not None
        and interval > 0
        and timezone.now() - last.finished_at > timedelta(seconds=3 * interval)
    )
    return {
        "path": str(settings.HARNESS_CHECKPOINT_PATH),
        "url": f"{parts.scheme}://{parts.hostname}" if parts and parts.hostname else "",
        "every": (f"{interval / 60:g} min" if interval >= 60 else f"{interval:g} s")
        if interval > 0
        else "",
        "last": last,
        "late": late,
    }


def overview(now: datetime | None = None, reach: Scope = EVERYTHING) -> dict[str, Any]:
    """The figures of the agents `reach` covers (teams.scope): a team member's overview
    counts their teams' calls and asks only."""
    now = now or timezone.now()
    week = calls_by_hour(now, 24 * 7, reach)
    return {
        "now": now,
        "pending": pending(now, reach),
        "week": week,
        "day": day_of(week),
        "decisions": decision_times(now, reach=reach),
        "busiest": busiest(now, reach=reach),
        "sandbox": sandbox_status(),
        "client_reports": client_reports(now, reach=reach),
        "checkpoints": checkpoint_status(),
    }
