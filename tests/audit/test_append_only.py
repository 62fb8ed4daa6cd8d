"""The log is append-only in three layers: model, database triggers, admin."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.db import DatabaseError, connection, transaction
from django.test import Client, RequestFactory

from audit.models import AppendOnlyError, AuditEvent
from audit.services import record_event
from tests.audit.tamper import sql
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def event() -> AuditEvent:
    with transaction.atomic():
        return record_event(kind="test.event", actor="test", payload={"n": 1})


def test_model_refuses_save_of_an_existing_event(event: AuditEvent) -> None:
    event.kind = "edited"
    with pytest.raises(AppendOnlyError):
        event.save()


def test_model_refuses_delete(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        event.delete()


def test_queryset_refuses_update_and_delete(event: AuditEvent) -> None:
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(kind="edited")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).delete()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditevent SET kind = 'edited' WHERE id = %s",
        "UPDATE audit_auditevent SET payload = '{}' WHERE id = %s",
        "DELETE FROM audit_auditevent WHERE id = %s",
    ],
    ids=["update-kind", "update-payload", "delete"],
)
def test_database_refuses_raw_update_and_delete(event: AuditEvent, statement: str) -> None:
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        sql(statement, [event.pk])
    stored = AuditEvent.objects.get(pk=event.pk)
    assert (stored.kind, stored.payload) == ("test.event", {"n": 1})


def test_database_refuses_truncate_on_postgresql(event: AuditEvent) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("TRUNCATE exists on PostgreSQL only (SQLite's DELETE is covered above)")
    with pytest.raises(DatabaseError, match="append-only: TRUNCATE"), transaction.atomic():
        sql("TRUNCATE audit_auditevent")
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_database_allows_insert(event: AuditEvent) -> None:
    with transaction.atomic():
        second = record_event(kind="test.event", actor="test", payload={"n": 2})
    assert second.seq == event.seq + 1
    assert second.prev_hash == event.hash


def test_admin_is_read_only(event: AuditEvent) -> None:
    admin = site._registry[AuditEvent]
    request = RequestFactory().get("/")
    request.user = make_user("boss")
    request.user.is_superuser = True
    assert not admin.has_add_permission(request)
    assert not admin.has_change_permission(request, event)
    assert not admin.has_delete_permission(request, event)


def test_admin_change_page_offers_no_save_or_delete(event: AuditEvent, client: Client) -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser("root", password="pw-root")
    client.login(username="root", password="pw-root")
    page = client.get(f"/admin/audit/auditevent/{event.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert client.post(f"/admin/audit/auditevent/{event.pk}/delete/").status_code == 403
    assert AuditEvent.objects.filter(pk=event.pk).exists()
