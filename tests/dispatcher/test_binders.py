"""floor.compiled.binder gives every hot-path write the parameter the ORM's
`get_db_prep_save` gives, for every column of the rows those writes bind (the call, its
audit events, the chain's head) and values of every type such a column may be handed:
the statements' effects, and the types their prepared plans were made for, are the same."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
import warnings
from typing import Any

import pytest
from django.db import connection
from django.utils.functional import lazy
from django.utils.translation import gettext_lazy

from audit.models import AuditChain, AuditEvent
from dispatcher.models import Status, ToolCall
from floor.compiled import binder


class Level(enum.IntEnum):
    HIGH = 3


class Word(str):
    pass


VALUES: list[Any] = [
    None,
    "",
    "text",
    Word("subclass"),
    Status.QUEUED,
    gettext_lazy("lazy text"),
    lazy(lambda: 7, int)(),
    0,
    7,
    -3,
    2**40,
    Level.HIGH,
    True,
    False,
    1.5,
    dt.datetime(2026, 12, 6, 6, 0, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 6, 6, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.datetime(2026, 12, 6, 6, 0),  # naive: the ORM warns and makes it aware
    dt.date(2026, 12, 6),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "12345678123456781234567812345678",
    {"a": [1, "b"]},
    ["x"],
]


def outcome(function: Any, value: Any) -> tuple[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = function(value, connection)
        except Exception as exc:  # noqa: BLE001 - the same error either way
            return ("raises", (type(exc), str(exc)))
    warned = [str(w.message) for w in caught]
    if hasattr(result, "obj") and hasattr(result, "dumps"):  # (a psycopg Json wrapper)
        return (type(result).__name__, (result.obj, warned))
    return (type(result).__name__, (result, warned))


@pytest.mark.parametrize("model", [ToolCall, AuditEvent, AuditChain])
def test_each_binder_gives_what_the_orm_gives(model: Any) -> None:
    for field in model._meta.concrete_fields:
        bind = binder(field)
        for value in VALUES:
            assert outcome(bind, value) == outcome(field.get_db_prep_save, value), (
                field,
                value,
            )


def test_the_hot_paths_values_are_bound_without_the_orms_chain() -> None:
    """The point of it: plain values of the common columns take the short way (a binder
    that is not the field's own method)."""
    fields = {f.name: f for f in ToolCall._meta.concrete_fields}
    for name in ("id", "session", "name", "batch_index", "is_error", "created_at"):
        assert binder(fields[name]) != fields[name].get_db_prep_save, name
    assert binder(fields["arguments"]) == fields["arguments"].get_db_prep_save
