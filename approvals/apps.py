from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from . import checks, receivers  # noqa: F401  (system checks; the dispatcher's signals)
