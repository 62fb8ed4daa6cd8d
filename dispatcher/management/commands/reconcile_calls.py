from typing import Any

from django.core.management.base import BaseCommand

from dispatcher.execution import reconcile


class Command(BaseCommand):
    help = "End calls whose worker lease expired (outcome_unknown) and re-send lost messages."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(str(reconcile()))
