from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentauth", "0003_device_resource"),
    ]

    operations = [
        migrations.AddField(
            model_name="deviceresource",
            name="network",
            field=models.CharField(blank=True, db_index=True, default="", max_length=64),
        ),
    ]
