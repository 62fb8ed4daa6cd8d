from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from allauth.account import signals as allauth_signals
        from allauth.socialaccount import signals as social_signals
        from django.contrib.auth.signals import user_logged_in

        from identity import checks  # noqa: F401  (registers the system checks)
        from identity.signals import on_signed_in, on_sso_linked, on_sso_signed_in

        from . import mfa  # noqa: F401  (the HARNESS_MFA_REQUIRED start-up check)

        user_logged_in.connect(on_signed_in, dispatch_uid="identity.signed_in")
        allauth_signals.user_logged_in.connect(on_sso_signed_in, dispatch_uid="identity.sso")
        social_signals.social_account_added.connect(on_sso_linked, dispatch_uid="identity.link")
