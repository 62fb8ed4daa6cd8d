from django.db import migrations, models


def sign_existing_heads(apps, schema_editor):
    """Heads written before signing existed are signed as they are now: verify the log
    (manage.py verify_audit) before this migration if it may have been tampered with."""
    AuditChain = apps.get_model("audit", "AuditChain")
    heads = AuditChain.objects.filter(head_signature="")
    if not heads.exists():
        return  # a new database: the key is not needed (nor created) yet
    from audit.signing import sign_head

    for head in heads.iterator(chunk_size=2000):
        head.head_signature = sign_head(head.chain, head.last_seq, head.last_hash)
        head.save(update_fields=["head_signature"])


class Migration(migrations.Migration):
    dependencies = [("audit", "0003_chain_heads")]

    operations = [
        migrations.AddField(
            model_name="auditchain",
            name="head_signature",
            field=models.CharField(blank=True, default="", max_length=120),
        ),
        migrations.RunPython(sign_existing_heads, migrations.RunPython.noop),
    ]
