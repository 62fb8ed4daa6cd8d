"""The lifecycle's signals: only for what may be lost without harm (pushes to open pages,
notifications of outcomes), always sent after commit. A write the lifecycle needs from
another app is a named hook checked at start-up (HARNESS_ASK_RECORDER), never a signal."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after commit whenever a call changes state: kwargs call_id, session_id, status,
# previous (the status it left).
call_changed = Signal()
