"""A large generated history of calls, written by the database itself (one INSERT ... SELECT
over a generated series), so a million rows take seconds, not minutes.

Call i (1-based) is spread over the last week (i seconds before `now`, modulo a week, or
another span), in
one of `sessions` (i mod len(sessions)), to tool TOOLS[i mod 4], with outcome OUTCOME_OF
[i mod 10]. Approvals are added for the approved ones, each decided (i mod 60) + 1
seconds after it was asked.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db import connection

from approvals.models import ApprovalRequest
from dispatcher.models import ToolCall

TOOLS = ["read_file", "write_file", "run_command", "list_directory"]
WEEK = 7 * 24 * 3600
# i mod 10 -> (status, decision, decided_by, is_error), and the overview series it counts in.
OUTCOME_OF = [
    ("completed", "allow", "mode:standard", False, "mode"),
    ("completed", "allow", "mode:standard", False, "mode"),
    ("completed", "allow", "mode:standard", False, "mode"),
    ("completed", "allow", "mode:standard", False, "mode"),
    ("completed", "allow", "rule:allow:read_file", False, "rule"),
    ("completed", "allow", "grant:run_command(npm test)", False, "grant"),
    ("completed", "allow", "user:rev", False, "approved"),
    ("denied", "deny", "rule:deny:run_command(rm *)", True, "denied"),
    ("rejected", "reject", "resolve", True, "rejected"),
    ("completed", "allow", "mode:standard", True, "error"),
]


def _case() -> str:
    arms = " ".join(f"WHEN {i} THEN %s" for i in range(10))
    return f"CASE n.i %% 10 {arms} END"


def generate_calls(
    count: int,
    sessions: list[str],
    now: datetime,
    *,
    span: int = WEEK,
    step: int = 1,
    first: int = 1,
) -> None:
    """Insert `count` calls as described above, in one statement: calls `first` to
    `first + count - 1`, call i received (i * step) mod span seconds before `now`."""
    table = ToolCall._meta.db_table
    session_arms = " ".join(f"WHEN {k} THEN %s" for k in range(len(sessions)))
    tool_arms = " ".join(f"WHEN {k} THEN '{t}'" for k, t in enumerate(TOOLS))
    params: list[object] = []
    outcome_sql = []
    for column in range(4):
        outcome_sql.append(_case())
        params += [row[column] for row in OUTCOME_OF]
    pg = connection.vendor == "postgresql"
    ids = (
        ["md5('c' || n.i)::uuid", "md5('b' || n.i)::uuid"]
        if pg
        else ["lower(hex(randomblob(16)))"] * 2
    )
    created = (
        f"%s::timestamptz - ((n.i * {step}) %% {span}) * interval '1 second'"
        if pg
        else f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '-' || ((n.i * {step}) %% {span}) || ' seconds')"
    )
    when = now.isoformat() if pg else now.strftime("%Y-%m-%d %H:%M:%S.%f")
    series = (
        "generate_series(%s, %s) AS n(i)"
        if pg
        else "(WITH RECURSIVE s(i) AS (SELECT %s UNION ALL SELECT i + 1 FROM s WHERE i < %s)"
        " SELECT i FROM s) AS n"
    )
    json_empty = "'{}'::jsonb" if pg else "'{}'"
    sql = f"""
        INSERT INTO {table} (id, session_id, tool_use_id, name, raw_arguments, arguments, digest,
            dialect, batch_id, batch_index, batch_size, executor, status, decision, decided_by, reason,
            provenance, content, is_error, repeat_count, created_at, attempts, timings)
        SELECT {ids[0]}, CAST(CASE n.i %% {len(sessions)} {session_arms} END AS {"uuid" if pg else "char(32)"}), 't' || n.i,
            CASE n.i %% 4 {tool_arms} END, '{{}}', {json_empty}, '', 'native', {ids[1]}, 0, 1,
            'harness', {outcome_sql[0]}, {outcome_sql[1]}, {outcome_sql[2]}, '',
            {json_empty}, '', {outcome_sql[3]}, 1, {created}, 0, {json_empty}
        FROM {series}
    """  # noqa: S608  # a test's own generated SQL
    keys = sessions if pg else [uuid.UUID(s).hex for s in sessions]
    args = [*keys, *params, when, first, first + count - 1]
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        cursor.execute(f"ANALYZE {table}")  # as autovacuum would have, on a real database


def generate_decisions(reviewer_id: int) -> int:
    """An approval for each approved call, decided (i mod 60) + 1 seconds after it asked,
    where i is the call's tool_use_id number. Returns how many."""
    calls, table = ToolCall._meta.db_table, ApprovalRequest._meta.db_table
    pg = connection.vendor == "postgresql"
    number = "CAST(substr(c.tool_use_id, 2) AS integer)"
    decided = (
        f"c.created_at + (({number} %% 60) + 1) * interval '1 second'"
        if pg
        else f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', c.created_at, '+' || (({number} %% 60) + 1) || ' seconds')"
    )
    json_empty = "'{}'::jsonb" if pg else "'{}'"
    json_list = "'[]'::jsonb" if pg else "'[]'"
    sql = f"""
        INSERT INTO {table} (call_id, reason, asked_by, presentation, digest, created_at,
            expires_at, approvals_required, "group", decision, decided_by_id, decided_at,
            feedback, digest_seen, effect_digest, step_up, groups)
        SELECT c.id, 'asked', 'mode:standard', {json_empty}, '', c.created_at, c.created_at,
            1, '', 'approved', %s, {decided}, '', '', '', {json_list}, {json_list}
        FROM {calls} c WHERE c.decided_by = 'user:rev'
    """  # noqa: S608  # a test's own generated SQL
    with connection.cursor() as cursor:
        cursor.execute(sql, [reviewer_id])
        made = int(cursor.rowcount)
        cursor.execute(f"ANALYZE {table}")
        return made
