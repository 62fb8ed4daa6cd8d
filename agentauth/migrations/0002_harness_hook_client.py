"""The public client `harness-hook login` signs in with (the device authorization grant)."""

from typing import Any

from django.db import migrations

CLIENT_ID = "harness-hook"


def create(apps: Any, schema_editor: Any) -> None:
    Application = apps.get_model("oauth2_provider", "Application")
    Application.objects.get_or_create(
        client_id=CLIENT_ID,
        defaults={
            "name": "harness-hook (coding agents' hooks)",
            "client_type": "public",
            "authorization_grant_type": "urn:ietf:params:oauth:grant-type:device_code",
            "redirect_uris": "",
            "client_secret": "",
            "hash_client_secret": False,
        },
    )


def remove(apps: Any, schema_editor: Any) -> None:
    apps.get_model("oauth2_provider", "Application").objects.filter(client_id=CLIENT_ID).delete()


class Migration(migrations.Migration):
    dependencies = [("agentauth", "0001_agents_behind_tokens"), ("oauth2_provider", "0022_refreshtoken_token_family_index")]

    operations = [migrations.RunPython(create, remove)]
