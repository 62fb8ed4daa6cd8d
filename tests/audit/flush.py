"""Keep the audit log out of the test runner's flush.

Transactional tests (`transaction=True`) end with Django's `flush`, which empties every
table with TRUNCATE (PostgreSQL) or DELETE (SQLite). The audit table's triggers refuse
both, always, in production and in tests alike; so the flush leaves the audit table alone
instead. Leftover events do no harm: every test writes its own chains (fresh session
ids) and asserts only on them, and the global chain simply continues.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.introspection import BaseDatabaseIntrospection

# The log, and the chain heads derived from it (a head emptied under a surviving chain
# would restart that chain at seq 1).
APPEND_ONLY_TABLES = frozenset({"audit_auditevent", "audit_auditchain"})

_original = BaseDatabaseIntrospection.django_table_names


def _without_append_only(self: BaseDatabaseIntrospection, *args: Any, **kwargs: Any) -> list[str]:
    return [t for t in _original(self, *args, **kwargs) if t not in APPEND_ONLY_TABLES]


def keep_audit_log_on_flush() -> None:
    """Idempotent; test processes only. `django_table_names` is used only by flush."""
    BaseDatabaseIntrospection.django_table_names = _without_append_only  # type: ignore[method-assign]
