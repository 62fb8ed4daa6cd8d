"""Sessions left at a move made before 0019 whose agent is back in their team: 0019 marked
left only the sessions of a team their agent is not in at the upgrade, so a session its
agent left, then came back to, still took calls (under the grants given for it before
the move). The audit log holds every move (agent.transferred, its team before and
after): a session is started in its agent's team of then, so a move of the agent to
another team after the session started left it. (A move whose event is gone from the
log, pruned, is not seen: those sessions stay as 0019 left them.)"""

from typing import Any

from django.db import migrations
from django.utils import timezone


def mark_left_by_moves(apps: Any, schema_editor: Any) -> None:
    AuditEvent = apps.get_model("audit", "AuditEvent")
    AgentSession = apps.get_model("dispatcher", "AgentSession")
    last_move: dict[int, Any] = {}
    moves = AuditEvent.objects.filter(kind="agent.transferred", subject__startswith="agent:")
    for subject, payload, at in moves.values_list("subject", "payload", "created_at").iterator():
        before = (payload or {}).get("before") or {}
        after = (payload or {}).get("after") or {}
        if before.get("team") == after.get("team"):
            continue  # (its owner or sponsor changed: the agent stayed in the team)
        try:
            agent_id = int(subject.removeprefix("agent:"))
        except ValueError:
            continue
        if agent_id not in last_move or last_move[agent_id] < at:
            last_move[agent_id] = at
    now = timezone.now()
    for agent_id, at in last_move.items():
        AgentSession.objects.filter(
            agent_id=agent_id, left_at__isnull=True, created_at__lt=at
        ).update(left_at=now)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0001_initial"),
        ("dispatcher", "0019_session_left_at"),
    ]

    operations = [
        migrations.RunPython(mark_left_by_moves, migrations.RunPython.noop),
    ]
