from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        from audit import checks  # noqa: F401  (registers the system checks)
        from audit.roles import close_signed_out_sockets

        user_logged_out.connect(close_signed_out_sockets, dispatch_uid="audit.close_sockets")
