"""Database triggers that refuse UPDATE and DELETE of audit events (and TRUNCATE on PostgreSQL).

The model layer refuses these too; the triggers also stop raw SQL, other clients and
bulk paths that bypass the ORM. They refuse always: there is no session setting that lets
a connection through. Whoever must remove events (a retention job, a restore) does it as
the table owner with `ALTER TABLE ... DISABLE TRIGGER`, which is a visible DDL action.

SQLite note: Django rebuilds a SQLite table for some AlterField operations, which drops
these triggers. A later migration that alters AuditEvent must re-run `install` on SQLite.
"""

from django.db import migrations

PG_INSTALL = """
CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditevent is append-only: % refused', TG_OP
        USING HINT = 'Audit events can only be inserted.';
END
$$;
CREATE TRIGGER audit_auditevent_refuse_update_delete
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_auditevent_refuse_truncate
    BEFORE TRUNCATE ON audit_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change();
"""

PG_UNINSTALL = """
DROP TRIGGER IF EXISTS audit_auditevent_refuse_update_delete ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_auditevent_refuse_truncate ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_refuse_change();
"""

SQLITE_INSTALL = [
    """CREATE TRIGGER audit_auditevent_refuse_update BEFORE UPDATE ON audit_auditevent
    BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only: UPDATE refused'); END""",
    """CREATE TRIGGER audit_auditevent_refuse_delete BEFORE DELETE ON audit_auditevent
    BEGIN SELECT RAISE(ABORT, 'audit_auditevent is append-only: DELETE refused'); END""",
]

SQLITE_UNINSTALL = [
    "DROP TRIGGER IF EXISTS audit_auditevent_refuse_update",
    "DROP TRIGGER IF EXISTS audit_auditevent_refuse_delete",
]


def install(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)
    else:
        raise NotImplementedError(f"No append-only triggers for the {vendor} database.")


def uninstall(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_UNINSTALL, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_UNINSTALL:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
