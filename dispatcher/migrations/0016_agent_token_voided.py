from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dispatcher", "0015_agent_token_holders"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="token_voided_because",
            field=models.CharField(blank=True, default="", max_length=150),
        ),
        migrations.AddField(
            model_name="agent",
            name="token_voided_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agent",
            name="voided_token_hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
