from django.apps import AppConfig


class PolicyConfig(AppConfig):
    """Modes, rules, shell reading, guards, profiles and grants, and the /permissions/ pages."""

    name = "dispatcher.policy"
    label = "policy"
    verbose_name = "Policy"
    default_auto_field = "django.db.models.BigAutoField"
