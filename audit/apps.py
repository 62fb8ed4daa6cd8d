from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from django.contrib.auth.models import User
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_save

        from audit import checks  # noqa: F401  (registers the system checks)
        from audit.roles import close_deactivated_sockets, close_signed_out_sockets

        user_logged_out.connect(close_signed_out_sockets, dispatch_uid="audit.close_sockets")
        post_save.connect(
            close_deactivated_sockets, sender=User, dispatch_uid="audit.close_deactivated"
        )
