from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentauth", "0004_device_resource_network"),
    ]

    operations = [
        migrations.AddField(
            model_name="deviceresource",
            name="aggregate",
            field=models.CharField(blank=True, db_index=True, default="", max_length=64),
        ),
    ]
