from django.apps import AppConfig


class DispatcherConfig(AppConfig):
    name = "dispatcher"
    verbose_name = "Dispatcher"

    def ready(self) -> None:
        from dispatcher import (
            checks,  # noqa: F401  (registers the system checks)
            telemetry,
        )
        from harness_site import checks as promises  # noqa: F401  (settings that weaken one)

        telemetry.install()  # OpenTelemetry spans, when HARNESS_OTEL_ENDPOINT is set
