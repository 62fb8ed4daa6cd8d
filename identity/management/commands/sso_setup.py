"""manage.py sso_setup [--provider ID] [--metadata-only]"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from identity.sso_setup import registration


class Command(BaseCommand):
    help = (
        "Print what to register at each identity provider: the OIDC redirect URI, or the "
        "SAML entity ID, ACS URL and service provider metadata (under HARNESS_PUBLIC_URL)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--provider", help="Only this provider (its id).")
        parser.add_argument(
            "--metadata-only",
            action="store_true",
            help="Print only the SAML metadata XML of --provider (to save as a file).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        providers = [p for p in settings.HARNESS_SSO if options["provider"] in (None, p.id)]
        if not providers:
            raise CommandError(
                f"No identity provider {options['provider']!r} is configured."
                if options["provider"]
                else "No identity provider is configured: set HARNESS_OIDC_ISSUER or "
                "HARNESS_SSO_PROVIDERS (docs/identity.md)."
            )
        if options["metadata_only"]:
            if len(providers) != 1 or providers[0].kind != "saml":
                raise CommandError("--metadata-only needs --provider naming one SAML provider.")
            self.stdout.write(registration(providers[0]).metadata)
            return
        self.stdout.write(f"Harness at {settings.HARNESS_PUBLIC_URL} (HARNESS_PUBLIC_URL)\n")
        for provider in providers:
            reg = registration(provider)
            self.stdout.write(f"\n{provider.name} ({provider.kind.upper()}, id {provider.id})")
            for what, value in reg.lines:
                self.stdout.write(f"  {what}: {value}")
            if reg.metadata:
                self.stdout.write("  Service provider metadata:\n" + reg.metadata)
