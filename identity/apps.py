from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from . import mfa  # noqa: F401  (the HARNESS_MFA_REQUIRED start-up check)
