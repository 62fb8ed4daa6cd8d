"""Raw-SQL tampering with the audit table, triggers switched off for the duration."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

TABLE = "audit_auditevent"


@contextmanager
def triggers_disabled() -> Iterator[None]:
    """Switch the append-only triggers off (PostgreSQL: DISABLE; SQLite: drop, recreate)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER USER")
            try:
                yield
            finally:
                cursor.execute(f"ALTER TABLE {TABLE} ENABLE TRIGGER USER")
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
                [TABLE],
            )
            saved = cursor.fetchall()
            assert saved, "the append-only triggers are missing"
            for name, _ in saved:
                cursor.execute(f'DROP TRIGGER "{name}"')
            try:
                yield
            finally:
                for _, sql in saved:
                    cursor.execute(sql)


def sql(statement: str, params: list[Any] | None = None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.rowcount
