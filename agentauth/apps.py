from django.apps import AppConfig


class AgentAuthConfig(AppConfig):
    name = "agentauth"
    verbose_name = "Agent sign-in (OAuth)"

    def ready(self) -> None:
        from agentauth import signals

        signals.connect()
